//! Shared by the executor's GPU tests: opening a device, or skipping loudly.

use std::sync::Arc;

use strata_accel::{Device, DeviceOptions};

/// Opens the first device, or returns `None` with a notice on stderr when none is usable;
/// with `STRATA_GPU_TESTS=1` a missing device fails the test instead (CI installs lavapipe).
pub fn default_gpu() -> Option<Arc<dyn Device>> {
    match strata_accel::open(&DeviceOptions::default()) {
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
