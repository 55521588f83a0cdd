#!/usr/bin/env python3
"""Fails when building tests changes the features of a dependency of the normal build.

`cargo test` would then compile that dependency, everything above it and the binary a second
time (measured: tokio's `test-util` and rustix's `default`, which dev-dependencies added, made
the CI test build recompile 60 crates and the binary). Checked for the workspace and for each
selection that CI builds on its own (the Vulkan test set).
"""
import re
import subprocess
import sys

SELECTIONS = [["--workspace"], ["-p", "abserve", "--features", "vulkan"]]


def features(selection, edges):
    out = subprocess.run(
        ["cargo", "tree", *selection, "-e", edges, "-f", "{p} [{f}]", "--prefix", "none", "--no-dedupe"],
        check=True, capture_output=True, text=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"(\S+ v\S+)(?: \(.*?\))? \[(.*?)\]", line.strip())
        if m:
            found.setdefault(m.group(1), set()).update(f for f in m.group(2).split(",") if f)
    return found


status = 0
for selection in SELECTIONS:
    normal, test = features(selection, "normal,build"), features(selection, "normal,build,dev")
    for package in sorted(normal):
        if normal[package] != test.get(package, normal[package]):
            added = sorted(test[package] - normal[package])
            print(f"check-features ({' '.join(selection)}): the test build gives {package} "
                  f"the features {added} that the normal build lacks; give a dev-dependency "
                  f"fewer features or the normal dependency the same ones")
            status = 1
sys.exit(status)
