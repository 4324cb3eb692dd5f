//! Fuzzes the `.strata` header and directory parser: any input must parse or fail with an
//! error, never panic, and a parsed header's promises (every range inside the input and
//! 64-byte aligned, sizes matching kinds and shapes, names unique) must hold.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use strata_formats::strata_file::{ALIGN, StoredKind, parse_header};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse_header(Path::new("fuzz.strata"), data) else {
        return;
    };
    let inside = |r: &std::ops::Range<usize>| {
        assert!(r.start <= r.end && r.end <= data.len(), "{r:?} of {}", data.len());
        assert_eq!(r.start as u64 % ALIGN, 0);
    };
    let mut names = HashSet::new();
    for t in &h.tensors {
        assert!(names.insert(&t.name), "{} twice", t.name);
        inside(&t.data);
        let numel: usize = t.shape.iter().product();
        match t.kind {
            StoredKind::F32 => assert_eq!(t.data.len(), numel * 4),
            StoredKind::Bf16 => assert_eq!(t.data.len(), numel * 2),
            StoredKind::Packed(_) => {
                inside(&t.scales);
                assert_eq!(t.shape.len(), 2);
            }
        }
    }
    for (_, r) in &h.blobs {
        inside(r);
    }
});
