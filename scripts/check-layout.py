#!/usr/bin/env python3
"""The layout shows the design (issue 27), checked in CI by scripts/test.sh:

- no file over 600 lines in crates/*/src and crates/*/tests (tests included);
- no function over 80 lines outside tests (a `#[cfg(test)]` module, a `tests` folder or file);
- no import circle between sibling modules, at any depth: the modules of a crate, and the files
  and folders of one folder (`use crate::…`, `super::…`, `self::…` and inline paths, use trees
  expanded, comments and `#[cfg(test)]` modules left out; a module and its own submodules are
  one unit).

`--root DIR` checks another tree (the checker's own test plants a circle in one).

Prints each finding and exits 1 when there is one. With --warn-functions, long functions are
printed as warnings and do not fail the check (while the last of them are being split).
"""
import os
import re
import sys

MAX_FILE = 600
MAX_FN = 80
ROOT = os.path.join(os.path.dirname(__file__), "..")
if "--root" in sys.argv:
    ROOT = sys.argv[sys.argv.index("--root") + 1]
FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def rust_files(crate_dir):
    for sub in ("src", "tests"):
        for root, _, files in os.walk(os.path.join(crate_dir, sub)):
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(root, f)


def is_test_file(path):
    parts = os.path.normpath(path).split(os.sep)
    return "tests" in parts or parts[-1] == "tests.rs"


def long_functions(path, lines):
    test_from = len(lines)
    for i, l in enumerate(lines):
        if l.strip() == "#[cfg(test)]" and i + 1 < len(lines) and lines[i + 1].startswith("mod "):
            test_from = i
            break
    for i, l in enumerate(lines[:test_from]):
        m = FN.match(l)
        if not m or l.rstrip().endswith(";"):
            continue
        indent = m.group(1)
        for j in range(i + 1, test_from):
            if lines[j].startswith(indent + "}") and not lines[j].startswith(indent + "} "):
                n = j - i + 1
                if n > MAX_FN:
                    yield m.group(7), i + 1, n
                break


def strip_tests(lines):
    """The file's text without comments and without its `#[cfg(test)] mod …` (tests may import
    what the module itself does not)."""
    out = []
    for i, l in enumerate(lines):
        if l.strip() == "#[cfg(test)]" and i + 1 < len(lines) and lines[i + 1].startswith("mod "):
            break
        if not l.strip().startswith("//"):
            out.append(l)
    return "\n".join(out)


def modules(src):
    """Each module of the crate under `src`, as a tuple of names (() is the crate root), with
    its text. Test modules (a `tests` folder or file) are left out."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(root, f)
            parts = os.path.relpath(p, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if "tests" in parts:
                continue
            mods[tuple(parts)] = strip_tests(open(p).read().split("\n"))
    return mods


def use_paths(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (a use tree, spaces removed)."""
    depth, i = 0, None
    for k, ch in enumerate(tree):
        if ch == "{" and depth == 0:
            i = k
            break
    if i is None:
        return [tree.split(" as ")[0]]
    if "}" not in tree:
        return []
    prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [prefix + q for part in parts if part.strip() for q in use_paths(part.strip())]


USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.MULTILINE)
PATH = re.compile(r"\b(?:crate|super|self)(?:::(?:[A-Za-z_]\w*|\*))+")


def references(name, text):
    """The module paths (tuples) that the module `name` names: in `use` trees and inline."""
    refs = []
    paths = []
    for m in USE.finditer(text):
        paths += use_paths(re.sub(r"\s+", "", m.group(1)))
    paths += [m.group(0) for m in PATH.finditer(text)]
    for path in paths:
        segs = path.split("::")
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = name
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
            rest = segs
        else:
            continue
        refs.append(base + tuple(s for s in rest if s != "*"))
    return refs


def circles(src):
    """Import circles between sibling modules of one folder (files or folders of the same
    parent), at every depth: an edge A -> B when something in A (or below it) names something
    in B (or below it) and A and B are children of the same module. A module and its own
    submodules are one unit, so `super::` from a child to its parent is no edge."""
    mods = modules(src)
    graphs = {}  # parent module -> {child: {children it depends on}}
    for name, text in mods.items():
        for ref in references(name, text):
            # the longest module path the reference starts with
            target = max((m for m in mods if ref[: len(m)] == m), key=len, default=None)
            if target is None:
                continue
            k = 0
            while k < min(len(name), len(target)) and name[k] == target[k]:
                k += 1
            if k == len(name) or k == len(target):
                continue  # one contains the other
            parent = name[:k]
            g = graphs.setdefault(parent, {})
            g.setdefault(name[k], set()).add(target[k])
    found = []
    for parent in sorted(graphs):
        graph, state = graphs[parent], {}

        def visit(v, path):
            state[v] = 1
            for w in sorted(graph.get(v, ())):
                if state.get(w) == 1:
                    cyc = path[path.index(w):] + [w]
                    found.append(["::".join(parent + (x,)) for x in cyc])
                elif w not in state:
                    visit(w, path + [w])
            state[v] = 2

        for v in sorted(graph):
            if v not in state:
                visit(v, [v])
    return found


def main():
    bad, warn = [], []
    warn_functions = "--warn-functions" in sys.argv[1:]
    crates = os.path.join(ROOT, "crates")
    for c in sorted(os.listdir(crates)):
        d = os.path.join(crates, c)
        for p in rust_files(d):
            lines = open(p).read().split("\n")
            rel = os.path.relpath(p, ROOT)
            if len(lines) - 1 > MAX_FILE:
                bad.append(f"{rel}: {len(lines) - 1} lines (at most {MAX_FILE})")
            if not is_test_file(p):
                for name, line, n in long_functions(p, lines):
                    (warn if warn_functions else bad).append(
                        f"{rel}:{line}: fn {name} has {n} lines (at most {MAX_FN})"
                    )
        for cycle in circles(os.path.join(d, "src")):
            bad.append(f"crates/{c}: import circle {' -> '.join(cycle)}")
    for w in warn:
        print(f"check-layout: warning: {w}")
    for b in bad:
        print(f"check-layout: {b}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
