#!/usr/bin/env bash
# The README's pictures (docs/img/*.svg), made by the `--plot` commands from the shipped
# model, strata-tiny-moe:
#
#   scripts/make_plots.sh
#
# Needs a release build (cargo build --release -p strata-cli; STRATA=path overrides the
# binary). The roofline's numbers are this machine's: rerun it on yours.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
strata="${STRATA:-target/release/strata}"
model=models/strata-tiny-moe
out=docs/img
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

# Expert load of 64 ShareGPT prompts (prefill and 16 greedy tokens each).
head -n 64 data/prompts/sharegpt-320.txt > "$tmp/prompts.txt"
"$strata" trace --model "$model" --prompts "$tmp/prompts.txt" --decode 16 --no-hidden \
    --out "$tmp/trace.jsonl" --plot "$out/expert-load.svg"

# The MoE kernels at the shipped model's expert shape against the machine's peaks.
"$strata" bench moe --hidden 256 --inter 128 --experts 32 --topk 4 \
    --tokens 1,4,16,64,256,1024 --formats bf16,int8,int4,q4_0 --min-seconds 0.2 \
    --plot "$out/roofline.svg" > "$tmp/bench.txt"

# SMoE's decode and prefill figures beside the simulation.
"$strata" simulate --reproduce smoe --plot "$out/reproduce-smoe.svg" > "$tmp/smoe.txt"

# The shipped model's shape on SMoE's RTX 4090 machine, on its own routing of one prompt
# (a prefill and 12 decode steps: a timeline short enough to read).
head -n 1 data/prompts/sharegpt-320.txt > "$tmp/one.txt"
"$strata" trace --model "$model" --prompts "$tmp/one.txt" --decode 12 \
    --out "$tmp/one.jsonl"
"$strata" simulate --model "$model" --hardware smoe-4090 --policy smoe:2 \
    --workload "$tmp/one.jsonl" --timeline "$tmp/timeline.json" \
    --plot "$out/timeline.svg" > "$tmp/simulate.txt"
ls -l "$out"
