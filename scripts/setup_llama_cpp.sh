#!/usr/bin/env bash
# Builds llama.cpp (the C++ tree vendored in the llama-cpp-python 0.3.36 sdist) once, and a
# venv whose llama-cpp-python uses that same shared library. The reference for Strata's GGUF
# kernels (fixtures' logits) and the peer of scripts/bench_gguf_vs_llama_cpp.py.
#
#   nice -n 10 scripts/setup_llama_cpp.sh [BUILD_DIR] [VENV]
#
# BUILD_DIR (default .cache/llama.cpp, or $LLAMA_CPP_DIR) gets:
#   src/      the extracted sdist (src/vendor/llama.cpp is the C++ tree, with
#             convert_hf_to_gguf.py and gguf-py)
#   build/    cmake build: build/bin/{libllama.so,libggml*.so,llama-quantize,llama-imatrix,
#             llama-server,llama-cli,llama-bench}
# VENV (default .venv-llama, or $LLAMA_CPP_VENV): llama-cpp-python 0.3.36 installed with
#   CMAKE_ARGS=-DLLAMA_BUILD=OFF (no second compile of llama.cpp) and an activate hook that
#   exports LLAMA_CPP_LIB_PATH=BUILD_DIR/build/bin, so `import llama_cpp` loads the library
#   built here. Python code that does not go through `activate` must set it itself
#   (scripts/bench_gguf_vs_llama_cpp.py and make_gguf_fixtures.py do).
#
# Idempotent: each step is skipped when its output exists; cmake rebuilds only what changed.
# Needs cmake (installed with apt-get when missing), a C++ compiler and python3 >= 3.9.
# GGML_NATIVE=ON: the binaries use this CPU's instruction sets (AVX2 here); do not copy them
# to another machine. On a CPU with AMX the native build dies with SIGILL in ggml's AMX code
# on these VMs (`tilezero`), so there it is built with GGML_NATIVE=OFF and the AVX-512 sets
# the CPU reports (llama.cpp's AVX-512 VNNI kernels, its AMX path off).
set -euo pipefail

VERSION=0.3.36
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(realpath -m "${1:-${LLAMA_CPP_DIR:-$ROOT/.cache/llama.cpp}}")
VENV=$(realpath -m "${2:-${LLAMA_CPP_VENV:-$ROOT/.venv-llama}}")
JOBS=${JOBS:-$(nproc)}
PY=${PYTHON:-python3}

log() { printf '[setup_llama_cpp] %s\n' "$*" >&2; }

if ! command -v cmake >/dev/null; then
    log "installing cmake"
    apt-get install -y cmake || { apt-get update && apt-get install -y cmake; }
fi

# 1. The sdist and its vendored llama.cpp.
SRC=$DIR/src
mkdir -p "$DIR"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    log "fetching llama-cpp-python==$VERSION sdist"
    "$PY" -m pip download --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$DIR/sdist"
    rm -rf "$DIR/tmp" && mkdir -p "$DIR/tmp"
    tar -xzf "$DIR/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/tmp"
    rm -rf "$SRC" && mv "$DIR/tmp/llama_cpp_python-$VERSION" "$SRC" && rmdir "$DIR/tmp"
fi
LLAMA=$SRC/vendor/llama.cpp

# 2. llama.cpp: shared libllama + the tools, Release, native ISA, no curl.
BUILD=$DIR/build
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    log "configuring $BUILD"
    ISA=(-DGGML_NATIVE=ON)
    if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
        log "AMX CPU: GGML_NATIVE=OFF with its AVX-512 sets (the native AMX build dies with SIGILL)"
        ISA=(-DGGML_NATIVE=OFF)
        for flag in avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 \
            avx512vbmi:AVX512_VBMI avx_vnni:AVX_VNNI; do
            grep -qw "${flag%%:*}" /proc/cpuinfo && ISA+=("-DGGML_${flag#*:}=ON")
        done
    fi
    cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        "${ISA[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
fi
TARGETS=(llama llama-quantize llama-imatrix llama-server llama-cli llama-bench)
log "building ${TARGETS[*]} with $JOBS jobs"
cmake --build "$BUILD" --config Release -j "$JOBS" --target "${TARGETS[@]}"
LIB=$BUILD/bin
[ -f "$LIB/libllama.so" ] || { log "no $LIB/libllama.so"; exit 1; }

# 3. The venv: llama-cpp-python's Python package without its own llama.cpp build.
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
if ! "$VENV/bin/pip" show llama-cpp-python 2>/dev/null | grep -q "^Version: $VERSION$"; then
    log "installing llama-cpp-python==$VERSION (LLAMA_BUILD=OFF) and numpy, gguf"
    "$VENV/bin/pip" install -q numpy "gguf==0.19.0" typing-extensions diskcache jinja2
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
        "$VENV/bin/pip" install --no-deps "$DIR/sdist/llama_cpp_python-$VERSION.tar.gz"
fi
# Point llama-cpp-python at the library built above whenever the venv is activated.
HOOK="export LLAMA_CPP_LIB_PATH=$LIB  # setup_llama_cpp.sh"
grep -qF "$HOOK" "$VENV/bin/activate" || {
    sed -i '/# setup_llama_cpp.sh$/d' "$VENV/bin/activate"
    echo "$HOOK" >>"$VENV/bin/activate"
}

# 4. Check: the venv loads this build's library and runs.
LLAMA_CPP_LIB_PATH=$LIB "$VENV/bin/python" - <<EOF
import llama_cpp, llama_cpp.llama_cpp as C
path = C._lib._name
assert path.startswith("$LIB"), f"llama_cpp loaded {path}, not the library in $LIB"
print(f"llama-cpp-python {llama_cpp.__version__} uses {path}")
print(C.llama_print_system_info().decode())
EOF
log "done: tools in $LIB, venv $VENV (LLAMA_CPP_LIB_PATH=$LIB)"
