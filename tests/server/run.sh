#!/usr/bin/env bash
# Runs the Python tests of `strata serve` against a server on a free loopback port:
# the official `openai` client, hostile requests, and concurrent streaming load.
# Creates .venv-server at the repository root (pip installs openai, pytest and jsonschema), builds
# the CLI, starts the server, runs pytest, then stops the server with SIGTERM and checks
# that it drained and exited cleanly. Exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
venv="$root/.venv-server"
if ! "$venv/bin/python" -c "import openai, pytest, jsonschema" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "openai>=1.40" "pytest>=8" "jsonschema>=4"
fi

cargo build --quiet -p strata-cli
target_dir="${CARGO_TARGET_DIR:-$root/target}"
strata="$target_dir/debug/strata"

port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp -t strata-serve.XXXXXX.log)"
"$strata" serve --host 127.0.0.1 --port "$port" --max-batch 16 --max-queue 64 --ctx-size 512 \
    >"$log" 2>&1 &
pid=$!
cleanup() {
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

for _ in $(seq 1 300); do
    if "$venv/bin/python" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "strata serve exited early:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.1
done

status=0
STRATA_URL="http://127.0.0.1:$port" STRATA_PID="$pid" STRATA_MODEL="strata-tiny-moe" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/server" || status=$?

# SIGTERM drains and exits 0: drain_check.py sends it while a stream is in flight.
STRATA_URL="http://127.0.0.1:$port" STRATA_PID="$pid" STRATA_MODEL="strata-tiny-moe" \
    "$venv/bin/python" "$root/tests/server/drain_check.py" || status=$?
kill -TERM "$pid" 2>/dev/null || true
serve_status=0
wait "$pid" || serve_status=$?
if [ "$serve_status" -ne 0 ]; then
    echo "strata serve exited with status $serve_status after SIGTERM; log:" >&2
    tail -n 50 "$log" >&2
    status=1
fi
if [ "$status" -ne 0 ]; then
    echo "server log: $log" >&2
else
    rm -f "$log"
fi
exit "$status"
