//! Strata runtime.

pub mod sampling;
pub mod text;
