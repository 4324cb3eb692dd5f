//! Accelerators for Strata: one device/buffer/queue interface ([`Device`]) and a wgpu
//! backend (Vulkan; Metal and DX12 through features) with WGSL kernels for every part of a
//! decoder layer.
//!
//! Entry points: [`devices`] lists what this build can use, [`open`] opens one as a
//! `dyn Device`; [`Device::enqueue`] runs an [`Op`] on buffers it allocated.
//!
//! This crate knows nothing of models or checkpoints: it computes ops on buffers, the way
//! ggml's backends do. What puts a model on a device (`strata_exec::GpuModel`, the hybrid
//! executor's expert cache) lives above it.
//!
//! A key design decision made in this crate is that a backend that is not compiled in, or
//! that finds no adapter, is an error value naming what is missing ([`Error::NotCompiledWith`],
//! [`Error::NoAdapter`]), never a `cfg` the callers must repeat nor a panic: `strata` builds
//! and runs the same with or without a GPU.
//!
//! ```
//! use strata_accel::{DeviceOptions, Error, Op};
//!
//! let dev = match strata_accel::open(&DeviceOptions::default()) {
//!     Ok(dev) => dev,
//!     Err(e @ (Error::NotCompiledWith { .. } | Error::NoAdapter { .. })) => {
//!         println!("no accelerator here: {e}");
//!         return Ok(());
//!     }
//!     Err(e) => return Err(e),
//! };
//! // RMSNorm of two rows of four f32 values, with gain `w`.
//! let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
//! let (x, w, out) = (dev.alloc(32, 0, "x")?, dev.alloc(16, 0, "w")?, dev.alloc(32, 0, "out")?);
//! dev.upload(&x, 0, &bytes(&[1.0, -1.0, 1.0, -1.0, 2.0, 2.0, 2.0, 2.0]))?;
//! dev.upload(&w, 0, &bytes(&[1.0, 2.0, 3.0, 4.0]))?;
//! dev.enqueue(&Op::RmsNorm { x: &x, residual: None, w: &w, out: &out, rows: 2, dim: 4, eps: 0.0 })?;
//! dev.synchronize()?;
//! let y: Vec<f32> = dev
//!     .download(&out, 0, 32)?
//!     .chunks_exact(4)
//!     .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
//!     .collect();
//! // Both rows have an RMS of their first value's magnitude (1 and 2).
//! let want = [1.0, -2.0, 3.0, -4.0, 1.0, 2.0, 3.0, 4.0];
//! assert!(y.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-5), "{y:?}");
//! # Ok::<(), strata_accel::Error>(())
//! ```
#![deny(missing_docs)]

mod device;
mod error;
mod expert;
mod profile;
mod wtype;

#[cfg(feature = "wgpu")]
mod backend {
    pub mod wgpu;
}

use std::sync::Arc;

pub use device::{
    Buffer, CacheWrite, Device, DeviceInfo, DeviceOptions, Event, ExpertFormat, ExpertSlots,
    MOE_GROUP_MAX_EXPERTS, MemoryUse, Op, OpKind, RawBuffer, Readback, RopeKind, TopKParams,
    WeightType,
};
pub use error::{Error, Result};
pub use profile::{KernelTime, KernelTimes, Traffic};

/// Every accelerator this build can use.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    #[cfg(feature = "wgpu")]
    {
        backend::wgpu::enumerate()
    }
    #[cfg(not(feature = "wgpu"))]
    {
        Err(Error::NotCompiledWith {
            backend: "wgpu",
            feature: "strata-accel/wgpu",
        })
    }
}

/// Opens the accelerator `opts.index`.
pub fn open(opts: &DeviceOptions) -> Result<Arc<dyn Device>> {
    #[cfg(feature = "wgpu")]
    {
        Ok(Arc::new(backend::wgpu::WgpuDevice::open(opts)?))
    }
    #[cfg(not(feature = "wgpu"))]
    {
        let _ = opts;
        Err(Error::NotCompiledWith {
            backend: "wgpu",
            feature: "strata-accel/wgpu",
        })
    }
}

/// Parses a byte size: `512M`, `8G`, `1.5GiB`, `1000000` (bytes).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(Error::Shape {
                op: "byte size",
                message: format!("`{s}`: unknown unit, expected B, K, M, G or T"),
            });
        }
    };
    let v: f64 = num.parse().map_err(|_| Error::Shape {
        op: "byte size",
        message: format!("`{s}` is not a number with an optional unit (e.g. 8G)"),
    })?;
    Ok((v * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_backend_or_adapter_is_an_error_naming_it() {
        match open(&DeviceOptions::default()) {
            Ok(dev) => assert!(!dev.info().ops.is_empty()),
            Err(e @ (Error::NotCompiledWith { .. } | Error::NoAdapter { .. })) => {
                let msg = e.to_string();
                assert!(msg.contains("wgpu") || msg.contains("Vulkan"), "{msg}");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        #[cfg(not(feature = "wgpu"))]
        assert!(matches!(devices(), Err(Error::NotCompiledWith { .. })));
    }
}
