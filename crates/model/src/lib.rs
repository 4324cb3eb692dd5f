//! Model architectures for Strata.
