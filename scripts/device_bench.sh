#!/usr/bin/env bash
# Issue #27's device check: Strata's GPU paths on a machine with a real GPU, in one call of
# a few minutes (the device machine has no network and no Rust toolchain).
#
#   scripts/device_bench.sh BIN OUT_DIR        # on the GPU machine, from the repository root
#
# BIN is a release `strata` built elsewhere; python3 needs numpy and gguf (carried as a
# wheel); STRATA_TOKENIZER_GGUF names a GGUF holding the Qwen tokenizer (a few MB: the
# tokenizer.* keys of any Qwen2.5/Qwen3 GGUF). Steps, all logged to OUT_DIR/device_bench.log
# (outputs and the generator's log in /tmp/device_bench_runs):
#   1. the machine: GPU, CPU, `strata devices`;
#   2. the benchmark GGUFs written with scripts/make_bench_gguf.py (Qwen3-30B-A3B and
#      DeepSeek-V2-Lite shapes, LAYERS layers each, Q4_K_M-like), in the background while
#      step 3 runs;
#   3. `strata bench device $BENCH_DEVICE_ARGS` (kernels against the GPU's copy bandwidth and FMA peak),
#      Q4_K at 512 tokens again through the row kernels (`--no-tiles`), and
#      `strata bench moe` at one token (the CPU's read bandwidth, for the hybrid bound);
#   4. `strata generate` on each GGUF, the 512-token prompt scripts/bench_prompt_512.txt
#      and 128 greedy tokens, after a first --device gpu run that compiles the kernels
#      (its prefill is a user's first run): --device cpu, gpu, hybrid with ktransformers, smoe and
#      hybrimoe (the last two with an expert cache of a quarter of the experts), and smoe
#      again over three tiers (the same device cache above a DRAM cache of another quarter,
#      the rest read from the file), each under a time limit, with the md5 of each output
#      text.
# KERNELS=0 skips step 3; RUNS="gpu ktransformers" runs only those of step 4 (of cpu gpu
# ktransformers ktransformers.defer ktransformers.spin gpu.spin gpu.profile
# ktransformers.profile smoe hybrimoe smoe.three-tiers; the .spin runs with STRATA_GPU_SPIN_US=1000, the .profile runs with
# STRATA_GPU_PROFILE=1, which prints device time by kernel); the outputs and logs of step 4
# end in OUT_DIR/runs.tgz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${1:?usage: scripts/device_bench.sh BIN OUT_DIR}
out=${2:?usage: scripts/device_bench.sh BIN OUT_DIR}
layers=${LAYERS:-12}
tokens=${TOKENS:-128}
limit=${RUN_LIMIT:-150}
tokenizer=${STRATA_TOKENIZER_GGUF:-.bench/qwen-tokenizer.gguf}
runs=/tmp/device_bench_runs
mkdir -p "$out" "$runs"
log="$out/device_bench.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }
stamp() { say "== $(date -u +%H:%M:%S) $*"; }

stamp machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee -a "$log"
lscpu | grep -E '^Model name|^CPU\(s\)|^L3' | tee -a "$log"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
"$bin" devices 2>&1 | grep -v '^  ' | tee -a "$log"

shapes=${SHAPES:-qwen3-30b-a3b deepseek-v2-lite}
gen_pids=()
for shape in $shapes; do
    gguf=/tmp/$shape-${layers}l.gguf
    [[ -f "$gguf" ]] && continue
    stamp "writing $gguf in the background"
    python3 scripts/make_bench_gguf.py --shape "$shape" --layers "$layers" --out "$gguf" \
        --tokenizer-from "$tokenizer" >"$runs/make_gguf.$shape.log" 2>&1 &
    gen_pids+=($!)
done

if [[ ${KERNELS:-1} == 1 ]]; then
stamp "strata bench device"
timeout 200 "$bin" bench device ${BENCH_DEVICE_ARGS:-} 2>&1 | tee -a "$log"
stamp "strata bench device --no-tiles (prefill through the row kernels, against the tiles above)"
timeout 90 "$bin" bench device --no-tiles --formats q4_k --tokens 512 2>&1 | tee -a "$log"
stamp "strata bench moe (CPU read bandwidth at one token)"
timeout 60 "$bin" bench moe --formats q4_k --tokens 1 --min-seconds 0.3 --layers 4 2>&1 | tee -a "$log"
fi

for pid in "${gen_pids[@]}"; do
    wait "$pid" || { say "a GGUF generator failed:"; tail -5 "$runs"/make_gguf.*.log | tee -a "$log"; exit 1; }
done

run() {
    local name=$1
    shift
    local all="cpu gpu ktransformers ktransformers.defer ktransformers.spin gpu.spin"
    all+=" gpu.profile ktransformers.profile"
    [[ " ${RUNS:-$all smoe hybrimoe smoe.three-tiers} " == *" ${name#*.} "* ]] || return 0
    stamp "generate $name"
    timeout "$limit" "$bin" generate -m "$gguf" -p - -n "$tokens" --temperature 0 "$@" \
        <scripts/bench_prompt_512.txt >"$runs/text.$name" 2>"$runs/err.$name"
    local rc=$?
    grep -v '^loading' "$runs/err.$name" | tail -40 | tee -a "$log"
    say "exit $rc, text md5 $(md5sum <"$runs/text.$name" | cut -c1-12), $(wc -c <"$runs/text.$name") bytes"
}
for shape in $shapes; do
    gguf=/tmp/$shape-${layers}l.gguf
    stamp "$shape: $(tail -1 "$runs/make_gguf.$shape.log" 2>/dev/null)"
    # A quarter of the routed experts' bytes: the *_exps tensors are all but ~0.7 GB of the
    # file (embedding, LM head, attention, dense and shared layers), so a quarter of
    # (file - 0.7 GB) is close.
    quarter=$(( ($(stat -c %s "$gguf") - 700000000) / 4 ))
    # The first device run on a machine compiles every kernel (at load, on every core:
    # Device::prepare_kernels; the driver caches them for later runs): its load and prefill
    # show what a user's first run costs; the runs below are warm.
    stamp "generate $shape, first device run (8 tokens, kernels compiled)"
    timeout "$limit" "$bin" generate -m "$gguf" -p - -n 8 --temperature 0 --device gpu \
        <scripts/bench_prompt_512.txt 2>&1 >/dev/null | grep '^\[load' | tee -a "$log"
    run "$shape.cpu" --device cpu
    run "$shape.gpu" --device gpu
    run "$shape.ktransformers" --device hybrid --policy ktransformers
    # KTransformers' expert deferral: two of each token's experts per MoE layer run on the
    # CPU while the device works on the next layer's attention.
    run "$shape.ktransformers.defer" --device hybrid --policy ktransformers --defer 2
    # The same with waits polling for a millisecond before they block (13 round trips a
    # token), and --device gpu's one.
    STRATA_GPU_SPIN_US=1000 run "$shape.ktransformers.spin" --device hybrid --policy ktransformers
    STRATA_GPU_SPIN_US=1000 run "$shape.gpu.spin" --device gpu
    # Device time by kernel, prefill and per decoded token (slower while on).
    STRATA_GPU_PROFILE=1 run "$shape.gpu.profile" --device gpu
    STRATA_GPU_PROFILE=1 run "$shape.ktransformers.profile" --device hybrid --policy ktransformers
    run "$shape.smoe" --device hybrid --policy smoe --vram-budget "$quarter"
    run "$shape.hybrimoe" --device hybrid --policy hybrimoe --vram-budget "$quarter"
    run "$shape.smoe.three-tiers" --device hybrid --policy smoe --vram-budget "$quarter" \
        --expert-cache "$quarter"
done
stamp done
tar czf "$out/runs.tgz" -C "$(dirname "$runs")" "$(basename "$runs")"
