#!/usr/bin/env bash
# Runs the page's end-to-end tests: `strata serve`'s page in Debian's headless Chromium,
# driven by Playwright for Python without its browser download (the system `chromium`,
# which .ci/run installs). Creates .venv-web at the repository root, or STRATA_VENV_WEB (pip installs
# playwright and pytest), builds the CLI (unless STRATA_BIN names one), and leaves the screenshots, the browser console
# and the server log in $STRATA_LOG_DIR/web (default .cache/logs/web) for CI to keep.
# Exits non-zero on any failure, and when Chromium is missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
chromium="${CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$chromium" ]; then
    echo "tests/web: no chromium on PATH: install Debian's (apt-get install -y chromium) or set CHROMIUM" >&2
    exit 1
fi
venv="${STRATA_VENV_WEB:-$root/.venv-web}"
if ! "$venv/bin/python" -c "import playwright, pytest" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$root/scripts/requirements/web.txt"
fi

# scripts/test.sh passes the binary its `cargo test` built (STRATA_BIN); alone, build one.
if [ -z "${STRATA_BIN:-}" ]; then
    cargo build --quiet -p strata-cli
    STRATA_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/strata"
fi
logs="${STRATA_LOG_DIR:-$root/.cache/logs}/web"
rm -rf "$logs"
mkdir -p "$logs"

status=0
STRATA_BIN="$STRATA_BIN" STRATA_LOG_DIR="$logs" CHROMIUM="$chromium" \
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/tests/web" || status=$?
echo "tests/web: screenshots and logs in $logs" >&2
exit "$status"
