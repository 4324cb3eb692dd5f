//! The `strata` command line.
fn main() {}
