//! The tokenizer built from GGUF metadata, on a committed vocab-only SentencePiece file
//! (tests/data/gguf/spm-tiny.gguf) against llama.cpp's ids (tests/reference/spm-tiny.json),
//! both from scripts/make_gguf_reference.py. The real byte-level BPE models are checked in
//! gguf_assets.rs.

use std::path::Path;

use strata_formats::gguf::{GgufFile, tokenizer};

fn spm_tiny() -> GgufFile {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/gguf/spm-tiny.gguf");
    GgufFile::open(Path::new(path)).unwrap()
}

#[test]
fn sentencepiece_vocabulary_matches_llama_cpp() {
    let g = spm_tiny();
    let special = tokenizer::special_tokens(&g);
    assert_eq!(
        (special.bos, special.eos, special.unk),
        (Some(1), Some(2), Some(0))
    );
    assert!(special.add_bos && !special.add_eos);
    assert_eq!(special.eog, vec![2]);
    let doc = tokenizer::tokenizer_json(&g).unwrap();
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&doc).unwrap()).unwrap();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/reference/spm-tiny.json"
    );
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = reference["tokenize"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got.get_ids(), &want[..], "{text:?}");
        if !text.contains("<s>") {
            // Byte fallback and the space prefix undo exactly.
            assert_eq!(tok.decode(&want, true).unwrap(), text, "decoding {want:?}");
        }
    }
}

#[test]
fn unsupported_vocabularies_are_errors() {
    // A file without tokenizer metadata.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/gguf_header/quant0.gguf"
    );
    let g = GgufFile::open(Path::new(path)).unwrap();
    let e = tokenizer::tokenizer_json(&g).unwrap_err().to_string();
    assert!(
        e.contains("quant0.gguf") && e.contains("tokenizer.ggml.model"),
        "{e}"
    );
    assert!(tokenizer::chat_template(&g).is_none());
    assert!(tokenizer::pre_tokenizer_regexes("no-such-pre").is_none());
    assert_eq!(
        tokenizer::pre_tokenizer_regexes("qwen2").unwrap().0.len(),
        1
    );
    assert_eq!(
        tokenizer::pre_tokenizer_regexes("smollm").unwrap().0.len(),
        2
    );
}
