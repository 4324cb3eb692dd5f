//! Strata runtime.
