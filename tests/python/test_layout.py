"""scripts/check-layout.py finds import circles at every depth (issue 42): between the modules
of a crate, and between sibling files of one folder, whichever way the import is spelled."""
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

CHECK = ROOT / "scripts" / "check-layout.py"


def check(root):
    return subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root)], capture_output=True, text=True
    )


def crate(tmp_path, files):
    """A one-crate tree under tmp_path/crates/demo with the given src files."""
    src = tmp_path / "crates" / "demo" / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return tmp_path


def test_the_tree_has_no_circle():
    r = check(ROOT)
    assert "import circle" not in r.stdout, r.stdout


def test_a_circle_between_sibling_files_fails(tmp_path):
    root = crate(tmp_path, {
        "lib.rs": "mod store;\n",
        "store/mod.rs": "mod bandit;\nmod results;\npub struct Pool;\n",
        # a use tree through super, and an inline crate:: path back
        "store/bandit.rs": "use super::{Pool, results::{ALPHA, Other}};\npub struct B;\n",
        "store/results.rs": "pub const ALPHA: f64 = 0.05;\n"
                            "pub fn f() -> Option<crate::store::bandit::B> { None }\n",
    })
    r = check(root)
    assert r.returncode == 1
    assert "crates/demo: import circle store::bandit -> store::results -> store::bandit" in r.stdout, r.stdout


def test_a_circle_between_top_modules_in_a_use_tree_fails(tmp_path):
    # `use crate::{a, b}` names both modules: the old checker read only `crate::x` directly
    root = crate(tmp_path, {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::{b::Y};\npub struct X;\n",
        "b.rs": "pub struct Y;\nfn g(_: crate::a::X) {}\n",
    })
    r = check(root)
    assert r.returncode == 1
    assert "import circle a -> b -> a" in r.stdout, r.stdout


def test_a_child_naming_its_parent_and_tests_naming_siblings_are_no_circle(tmp_path):
    root = crate(tmp_path, {
        "lib.rs": "mod store;\n",
        "store/mod.rs": "mod bandit;\nmod results;\npub struct Pool;\nuse bandit::B;\n",
        "store/bandit.rs": "use super::Pool;\nuse super::results::ALPHA;\npub struct B;\n",
        "store/results.rs": "pub const ALPHA: f64 = 0.05;\n"
                            "#[cfg(test)]\nmod tests {\n    use super::super::bandit::B;\n}\n",
    })
    r = check(root)
    assert r.returncode == 0, r.stdout
