// The device's arithmetic peak: every invocation runs `iters` rounds of 16 independent
// chains of vec4 fused multiply-adds in SCALAR (f32, or f16 where the adapter has it) and
// writes one value so the compiler keeps them: 128 FLOPs per round. The multiplier and
// addend come from the uniform, so nothing folds at compile time; the chains are named
// variables, not an array, so they stay in registers.

struct Params {
    iters: u32,
    mul: f32,
    add: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = vec4<SCALAR>(SCALAR(p.mul));
    let c = vec4<SCALAR>(SCALAR(p.add));
    let seed = SCALAR(f32(gid.x & 7u) * 0.001);
    var a0 = vec4<SCALAR>(seed + SCALAR(0.00));
    var a1 = vec4<SCALAR>(seed + SCALAR(0.01));
    var a2 = vec4<SCALAR>(seed + SCALAR(0.02));
    var a3 = vec4<SCALAR>(seed + SCALAR(0.03));
    var a4 = vec4<SCALAR>(seed + SCALAR(0.04));
    var a5 = vec4<SCALAR>(seed + SCALAR(0.05));
    var a6 = vec4<SCALAR>(seed + SCALAR(0.06));
    var a7 = vec4<SCALAR>(seed + SCALAR(0.07));
    var a8 = vec4<SCALAR>(seed + SCALAR(0.08));
    var a9 = vec4<SCALAR>(seed + SCALAR(0.09));
    var a10 = vec4<SCALAR>(seed + SCALAR(0.10));
    var a11 = vec4<SCALAR>(seed + SCALAR(0.11));
    var a12 = vec4<SCALAR>(seed + SCALAR(0.12));
    var a13 = vec4<SCALAR>(seed + SCALAR(0.13));
    var a14 = vec4<SCALAR>(seed + SCALAR(0.14));
    var a15 = vec4<SCALAR>(seed + SCALAR(0.15));
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, c);
        a1 = fma(a1, m, c);
        a2 = fma(a2, m, c);
        a3 = fma(a3, m, c);
        a4 = fma(a4, m, c);
        a5 = fma(a5, m, c);
        a6 = fma(a6, m, c);
        a7 = fma(a7, m, c);
        a8 = fma(a8, m, c);
        a9 = fma(a9, m, c);
        a10 = fma(a10, m, c);
        a11 = fma(a11, m, c);
        a12 = fma(a12, m, c);
        a13 = fma(a13, m, c);
        a14 = fma(a14, m, c);
        a15 = fma(a15, m, c);
    }
    let s = (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7) + (a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15);
    out[gid.x] = f32(s.x + s.y + s.z + s.w);
}
