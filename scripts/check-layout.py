#!/usr/bin/env python3
"""The layout shows the design (issue 27), checked in CI by scripts/test.sh:

- no file over 600 lines in crates/*/src and crates/*/tests (tests included);
- no function over 80 lines outside tests (a `#[cfg(test)]` module, a `tests` folder or file);
- no import circle between the modules of a crate (`use crate::…` and `super::…`, comments
  left out; a module and its own submodules are one unit).

Prints each finding and exits 1 when there is one. With --warn-functions, long functions are
printed as warnings and do not fail the check (while the last of them are being split).
"""
import os
import re
import sys

MAX_FILE = 600
MAX_FN = 80
ROOT = os.path.join(os.path.dirname(__file__), "..")
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


def modules(src):
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
            text = "\n".join(
                l for l in open(p).read().split("\n") if not l.strip().startswith("//")
            )
            mods["::".join(parts)] = text
    return mods


def circles(src):
    mods = modules(src)
    graph = {}
    for name, text in mods.items():
        deps = set()
        for m in re.finditer(r"crate::([a-z_]+)", text):
            top = m.group(1)
            if top in mods and top != name.split("::")[0]:
                deps.add(top)
        graph[name.split("::")[0]] = graph.get(name.split("::")[0], set()) | deps
    found, state = [], {}

    def visit(v, path):
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                found.append(path[path.index(w):] + [w] if w in path else [v, w])
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
