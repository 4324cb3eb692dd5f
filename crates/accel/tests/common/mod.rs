//! Shared by the GPU tests: opening a device (or skipping), transfers, a seeded RNG.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::sync::Arc;

use strata_accel::{Buffer, Device, DeviceOptions};

/// Opens the first device, or returns `None` with a notice when none is usable; with
/// `STRATA_GPU_TESTS=1` a missing device fails the test instead (CI installs lavapipe).
pub fn gpu(opts: DeviceOptions) -> Option<Arc<dyn Device>> {
    match strata_accel::open(&opts) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("STRATA_GPU_TESTS").as_deref() == Ok("1") => {
            panic!("STRATA_GPU_TESTS=1 but no GPU device: {e}")
        }
        Err(e) => {
            eprintln!("skipping GPU test: {e} (set STRATA_GPU_TESTS=1 to make this a failure)");
            None
        }
    }
}

/// A device with default options.
pub fn default_gpu() -> Option<Arc<dyn Device>> {
    gpu(DeviceOptions::default())
}

/// Uploads f32 values to a new buffer.
pub fn up(dev: &dyn Device, v: &[f32]) -> Buffer {
    let b = dev.alloc(v.len() as u64 * 4, 0, "test").unwrap();
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    dev.upload(&b, 0, &bytes).unwrap();
    b
}

/// Uploads u32 values to a new buffer.
pub fn up_u32(dev: &dyn Device, v: &[u32]) -> Buffer {
    let b = dev.alloc(v.len() as u64 * 4, 0, "test").unwrap();
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    dev.upload(&b, 0, &bytes).unwrap();
    b
}

/// Reads `n` f32 values.
pub fn down(dev: &dyn Device, b: &Buffer, n: usize) -> Vec<f32> {
    dev.download(b, 0, n as u64 * 4)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads `n` u32 values.
pub fn down_u32(dev: &dyn Device, b: &Buffer, n: usize) -> Vec<u32> {
    dev.download(b, 0, n as u64 * 4)
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// xorshift64*: reproducible values in [-1, 1).
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next value in [-1, 1).
    pub fn f(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        v as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// `n` values.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

/// Largest absolute difference, relative to the largest reference magnitude (at least 1).
pub fn max_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}
