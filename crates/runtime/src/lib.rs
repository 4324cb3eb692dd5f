//! Strata runtime.

pub mod engine;
pub mod sampling;
pub mod scheduler;
pub mod step;
pub mod text;
