#!/usr/bin/env bash
# End-to-end generation speed, Strata beside llama.cpp (llama-cpp-python) on the same GGUF
# files, greedy, in one run so the two can be compared as a ratio.
#
#   scripts/bench_generate.sh [TOKENS]     # default 64 generated tokens
#
# Needs: a release build (cargo build --release -p strata-cli), the assets of
# scripts/fetch_assets.sh, and optionally LLAMA_PY=/path/to/python with llama-cpp-python.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tokens="${1:-64}"
assets="${STRATA_ASSETS:-.cache/assets}"
prompt="The history of the Roman Empire began when"
strata=target/release/strata

run_strata() {
    "$strata" generate --model "$1" --prompt "$prompt" --temperature 0 -n "$tokens" "${@:2}" 2>&1 >/dev/null | tail -1
}

echo "model | engine | result"
for m in "" "$assets/smollm2-135m-instruct-q4_1.gguf" "$assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"; do
    name="${m:-models/strata-tiny-moe}"
    for w in bf16 int8 int4; do
        if [[ -z "$m" ]]; then
            echo "$name | strata --weights $w | $("$strata" generate --prompt "$prompt" --temperature 0 -n "$tokens" --weights "$w" 2>&1 >/dev/null | tail -1)"
        elif [[ "$w" == bf16 ]]; then
            echo "$name | strata | $(run_strata "$m")"
        fi
    done
    if [[ -n "$m" && -n "${LLAMA_PY:-}" ]]; then
        echo "$name | llama.cpp | $("$LLAMA_PY" scripts/bench_llama_cpp.py "$m" --prompt "$prompt" --tokens "$tokens")"
    fi
done
