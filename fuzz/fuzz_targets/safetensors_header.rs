//! Fuzzes the safetensors header parser: any input must parse or fail with an error, never
//! panic, and parsed byte ranges must lie inside the input.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use strata_formats::safetensors::parse_header;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = parse_header(Path::new("fuzz.safetensors"), data) {
        for (_, _, _, range) in tensors {
            assert!(range.start <= range.end && range.end <= data.len());
        }
    }
});
