//! The two real GGUF models (scripts/fetch_assets.sh): metadata, tensors, dequantized values
//! against gguf-py, and the tokenizer built from metadata against llama.cpp's token ids
//! (tests/reference/*.json, from scripts/make_gguf_reference.py).
//!
//! These run when `STRATA_REAL_ASSETS=1` (as `scripts/test.sh` and CI set it), reading
//! `$STRATA_ASSETS` (default `.cache/assets` in the repository), and fail if the files are
//! missing; otherwise they pass after printing that they were skipped.

use std::path::PathBuf;

use strata_formats::gguf::{GgmlType, GgufFile, tokenizer};

const SMOL: &str = "smollm2-135m-instruct-q4_1";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

fn asset(model: &str) -> Option<GgufFile> {
    if std::env::var("STRATA_REAL_ASSETS").as_deref() != Ok("1") {
        eprintln!("STRATA_REAL_ASSETS is not 1: skipping the real-model test for {model}");
        return None;
    }
    let dir = std::env::var_os("STRATA_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cache/assets"))
        });
    let path = dir.join(format!("{model}.gguf"));
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{e:#} (run scripts/fetch_assets.sh)")))
}

fn reference(model: &str) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/reference/");
    let text = std::fs::read_to_string(format!("{path}{model}.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn type_counts(g: &GgufFile) -> Vec<(GgmlType, usize)> {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for t in g.tensors() {
        match counts.iter_mut().find(|(ty, _)| *ty == t.ggml_type) {
            Some((_, n)) => *n += 1,
            None => counts.push((t.ggml_type, 1)),
        }
    }
    counts.sort_by_key(|&(ty, _)| ty.id());
    counts
}

/// Checks the first values and the f64 sums of a tensor against gguf-py's dequantization.
fn check_tensor(g: &GgufFile, name: &str, ty: GgmlType, first: [f64; 4], sum: f64, abs: f64) {
    let t = g.tensor(name).unwrap();
    assert_eq!(t.ggml_type, ty, "{name}");
    let v = g.tensor_to_f32(name).unwrap();
    for (a, b) in v.iter().zip(first) {
        assert!(
            (*a as f64 - b).abs() <= 1e-7 * b.abs(),
            "{name}: {:?} vs {first:?}",
            &v[..4]
        );
    }
    let s: f64 = v.iter().map(|&x| x as f64).sum();
    let a: f64 = v.iter().map(|&x| (x as f64).abs()).sum();
    assert!(
        (s - sum).abs() < 1e-3 * abs / 1e3 + 1e-3,
        "{name}: sum {s} vs {sum}"
    );
    assert!((a - abs).abs() < 1e-6 * abs, "{name}: abs sum {a} vs {abs}");
}

#[test]
fn smollm2_metadata_and_tensors() {
    let Some(g) = asset(SMOL) else { return };
    assert_eq!((g.version(), g.alignment()), (3, 32));
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.metadata_entries().len(), 33);
    assert_eq!(g.get_u32("llama.block_count"), Some(30));
    assert_eq!(g.get_u32("llama.embedding_length"), Some(576));
    assert_eq!(g.get_u32("llama.attention.head_count"), Some(9));
    assert_eq!(g.get_u32("llama.attention.head_count_kv"), Some(3));
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(
        type_counts(&g),
        vec![
            (GgmlType::F32, 61),
            (GgmlType::Q4_1, 210),
            (GgmlType::Q8_0, 1)
        ]
    );
    assert_eq!(
        g.tensor("token_embd.weight").unwrap().dims,
        vec![576, 49152]
    );
    assert!(g.tensor("output.weight").is_err(), "tied embeddings");
    check_tensor(
        &g,
        "token_embd.weight",
        GgmlType::Q8_0,
        [-0.10654449, 0.032978058, 0.0481987, -0.022830963],
        -15353.044494,
        2802153.619806,
    );
    check_tensor(
        &g,
        "blk.0.ffn_down.weight",
        GgmlType::Q4_1,
        [-0.33081055, 0.34606934, 0.07531738, -0.46618652],
        150.635773,
        128458.062866,
    );
    check_tensor(
        &g,
        "blk.0.attn_norm.weight",
        GgmlType::F32,
        [0.013977051, 0.023803711, -0.019775391, -0.030273438],
        0.612944,
        15.815359,
    );
}

#[test]
fn qwen25_metadata_and_tensors() {
    let Some(g) = asset(QWEN) else { return };
    assert_eq!(g.architecture(), Some("qwen2"));
    assert_eq!((g.tensors().len(), g.metadata_entries().len()), (291, 26));
    assert_eq!(g.get_u32("qwen2.context_length"), Some(32768));
    assert_eq!(g.get_f32("qwen2.rope.freq_base"), Some(1_000_000.0));
    assert_eq!(
        type_counts(&g),
        vec![
            (GgmlType::F32, 121),
            (GgmlType::Q5_0, 133),
            (GgmlType::Q8_0, 13),
            (GgmlType::Q4_K, 12),
            (GgmlType::Q6_K, 12),
        ]
    );
    check_tensor(
        &g,
        "blk.0.ffn_down.weight",
        GgmlType::Q6_K,
        [-0.0018410683, -0.0018410683, 0.029457092, 0.009205341],
        27.406932,
        43436.011611,
    );
    check_tensor(
        &g,
        "blk.2.ffn_down.weight",
        GgmlType::Q4_K,
        [-0.002699852, -0.00068783760, 0.0006535053, -0.0020291805],
        -13.457203,
        14452.168261,
    );
    check_tensor(
        &g,
        "blk.0.attn_q.weight",
        GgmlType::Q5_0,
        [-0.010841370, -0.021682739, 0.0040655136, 0.0054206848],
        -40.741597,
        23411.351831,
    );
    check_tensor(
        &g,
        "blk.0.attn_v.weight",
        GgmlType::Q8_0,
        [0.009490013, 0.011263847, 0.00931263, 0.00044345856],
        -0.752055,
        735.560243,
    );
}

/// Token ids of the tokenizer built from metadata equal llama.cpp's on every reference text,
/// and decoding gives the text back.
fn check_tokenizer(model: &str) {
    let Some(g) = asset(model) else { return };
    let doc = tokenizer::tokenizer_json(&g).unwrap();
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&doc).unwrap()).unwrap();
    let reference = reference(model);
    let special = tokenizer::special_tokens(&g);
    assert_eq!(special.add_bos, reference["add_bos"].as_bool().unwrap());
    let eos = special.eos.unwrap();
    assert!(
        special.eog.contains(&eos),
        "{model}: eos {eos} not in {:?}",
        special.eog
    );
    let eog_text: Vec<String> = special
        .eog
        .iter()
        .map(|&i| tok.id_to_token(i).unwrap())
        .collect();
    assert!(
        eog_text.contains(&"<|im_end|>".to_string())
            && eog_text.contains(&"<|endoftext|>".to_string()),
        "{model}: {eog_text:?}"
    );
    assert!(
        tokenizer::chat_template(&g)
            .unwrap()
            .contains("<|im_start|>")
    );
    let cases = reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .chain(reference["tokenize"].as_array().unwrap());
    let mut n = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got.get_ids(), &want[..], "{model}: {text:?}");
        let back = tok.decode(&want, false).unwrap();
        assert_eq!(back, text, "{model}: decoding");
        n += 1;
    }
    assert!(n >= 15, "{model}: only {n} reference texts");
}

#[test]
fn smollm2_tokenizer_matches_llama_cpp() {
    check_tokenizer(SMOL);
}

#[test]
fn qwen25_tokenizer_matches_llama_cpp() {
    check_tokenizer(QWEN);
}
