//! Strata runtime.

pub mod engine;
pub mod sampling;
pub mod text;
