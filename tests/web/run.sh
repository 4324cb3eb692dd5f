#!/usr/bin/env bash
# Runs the page's end-to-end tests: `strata serve`'s page in Debian's headless Chromium,
# driven by Playwright for Python without its browser download (the system `chromium`,
# which .ci/run installs). Creates .venv-web at the repository root (pip installs
# playwright and pytest), builds the CLI, and leaves the screenshots, the browser console
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
venv="$root/.venv-web"
if ! "$venv/bin/python" -c "import playwright, pytest" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "playwright>=1.45" "pytest>=8"
fi

cargo build --quiet -p strata-cli
target_dir="${CARGO_TARGET_DIR:-$root/target}"
logs="${STRATA_LOG_DIR:-$root/.cache/logs}/web"
rm -rf "$logs"
mkdir -p "$logs"

status=0
STRATA_BIN="$target_dir/debug/strata" STRATA_LOG_DIR="$logs" CHROMIUM="$chromium" \
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/tests/web" || status=$?
echo "tests/web: screenshots and logs in $logs" >&2
exit "$status"
