//! Strata runtime.

pub mod engine;
pub mod grammar;
pub mod sampling;
pub mod scheduler;
pub mod step;
pub mod text;
