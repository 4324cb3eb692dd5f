//! Fuzzes the GGUF header parser: any input must parse or fail with an error, never panic,
//! and a parsed header's promises (tensor data inside the input, whole blocks) must hold.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use strata_formats::gguf::{dequantize_row, parse_header};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse_header(Path::new("fuzz.gguf"), data) else {
        return;
    };
    for t in h.tensors() {
        let start = (h.data_offset() + t.offset) as usize;
        let bytes = &data[start..start + t.n_bytes as usize];
        assert_eq!(t.offset % h.alignment(), 0);
        // Dequantize the first row when it is small enough to be cheap.
        let row = t.row_len() as usize;
        if t.ggml_type.can_dequantize() && row <= 4096 && t.n_rows() > 0 {
            let mut out = vec![0f32; row];
            dequantize_row(t.ggml_type, &bytes[..t.row_bytes() as usize], &mut out)
                .expect("a validated row dequantizes");
        }
    }
    for (_, v) in h.metadata_entries() {
        let _ = (v.as_u32(), v.as_f32(), v.as_str(), v.type_name());
    }
});
