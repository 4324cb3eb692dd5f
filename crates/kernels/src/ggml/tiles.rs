//! The many-token path on ggml blocks: decode a tile of weight rows into packed BF16 or INT8
//! in per-thread scratch, then run the packed micro-kernels (AVX-512 `vdpbf16ps` /
//! `vpdpbusd`, AMX `tdpbf16ps` / `tdpbsud`) over all the call's tokens.
//!
//! Decode reads each weight once per token, so the int8 row-dot kernels (`super::vecdot`)
//! that work on the blocks as they lie are bound by memory. A prompt multiplies each weight by
//! hundreds of tokens: there the cost is the multiply, and the tile units do several times the
//! row-dot work per cycle. Decoding a 64-row tile costs one pass over its blocks and is shared
//! by every token of the call, so it fades as tokens grow.
//!
//! On AVX-512, types whose values an INT8 tile with a scale per 32 (per 16 for Q6_K, Q3_K and
//! Q2_K) holds exactly (`int8::exact`: every type with a block decoder) decode to it:
//! `vpdpbusd` does twice the multiplies of `vdpbf16ps`, and a tile decodes faster. AMX and the
//! other types (F16, BF16, the grid i-quants) take BF16 tiles ([`tile_for`]); on AMX some
//! types keep AVX-512's INT8 tiles below their own thresholds ([`amx_bf16_min`]).
//! On AVX-VNNI without AVX-512 the INT8 tiles run on 256-bit halves; the other types and
//! plain AVX2 keep their row-dot kernels. `STRATA_GGML_TILES=int8` forces INT8 tiles on every
//! type, the others requantized per 32.
//!
//! A key design decision: the tile is written in exactly the layout [`PackedMatrix`] packs at
//! load, and viewed as one, so every packed micro-kernel, the AMX tile program on the software
//! tile unit included, runs it unchanged; nothing of the ggml layout reaches the micro-kernels.

use std::cell::Cell;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::PackedMatrix;
use crate::buf::AlignedBuf;
use crate::isa::Isa;
use crate::packed::micro::{self, Kernel};
use crate::packed::{Activations, LINE, PackedFormat, PackedLayout, STRIP, StableBytes};

use super::scratch::{Buffer, Scratch, with_buffer, with_scratch};
use super::unpack::{UNIT, unpack_rows};
use super::{GgmlType, dequantize_row, has_fast_kernel};

#[cfg(target_arch = "x86_64")]
mod direct;
pub(super) mod int8;

/// Weight rows per tile: the strips one micro-kernel block takes (64 output columns).
pub(crate) const TILE_ROWS: usize = micro::N_BLOCK_STRIPS * STRIP;
/// Tokens per task: the tile is decoded once per this many tokens.
pub(crate) const TILE_TOKENS: usize = 512;
/// Fewest tokens of one matrix call for which the tile path is taken on AMX. Measured with
/// `strata bench moe --formats q4_k,q6_k,q8_0,iq4_xs` on a 16-core Xeon (2026-11-24,
/// docs/benchmarks.md): at 32 tokens per expert the tiles were 1.01-1.55x the int8 row-dot
/// kernels, at 64 1.4-2.1x, at 256 3.1-4.5x; at 16, 1.02-1.24x but with the row-dot kernels
/// still ahead on some types. Against the VNNI row-dot kernels (2-core Xeon, 2026-11-27,
/// `STRATA_GGML_TILES=int8,1000000000` against the default): 1.24-2.0x at 32 tokens per
/// expert, 1.7-2.2x at 64 (Q4_K, Q6_K, Q8_0).
///
/// Some types keep AVX-512's choice below their own threshold ([`amx_bf16_min`]).
pub(crate) const TILE_MIN_TOKENS_AMX: usize = 32;
/// The AMX BF16 threshold of Q6_K and Q3_K (and Q5_K before [`TILE_MIN_TOKENS_AMX_Q5_K`]),
/// whose AVX-512 INT8 tiles decode several times faster than their BF16 tiles, which repays
/// them at 32 tokens per expert even against `tdpbf16ps`. Measured with `strata bench moe --crossover --formats q4_k,q6_k,q8_0,iq4_xs,
/// q5_k,q3_k,q2_k --tokens 1 --layers 2 --min-seconds 0.5` on a 2-vCPU Xeon with AMX
/// (2026-12-02, docs/benchmarks.md), ms per expert, AVX-512 INT8 tiles against AMX BF16
/// tiles at 32 / 64 tokens per expert: Q6_K 1.025 / 1.810 against 1.349 / 1.682, Q5_K 1.044
/// / 1.600 against 1.285 / 1.547, Q3_K 0.973 / 1.608 against 1.427 / 1.626; at 128 BF16
/// ahead (1.2-1.4x). Q6_K again after its BF16 fill took its scales once per strip: 1.010 /
/// 1.591 against 1.290 / 1.570. Q2_K (INT8 tiles flushed per 16) was behind at 32 (1.272
/// against 1.194) and keeps [`TILE_MIN_TOKENS_AMX`]; so does Q4_K since its BF16 tiles are
/// filled from the packed nibbles (the same run: 0.877 against 0.677 at 32, 0.554 against
/// 0.626 at 16).
pub(crate) const TILE_MIN_TOKENS_AMX_SLOW_BF16_FILL: usize = 64;
/// The same for Q8_0 and IQ4_XS, whose BF16 tiles are filled in registers from their blocks
/// (`direct`): in the same session, Q8_0's BF16 tiles 0.623 / 0.655 / 0.704 ms against INT8
/// tiles 0.680 / 0.853 / 1.097 at 8 / 16 / 32 tokens per expert (row-dot 0.744 at 8); IQ4_XS
/// 0.487 / 0.575 against 0.527 / 0.807 at 16 / 32, behind at 8 (0.487 against 0.372).
pub(crate) const TILE_MIN_TOKENS_AMX_Q8_0: usize = 8;
/// See [`TILE_MIN_TOKENS_AMX_Q8_0`].
pub(crate) const TILE_MIN_TOKENS_AMX_IQ4_XS: usize = 16;
/// The same for Q5_K since its INT8 tiles are decoded in registers (its BF16 tiles still go
/// through the generic fill): INT8 tiles 1.263 ms per expert against 1.405 for BF16 at 64
/// tokens per expert, 2.295 against 1.981 at 128 (the same session, after the change).
pub(crate) const TILE_MIN_TOKENS_AMX_Q5_K: usize = 128;

/// Fewest tokens of one matrix call of `ty` for AMX BF16 tiles: below it, AMX takes what
/// AVX-512 would.
fn amx_bf16_min(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q6_K | GgmlType::Q3_K => TILE_MIN_TOKENS_AMX_SLOW_BF16_FILL,
        GgmlType::Q5_K => TILE_MIN_TOKENS_AMX_Q5_K,
        GgmlType::Q8_0 => TILE_MIN_TOKENS_AMX_Q8_0,
        GgmlType::IQ4_XS => TILE_MIN_TOKENS_AMX_IQ4_XS,
        _ => TILE_MIN_TOKENS_AMX,
    }
}

/// The same on AVX-512 without AMX (`vdpbf16ps`): on that Xeon the tiles were 0.67-1.03x at 32
/// tokens per expert, 0.89-1.21x at 64 and 1.31-2.02x at 256. Not yet measured on AMD Zen 4/5,
/// whose BF16 units are relatively faster.
pub(crate) const TILE_MIN_TOKENS_AVX512: usize = 128;
/// Fewest tokens for INT8 tiles on AMX, when forced (`STRATA_GGML_TILES=int8`): by default
/// AMX takes BF16 tiles. One 64x2048 Q4_K tile on one core of a Xeon with AMX (2026-11-27,
/// `tile_fill_and_kernel_timing`): `tdpbsud` with weight and activation scales per 32 ran at
/// 31-58 GOPS, flush-bound, against 410-1000 GOPS for `tdpbf16ps` on BF16 tiles; even one scale
/// per row (no flush inside `k`) gave 706 GOPS.
pub(crate) const INT8_MIN_TOKENS_AMX: usize = 32;
/// Fewest tokens of one matrix call for INT8 tiles on AVX-512 (`vpdpbusd`). Measured with
/// `strata bench moe --formats q4_k,q6_k,q8_0,iq4_xs` (`STRATA_GGML_TILES=int8,8` against the
/// default) on a 2-core Xeon with AMX and AVX-512 VNNI, the host shared with a build (load
/// 3-5), 2026-11-27, docs/benchmarks.md: against the AVX2 int8 row-dot kernels the tiles were
/// 0.5-1.0x at 8 tokens per expert, 0.6-1.45x at 16 (Q4_K and Q6_K behind), 1.15-1.9x at 32
/// and 1.2-2.2x at 64. Measured again against the VNNI row-dot kernels (same host, quiet,
/// 2026-11-27 21:43 UTC): 1.21-1.72x at 32 tokens per expert and 1.54-1.90x at 64 (Q4_K,
/// Q6_K, Q8_0), so the threshold stands.
pub(crate) const INT8_MIN_TOKENS_AVX512: usize = 32;
/// The same for Q4_K, whose INT8 tiles are decoded in registers from its blocks
/// (`q4_k`), on AVX-512 and on AMX, below [`amx_bf16_min`]. Measured with `strata
/// bench moe --formats q4_k --tokens 64,128,256,512,1024` on the 2-core Xeon with AMX
/// (2026-11-28, docs/benchmarks.md), seconds per call at 4 / 8 / 16 / 32 tokens per expert:
/// AVX-512 INT8 tiles 0.043-0.052 / 0.060-0.063 / 0.093-0.113 / 0.156-0.170, the VNNI
/// row-dot kernels 0.043-0.053 / 0.076-0.102 / 0.168-0.198 / 0.328-0.393, AMX BF16 tiles
/// 0.10-0.13 / 0.11-0.14 / 0.13-0.145 / 0.135-0.142.
pub(crate) const INT8_MIN_TOKENS_Q4_K: usize = 8;
/// The same for Q8_0, whose INT8 tile is a copy of its blocks' bytes. Measured with `strata
/// bench moe --formats q8_0,q5_0,iq4_xs --tokens 128,256,512` (`STRATA_GGML_TILES=int8,1`
/// against `int8,1000000000`) on a 2-core Ice Lake Xeon with AVX-512 VNNI (2026-11-29,
/// docs/benchmarks.md), two quiet alternating rounds, seconds per call at 8 / 16 tokens per
/// expert: Q8_0 tiles 0.100 / 0.113-0.126 against the VNNI row-dot kernels 0.097-0.099 /
/// 0.188-0.189 (1.5-1.7x at 16); Q5_0 level at 16 (0.176-0.184 against 0.183-0.187), IQ4_XS
/// behind (0.200-0.260 against 0.179-0.190), so those keep [`INT8_MIN_TOKENS_AVX512`]. On an
/// Emerald Rapids Xeon (2026-12-01, `strata bench moe --crossover`, and the layer at 8 tokens
/// per expert, `--tokens 128`, three alternating rounds: 0.082-0.084 s against 0.094-0.096)
/// the tiles won from 8 (1.12-1.17x; at 4, 0.71x). Since its INT8 tiles are filled in
/// registers from its blocks (`direct::q8_0_strip`), on a Zen 5 EPYC (2026-12-02, `strata
/// bench moe --crossover --formats q8_0`, two rounds, ms per expert at 2 / 4 / 8 tokens per
/// expert): tiles 0.168-0.170 / 0.189 / 0.212-0.219 (generic fill 0.415-0.439 / 0.432-0.455
/// / 0.477-0.499), row-dot 0.186-0.189 / 0.242-0.243 / 0.464; not yet measured on Intel.
pub(crate) const INT8_MIN_TOKENS_Q8_0: usize = 4;
/// The same for Q5_K (a scale and a min per 32). When the generic fill decoded it, on an
/// Emerald Rapids Xeon (2026-12-01, `strata bench moe --crossover`, and the layer at 16
/// tokens per expert, `--tokens 256`, three alternating rounds: 0.086-0.088 s against
/// 0.115-0.117 for the VNNI row-dot kernels) the tiles won from 16 (1.33x; at 8, 0.85x).
/// Decoded in registers (`direct::q5_k_strip`), on the 2-vCPU Xeon with AMX (2026-12-02,
/// `--crossover --formats q5_k`, ms per expert at 8 / 16 / 32 tokens per expert): tiles
/// 0.360 / 0.502 / 0.751 (generic fill 0.564 / 0.690 / 0.924), row-dot 0.471 / 0.848 /
/// 1.621; at 4, 0.271 against 0.241.
pub(crate) const INT8_MIN_TOKENS_Q5_K: usize = 8;
/// The same for Q6_K, whose INT8 tile (a scale per 16, flushed twice as often as Q4_K's) is
/// decoded in registers from its blocks. Measured with `strata bench moe --formats q6_k
/// --tokens 64,128,256,512,1024 --layers 4` (`STRATA_GGML_TILES=int8,1` against
/// `int8,1000000000`) on the 2-core Ice Lake Xeon with AVX-512 VNNI (2026-11-30,
/// docs/benchmarks.md), two alternating rounds, seconds per call at 4 / 8 / 16 / 32 / 64
/// tokens per expert: tiles 0.051-0.052 / 0.065-0.069 / 0.094-0.095 / 0.142-0.152 /
/// 0.253-0.267, the VNNI row-dot kernels 0.042-0.044 / 0.072-0.078 / 0.138-0.149 /
/// 0.259-0.263 / 0.501-0.542.
pub(crate) const INT8_MIN_TOKENS_Q6_K: usize = 8;

/// The same for Q3_K (a scale per 16). Measured first with `strata bench moe --formats q3_k
/// --tokens 64,128,256,512` (`STRATA_GGML_TILES=int8,1` against `int8,1000000000`) on a
/// 2-core Emerald Rapids Xeon with AVX-512 VNNI (2026-11-30, docs/benchmarks.md): then the
/// tiles won from 16 tokens per expert. Its block decoding has since taken fewer operations:
/// on the same host (2026-12-01, `strata bench moe --crossover`, and the layer, three
/// alternating rounds) the tiles won from 4 (0.037-0.038 s against 0.042-0.043, 1.14x; at 8,
/// 0.049-0.050 against 0.081-0.082, 1.65x; at 2, 0.84x).
pub(crate) const INT8_MIN_TOKENS_Q3_K: usize = 4;
/// The same for Q2_K (a scale and a min per 16, stored exactly since 2026-11-30; before, its
/// tiles requantized it per 32, so it kept the row-dot kernels below 128 tokens). Measured as
/// Q3_K, the same day and host: tiles 0.089-0.090 / 0.098-0.107 / 0.121-0.133 / 0.165-0.177 /
/// 0.246-0.262 s at 4 / 8 / 16 / 32 / 64 tokens per expert, the VNNI row-dot kernels
/// 0.043-0.045 / 0.086-0.090 / 0.170-0.174 / 0.337-0.339 / 0.672-0.699.
pub(crate) const INT8_MIN_TOKENS_Q2_K: usize = 16;
/// The same for IQ4_XS, whose INT8 tiles are filled in registers from its blocks (`direct`,
/// 4.6 us a 64x2048 tile against 39-41 through the generic fill). On the 2-vCPU Xeon with AMX
/// (2026-12-02, `strata bench moe --crossover --formats iq4_xs`), ms per expert, INT8 tiles
/// against the VNNI row-dot kernels at 2 / 4 / 8 tokens per expert: 0.251 / 0.281 / 0.372
/// against 0.265 / 0.362 / 0.682.
pub(crate) const INT8_MIN_TOKENS_IQ4_XS: usize = 4;

/// The same for Q4_0 and Q5_0 (Q5_0: the down projections of DeepSeek-V2-Lite's Q4_K_M
/// files, whose 1,408 are no whole number of k-quant blocks), whose INT8 tiles are filled in
/// registers from their blocks (`direct::q4_0_like_strip`). On a Zen 5 EPYC
/// (2026-12-02, `strata bench moe --crossover --formats q4_0,q5_0`, two rounds, ms per expert
/// at 4 / 8 / 16 tokens per expert): Q4_0 tiles 0.207-0.271 / 0.233-0.297 / 0.312-0.381
/// (generic fill 0.337-0.346 / 0.386-0.393 / 0.462-0.464), row-dot 0.254-0.266 / 0.491-0.511
/// / 0.916-0.974; Q5_0 tiles 0.239-0.254 / 0.255-0.266 / 0.333-0.346 (generic fill
/// 0.557-0.569 / 0.599-0.607 / 0.679-0.681), row-dot 0.248-0.255 / 0.482-0.493 /
/// 0.922-0.930. Level at 4, so from 8; not yet measured on Intel.
pub(crate) const INT8_MIN_TOKENS_Q4_0_Q5_0: usize = 8;

/// Fewest tokens from which `ty` takes AVX-512 INT8 tiles below the general thresholds (on
/// AMX, until its BF16 tiles take over): the types whose tiles decode cheaply enough to
/// repay them at a few tokens per expert.
fn early_int8_min(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(INT8_MIN_TOKENS_Q4_K),
        GgmlType::Q6_K => Some(INT8_MIN_TOKENS_Q6_K),
        GgmlType::Q8_0 => Some(INT8_MIN_TOKENS_Q8_0),
        GgmlType::Q5_K => Some(INT8_MIN_TOKENS_Q5_K),
        GgmlType::Q3_K => Some(INT8_MIN_TOKENS_Q3_K),
        GgmlType::Q2_K => Some(INT8_MIN_TOKENS_Q2_K),
        GgmlType::IQ4_XS => Some(INT8_MIN_TOKENS_IQ4_XS),
        GgmlType::Q4_0 | GgmlType::Q5_0 => Some(INT8_MIN_TOKENS_Q4_0_Q5_0),
        _ => None,
    }
}

/// Fewest tokens for INT8 tiles on AVX-VNNI (the AVX-512 register tiles on 256-bit halves,
/// filled by the generic decoder) for the types their tiles hold exactly. Measured with
/// `strata bench moe` (`STRATA_KERNEL=avxvnni`, `STRATA_GGML_TILES=int8,1` against
/// `int8,1000000000`, so against the AVX2 row-dot kernels) on a 2-core Emerald Rapids Xeon
/// (2026-11-30, docs/benchmarks.md), two alternating rounds, at 16 / 32 / 64 tokens per
/// expert: Q4_K 1.03-1.13x / 1.38-1.40x / 1.6-1.9x, Q5_K 1.06-1.13x / 1.47-1.51x /
/// 1.72-1.94x, Q6_K 0.93-1.19x / 1.31-1.48x / 1.62-1.80x (at 8, 0.81-0.86x), Q2_K (stored
/// exactly) 1.16-1.33x / 1.52-1.70x at 16 / 32 (at 8, 0.86-0.93x). Earlier, on a
/// Xeon with AMX (2026-11-29): Q8_0 and IQ4_XS 1.2-2.2x from 32; Q4_K level at 32 and 64
/// before its flush read scales without divisions (`SpanScales`). Since the per-256 flush, on
/// the same Emerald Rapids (2026-12-01, `strata bench moe --crossover` and the layer at 16
/// tokens per expert, `--tokens 256`, two alternating rounds): Q4_K 0.121-0.127 s against
/// 0.166-0.171 (1.35x), Q6_K 0.140-0.158 against 0.157 (1.0-1.12x), Q2_K 0.172-0.206 against
/// 0.246-0.254 (1.19-1.48x); in the crossover Q5_K 1.22x and IQ4_XS 1.23x at 16; at 8 every
/// type but Q3_K and Q8_0 behind.
pub(crate) const INT8_MIN_TOKENS_AVX_VNNI: usize = 16;
/// The same for Q3_K and Q8_0, whose tiles won from 8 tokens per expert there: Q3_K
/// 1.17-1.28x at 8 (0.131-0.140 s against 0.163-0.167), 1.7x at 16, 2.2-2.5x at 32, at 4
/// 0.5-0.6x (2026-11-30); Q8_0 at 8 0.102-0.110 s against 0.123 (1.13-1.20x, the layer,
/// 2026-12-01), at 4 0.63x (the crossover).
pub(crate) const INT8_MIN_TOKENS_AVX_VNNI_EARLY: usize = 8;
/// The same for the types requantized per 32 (F16, BF16, the grid i-quants) when INT8 tiles
/// are forced (by default they keep their own kernels here): Q6_K, when it was requantized so
/// (2026-11-29, the Xeon with AMX), was level at 64 tokens per expert and 1.33-1.78x at 128
/// and 256.
pub(crate) const INT8_MIN_TOKENS_AVX_VNNI_REQUANTIZED: usize = 128;

/// What a tile is decoded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileFormat {
    /// BF16, any type.
    Bf16,
    /// INT8 with a scale per [`int8::GROUP`], types with an integer form.
    Int8,
}

impl TileFormat {
    /// The packed format a tile of `ty` is written in.
    pub(crate) fn packed(self, ty: GgmlType) -> PackedFormat {
        match self {
            TileFormat::Bf16 => PackedFormat::Bf16,
            TileFormat::Int8 => PackedFormat::Int8 {
                group: Some(int8::group(ty)),
            },
        }
    }

    /// The packed layout of `n` rows of `k` values of `ty`.
    fn layout(self, ty: GgmlType, n: usize, k: usize) -> PackedLayout {
        PackedLayout::sizes(self.packed(ty), n, k)
    }
}

/// `STRATA_GGML_TILES=bf16|int8[,MIN]` (benchmarks): the tile format for every type, and the
/// fewest tokens per call that take tiles. Read once.
fn forced() -> (Option<TileFormat>, Option<usize>) {
    static FORCED: OnceLock<(Option<TileFormat>, Option<usize>)> = OnceLock::new();
    *FORCED.get_or_init(|| {
        let Ok(v) = std::env::var("STRATA_GGML_TILES") else {
            return (None, None);
        };
        let mut parts = v.split(',');
        let fmt = match parts.next().map(str::trim) {
            Some("bf16") => Some(TileFormat::Bf16),
            Some("int8") => Some(TileFormat::Int8),
            _ => None,
        };
        (fmt, parts.next().and_then(|m| m.trim().parse().ok()))
    })
}

/// The micro-kernel path and tile format for `m` tokens of `ty` on `isa`, when the tile path
/// applies: the CPU has tile or int8 dot-product units and there are enough tokens to repay
/// the decode.
pub(crate) fn tile_for(isa: Isa, m: usize, ty: GgmlType) -> Option<(Kernel, TileFormat)> {
    let (fmt, min) = forced();
    let default = (fmt, min) == (None, None);
    // On AMX, below the type's BF16 threshold, the choice is AVX-512's.
    let isa = if default && isa == Isa::Amx && m < amx_bf16_min(ty) {
        Isa::Avx512
    } else {
        isa
    };
    // Some types' INT8 tiles decode fast enough to repay them from a few tokens on.
    let early = early_int8_min(ty).filter(|_| default && isa == Isa::Avx512);
    if early.is_some_and(|early| m >= early) {
        return Some((Kernel::Isa(Isa::Avx512), TileFormat::Int8));
    }
    // AMX keeps BF16: `tdpbsud` with a scale per 32 flushes its four accumulator tiles per 32
    // `k`, and the flush, not the multiply, sets the speed (see `INT8_MIN_TOKENS_AMX`).
    // INT8 tiles only for the types they hold exactly: requantizing per 32 (as Q6_K and Q2_K
    // were before their tiles had scales per 16) is a second rounding llama.cpp does not make,
    // and cost the Q6_K fixture its top-1 agreement with llama.cpp (0.864 against the row-dot
    // kernels' 0.977, on an Ice Lake). The float and grid types take BF16 tiles on AVX-512
    // and their own kernels below it (the AVX2 "BF16" kernel is f32 FMA).
    let fmt = fmt.unwrap_or(if int8::exact(ty) && isa < Isa::Amx {
        TileFormat::Int8
    } else {
        TileFormat::Bf16
    });
    let default_min = match (isa, fmt) {
        (Isa::Portable, _) => return None,
        (Isa::Amx, TileFormat::Bf16) => Some(amx_bf16_min(ty)),
        (Isa::Amx, TileFormat::Int8) => Some(INT8_MIN_TOKENS_AMX),
        (Isa::Avx512, TileFormat::Bf16) => Some(TILE_MIN_TOKENS_AVX512),
        (Isa::Avx512, TileFormat::Int8) => Some(INT8_MIN_TOKENS_AVX512),
        (Isa::AvxVnni, TileFormat::Int8) => Some(match ty {
            GgmlType::Q3_K | GgmlType::Q8_0 => INT8_MIN_TOKENS_AVX_VNNI_EARLY,
            _ if int8::exact(ty) => INT8_MIN_TOKENS_AVX_VNNI,
            _ => INT8_MIN_TOKENS_AVX_VNNI_REQUANTIZED,
        }),
        // AVX2 without AVX-VNNI: `vpmaddubsw` tiles were 0.9-1.4x its row-dot kernels at 32-64
        // tokens per expert on the Xeon (Q8_0, IQ4_XS; Q4_K and Q6_K slower), not measured on
        // an AVX2-only CPU: they run only when forced.
        (Isa::Avx2, _) | (Isa::AvxVnni, TileFormat::Bf16) => None,
    };
    let min = min.or(default_min)?;
    (m >= min.max(1)).then_some((Kernel::Isa(isa), fmt))
}

/// Weight rows of one tile: `n` rows of `k` values of `ty`, as stored.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub ty: GgmlType,
    pub n: usize,
    pub k: usize,
    pub bytes: &'a [u8],
}

/// `m` activation rows of `k` values converted for tiles of `ty` in `fmt` (BF16, or int8 with
/// a scale per 32 and sums per weight scale), padded for `kernel`.
pub(crate) fn activations<'x>(
    ty: GgmlType,
    k: usize,
    m: usize,
    kernel: Kernel,
    fmt: TileFormat,
    row: impl Fn(usize) -> &'x [f32] + Sync,
) -> Activations {
    let k_pad = fmt.layout(ty, 1, k).k_pad;
    match fmt {
        TileFormat::Bf16 => Activations::bf16(k_pad, m, kernel, row),
        // Each token's scales as the row-dot kernels quantize it for `ty`, so that a prompt
        // and its decoded tokens see the same activations. Per 256 (Q4_K, Q5_K, Q6_K), one
        // multiply by the activation scale serves a block's eight flushes: the Q4_K tile
        // kernel 445-451 -> 463-472 GOPS, Q6_K's 313-328 -> 344-361, on an Emerald Rapids
        // core (2026-12-01, `tile_fill_and_kernel_timing`, best of four alternating rounds).
        TileFormat::Int8 => {
            let scales = super::vecdot::activation_block(ty);
            Activations::int8_grouped(k_pad, m, kernel, int8::group(ty), scales, row)
        }
    }
}

/// Per-thread tile storage, viewed by one [`PackedMatrix`] at a time.
struct TileBytes(AlignedBuf);

// SAFETY: the bytes are written only through `Arc::get_mut` (in `with_tile`), which succeeds
// only while no matrix view holds the `Arc`; while a view exists they are neither moved nor
// modified.
unsafe impl StableBytes for TileBytes {
    fn stable_bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Runs `f` on this thread's tile storage of at least `len` bytes.
fn with_tile<R>(len: usize, f: impl FnOnce(&mut Arc<TileBytes>) -> R) -> R {
    thread_local! {
        static TILE: Cell<Option<Arc<TileBytes>>> = const { Cell::new(None) };
    }
    let mut tile = match TILE.take() {
        Some(t) if t.0.len() >= len => t,
        _ => Arc::new(TileBytes(AlignedBuf::zeroed(len))),
    };
    let r = f(&mut tile);
    TILE.set(Some(tile));
    r
}

/// `w` (at most [`TILE_ROWS`] rows) times tokens `tokens` of `a` (activations made by
/// [`activations`] for `kernel` and `fmt`); `emit(t, values)` receives each token's results.
pub(crate) fn block(
    w: Rows<'_>,
    kernel: Kernel,
    fmt: TileFormat,
    a: &Activations,
    tokens: Range<usize>,
    mut emit: impl FnMut(usize, &[f32]),
) {
    let layout = fmt.layout(w.ty, w.n, w.k);
    debug_assert!(w.n <= TILE_ROWS && a.k_pad == layout.k_pad);
    let strips = layout.n_pad / STRIP;
    let ldo = strips * STRIP;
    with_buffer(Buffer::TileOut, tokens.len() * ldo, |out| {
        // The kernels add their sums into `out`.
        out.fill(0.0);
        with_tile(tile_bytes(w, fmt, &layout), |tile| {
            let view = decode(w, fmt, &layout, tile);
            micro::run_block(kernel, &view, a, tokens.clone(), 0..strips, out, ldo);
            if let Some(bias) = tile_bias(w, fmt, &layout, tile) {
                int8::add_bias(out, ldo, bias, layout.n_pad, a, tokens.clone());
            }
        });
        for (j, t) in tokens.enumerate() {
            emit(t, &out[j * ldo..j * ldo + w.n]);
        }
    });
}

/// Whether a tile of `w` in `fmt` has biases: an INT8 tile of a type with mins, whose values
/// are stored unsigned.
fn has_bias(w: Rows<'_>, fmt: TileFormat) -> bool {
    fmt == TileFormat::Int8 && int8::biased(w.ty)
}

/// Bytes of a tile of `w` in `fmt`: values, scales and, for INT8 tiles of types with mins,
/// as many biases after the scales (one per row and group; the micro-kernels do not see
/// them).
fn tile_bytes(w: Rows<'_>, fmt: TileFormat, layout: &PackedLayout) -> usize {
    layout.data_bytes + layout.scales * 4 * (1 + usize::from(has_bias(w, fmt)))
}

/// Decodes `w` into `tile` (at least [`tile_bytes`] long) in `fmt` and views it as a packed
/// matrix (`layout`).
fn decode(
    w: Rows<'_>,
    fmt: TileFormat,
    layout: &PackedLayout,
    tile: &mut Arc<TileBytes>,
) -> PackedMatrix {
    let (data, scales) = (layout.data_bytes, layout.scales * 4);
    let len = tile_bytes(w, fmt, layout);
    let bytes = Arc::get_mut(tile)
        .expect("no view of the tile outlives its task")
        .0
        .as_mut_slice();
    let (values, rest) = bytes[..len].split_at_mut(data);
    match fmt {
        TileFormat::Bf16 => {
            fill(w, values, layout);
            // BF16 kernels read no scales; zero them rather than leave another tile's bytes.
            rest.fill(0);
        }
        TileFormat::Int8 => {
            // SAFETY: every bit pattern is a valid f32; the scales start 64-byte aligned (an
            // aligned buffer, `data` a multiple of 64), so nothing is left in the unaligned
            // head.
            let (head, floats, _) = unsafe { rest.align_to_mut::<f32>() };
            assert!(head.is_empty() && floats.len() * 4 == len - data);
            let (sc, bias) = floats.split_at_mut(layout.scales);
            int8::fill(w, values, sc, bias, layout);
        }
    }
    let view = PackedMatrix::over_bytes(
        tile.clone(),
        fmt.packed(w.ty),
        *layout,
        w.n,
        w.k,
        0..data,
        data..data + scales,
    )
    .expect("the tile holds exactly its layout");
    // The values of types with mins are never negative: stored as they are.
    if has_bias(w, fmt) {
        view.unsigned()
    } else {
        view
    }
}

/// The biases of a decoded INT8 tile of a type with mins (`None` for other tiles).
fn tile_bias<'t>(
    w: Rows<'_>,
    fmt: TileFormat,
    layout: &PackedLayout,
    tile: &'t TileBytes,
) -> Option<&'t [f32]> {
    if !has_bias(w, fmt) {
        return None;
    }
    let at = layout.data_bytes + layout.scales * 4;
    // SAFETY: every bit pattern is a valid f32; the biases follow the scales, 64-byte aligned,
    // so the whole slice is the aligned middle part.
    let (_, floats, _) = unsafe { tile.0.as_slice()[at..][..layout.scales * 4].align_to::<f32>() };
    Some(floats)
}

/// Writes `w` as packed BF16 strips into `bytes` (`layout`): line `p / 2` of a
/// strip holds, for each of its 16 rows, the pair `(p, p + 1)`. Padding rows and columns are
/// zero.
fn fill(w: Rows<'_>, bytes: &mut [u8], layout: &PackedLayout) {
    with_scratch(|s| {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::selected() >= Isa::Avx512 {
                // SAFETY: `Isa::Avx512` or better is only selected when the CPU has AVX-512
                // F/BW/VL.
                return unsafe { fill_avx512(s, w, bytes, layout) };
            }
            if Isa::selected() >= Isa::Avx2 {
                // SAFETY: `Isa::Avx2` or better is only selected when the CPU has AVX2 and FMA.
                return unsafe { fill_avx2(s, w, bytes, layout) };
            }
        }
        fill_body::<false>(s, w, bytes, layout);
    });
}

/// [`fill_body`] with the AVX-512 transpose.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn fill_avx512(s: &mut Scratch, w: Rows<'_>, bytes: &mut [u8], layout: &PackedLayout) {
    fill_body::<true>(s, w, bytes, layout);
}

/// [`fill_body`] compiled with AVX2 enabled, so its loops vectorise.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fill_avx2(s: &mut Scratch, w: Rows<'_>, bytes: &mut [u8], layout: &PackedLayout) {
    fill_body::<false>(s, w, bytes, layout);
}

/// The fill; `AVX512` only where the CPU has AVX-512 F, BW and VL (from [`fill_avx512`]).
#[inline(always)]
pub(super) fn fill_body<const AVX512: bool>(
    s: &mut Scratch,
    w: Rows<'_>,
    bytes: &mut [u8],
    layout: &PackedLayout,
) {
    let (k, k_pad, nr, src) = (w.k, layout.k_pad, w.n, w.bytes);
    // The direct fills convert with `vcvtne2ps2bf16` (AVX-512 BF16).
    #[cfg(target_arch = "x86_64")]
    let direct = AVX512 && crate::isa::has_avx512_bf16() && k == k_pad;
    #[cfg(target_arch = "x86_64")]
    if direct && w.ty == GgmlType::Q4_K {
        let (blocks, block, strips) = direct::strips(w, bytes, layout.strip_bytes);
        s.d.resize(blocks * 8 * STRIP, 0.0);
        s.m.resize(blocks * 8 * STRIP, 0.0);
        for st in strips {
            // SAFETY: `AVX512` is only set by `fill_avx512`, whose caller checked AVX-512
            // F/BW/VL; `direct` checked BF16.
            unsafe {
                let (src, rows) = (st.src, st.rows);
                direct::q4_k_strip_scales(src, rows, blocks, block, &mut s.d, &mut s.m, 0, STRIP);
                direct::q4_k_strip_bf16(src, rows, blocks, block, &s.d, &s.m, st.dst);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if direct && w.ty == GgmlType::Q6_K {
        let (blocks, block, strips) = direct::strips(w, bytes, layout.strip_bytes);
        s.d.resize(blocks * 16 * STRIP, 0.0);
        for st in strips {
            // SAFETY: as for Q4_K above.
            unsafe {
                direct::q6_k_strip_scales(st.src, st.rows, blocks, block, &mut s.d);
                direct::q6_k_strip_bf16(st.src, st.rows, blocks, block, &s.d, st.dst);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if direct && matches!(w.ty, GgmlType::Q8_0 | GgmlType::IQ4_XS) {
        let (blocks, _, strips) = direct::strips(w, bytes, layout.strip_bytes);
        let strip = match w.ty {
            GgmlType::Q8_0 => direct::q8_0_strip_bf16,
            _ => direct::iq4_xs_strip_bf16,
        };
        for st in strips {
            // SAFETY: as for Q4_K above; F16C comes with AVX-512 F.
            unsafe { strip(st.src, st.rows, blocks, st.dst) };
        }
        return;
    }
    // 1. All rows as BF16, `k_pad` apart; padding rows and columns zero.
    s.h.clear();
    s.h.resize(layout.n_pad * k_pad, 0);
    if has_fast_kernel(w.ty) {
        // The vectorised block decoders, then `d · q + m` per 16 values.
        s.q.resize(nr * k, 0);
        s.d.resize(nr * k / UNIT, 0.0);
        s.m.resize(nr * k / UNIT, 0.0);
        unpack_rows(Isa::selected(), w.ty, src, &mut s.q, &mut s.d, &mut s.m);
        for r in 0..nr {
            let units = r * k / UNIT..(r + 1) * k / UNIT;
            let dst = &mut s.h[r * k_pad..r * k_pad + k];
            let q = &s.q[r * k..(r + 1) * k];
            for (((h, q), d), m) in dst
                .chunks_exact_mut(UNIT)
                .zip(q.chunks_exact(UNIT))
                .zip(&s.d[units.clone()])
                .zip(&s.m[units])
            {
                for (h, &q) in h.iter_mut().zip(q) {
                    *h = micro::bf16_bits(d * f32::from(q) + m);
                }
            }
        }
    } else {
        s.f.resize(nr * k, 0.0);
        dequantize_row(w.ty, src, &mut s.f).expect("validated at construction");
        for r in 0..nr {
            let dst = &mut s.h[r * k_pad..r * k_pad + k];
            for (h, &f) in dst.iter_mut().zip(&s.f[r * k..(r + 1) * k]) {
                *h = micro::bf16_bits(f);
            }
        }
    }
    // 2. Each strip is the transpose of its 16 rows' pairs: line `l` holds pair `l` of every
    // row. Transposed 16 pairs at a time, so each row is read 64 contiguous bytes at a time.
    let pairs = k_pad / 2;
    for (strip, dst) in bytes.chunks_exact_mut(layout.strip_bytes).enumerate() {
        let h = &s.h[strip * STRIP * k_pad..(strip + 1) * STRIP * k_pad];
        #[cfg(target_arch = "x86_64")]
        if AVX512 {
            // SAFETY: any u16 is two valid bytes, and u8 needs no alignment: all of `h`.
            let (_, hb, _) = unsafe { h.align_to::<u8>() };
            for l0 in (0..pairs).step_by(STRIP) {
                // SAFETY: `AVX512` is only set by `fill_avx512`, whose caller checked the
                // features; `k_pad` is a multiple of 32, so 16 whole lines remain.
                unsafe {
                    int8::x86::transpose16(&hb[4 * l0..], 2 * k_pad, 0, &mut dst[l0 * LINE..])
                };
            }
            continue;
        }
        for l0 in (0..pairs).step_by(STRIP) {
            let n = STRIP.min(pairs - l0);
            for c in 0..STRIP {
                let row = &h[c * k_pad + 2 * l0..c * k_pad + 2 * (l0 + n)];
                for (i, pair) in row.chunks_exact(2).enumerate() {
                    let v = u32::from(pair[0]) | u32::from(pair[1]) << 16;
                    let at = (l0 + i) * LINE + c * 4;
                    dst[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
