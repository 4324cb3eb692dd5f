// The uniform words and bindings both attention kernels take (attention.wgsl,
// attention_tiles.wgsl; `dispatch_attention` builds them once): prepended to each.
struct P {
    n_tokens: u32, start_pos: u32, n_heads: u32, n_kv_heads: u32,
    hd: u32, window: u32, scale: f32, span: u32,
    splits: u32, merge: u32, _a: u32, _b: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<f32>;
// The caches, f32 or f16 (WTYPE): element i through load_word.
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
