// The device's arithmetic peak: every invocation runs `iters` rounds of 16 independent
// chains of vec4 fused multiply-adds in SCALAR (f32, or f16 where the adapter has it) and
// writes one value so the compiler keeps them: 128 FLOPs per round. The multiplier and
// addend come from the uniform, so nothing folds at compile time.

struct Params {
    iters: u32,
    mul: f32,
    add: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let id = gid.x;
    let m = vec4<SCALAR>(SCALAR(p.mul));
    let c = vec4<SCALAR>(SCALAR(p.add));
    var a: array<vec4<SCALAR>, 16>;
    for (var j = 0u; j < 16u; j++) {
        a[j] = vec4<SCALAR>(SCALAR(f32(id & 7u) * 0.001 + f32(j) * 0.01));
    }
    for (var i = 0u; i < p.iters; i++) {
        a[0] = fma(a[0], m, c);
        a[1] = fma(a[1], m, c);
        a[2] = fma(a[2], m, c);
        a[3] = fma(a[3], m, c);
        a[4] = fma(a[4], m, c);
        a[5] = fma(a[5], m, c);
        a[6] = fma(a[6], m, c);
        a[7] = fma(a[7], m, c);
        a[8] = fma(a[8], m, c);
        a[9] = fma(a[9], m, c);
        a[10] = fma(a[10], m, c);
        a[11] = fma(a[11], m, c);
        a[12] = fma(a[12], m, c);
        a[13] = fma(a[13], m, c);
        a[14] = fma(a[14], m, c);
        a[15] = fma(a[15], m, c);
    }
    var s = vec4<SCALAR>(SCALAR(0.0));
    for (var j = 0u; j < 16u; j++) {
        s += a[j];
    }
    out[id] = f32(s.x + s.y + s.z + s.w);
}
