#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test of every crate (including the tests
# on real weights and tokenizers, fetched once into .cache/assets, about 600 MB), the
# server's end-to-end tests with the official openai Python client (in .venv-server), the
# page's in headless Chromium (in .venv-web; screenshots in .cache/logs/web), and the
# Python package's and vLLM plugin's tests (scripts/test_python.sh, in .cache/venv-*).
#
#   scripts/test.sh            # everything
#   scripts/test.sh --offline  # skip what needs the network: the fetch, the real-asset
#                              # tests, the openai-client, browser and Python tests
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Each stage's wall time, printed at the end (CI's time limit protects every landing).
source scripts/lib/stages.sh

if [[ "${1:-}" != "--offline" ]]; then
    stage "fetch assets" scripts/fetch_assets.sh
    stage "fetch tokenizers" scripts/fetch_tokenizers.sh
    export STRATA_REAL_ASSETS=1
fi

# Mesa warns about a missing runtime directory on machines without a login session.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

stage "cargo fmt" cargo fmt --all -- --check
# The invariants ARCHITECTURE.md states: crate layering, no module cycles, unsafe only in
# the kernels/mmap/FFI crates, source files under 800 lines.
stage "architecture check" python3 scripts/check_architecture.py
stage "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
stage "cargo test (build)" cargo test --workspace --no-run
stage "cargo test (run)" cargo test --workspace
# The suites below run the `strata` binary that build made (for the CLI's integration
# tests) instead of building the workspace again in another profile: a separate
# `cargo build -p strata-cli` resolves dependency features for one package and rebuilt
# most of the dependency tree (8 minutes of a 2-core CI run).
export STRATA_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/strata"
# The Python extension module the same build made (crates/python/tests/module.rs checks it).
export STRATA_PYTHON_MODULE="${CARGO_TARGET_DIR:-$PWD/target}/debug/deps/lib_strata.so"
if [[ "${1:-}" != "--offline" ]]; then
    # The server against the official openai client, hostile requests and concurrent load.
    stage "server suite" bash tests/server/run.sh
    # strata.LLM / strata.ops / python -m strata serve, and vLLM with Strata's experts.
    stage "python package and vLLM plugin" bash scripts/test_python.sh
    # The page at / in Debian's headless Chromium: chat, live view, restart, errors.
    stage "browser suite" bash tests/web/run.sh
fi
