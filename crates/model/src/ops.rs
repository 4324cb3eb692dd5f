//! Small row-wise operations of the forward pass: RMSNorm, SiLU·up, softmax, residual add.

/// RMSNorm of every `w.len()`-wide row of `x`, in place: `x · w / sqrt(mean(x²) + eps)`.
/// A prompt's rows go in parallel tasks of [`ROWS_PER_TASK`], each row's squares summed in
/// sixteen lanes: one chain of adds per row on the calling thread alone was 3% of a 512-token
/// prefill while the other cores waited (2026-12-01).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    if d == 0 {
        return;
    }
    strata_kernels::parallel_chunks_mut(x, ROWS_PER_TASK * d, |_, rows| {
        for row in rows.chunks_exact_mut(d) {
            let inv = 1.0 / (sum_of_squares(row) / d as f32 + eps).sqrt();
            for (v, g) in row.iter_mut().zip(w) {
                *v = *v * inv * g;
            }
        }
    });
}

/// Rows per task of the row-wise steps of a prompt.
pub(crate) const ROWS_PER_TASK: usize = 16;

/// `Σ v²` in sixteen lanes (value `i` into lane `i % 16`), the lanes added in order, then the
/// rest: a loop that vectorises, with the same bits on every machine.
fn sum_of_squares(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v * v;
        }
    }
    let sum = lanes.iter().sum::<f32>();
    chunks.remainder().iter().fold(sum, |s, v| s + v * v)
}

/// `gate[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// `x += y`.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Logistic sigmoid.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Runs `f(i)` for `i < n` on the kernel thread pool and collects the results in order.
pub fn parallel_map<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        (0..n).map(|_| std::sync::Mutex::new(None)).collect();
    strata_kernels::parallel_for(n, |i| {
        let r = f(i);
        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("parallel_for runs every task")
        })
        .collect()
}
