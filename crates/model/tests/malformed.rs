//! Malformed checkpoints and configs fail with an error naming the file and the problem,
//! never a panic. Each case corrupts a copy of a good fixture.

use std::path::{Path, PathBuf};

use strata_model::{Model, Precision};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_moe")
}

/// A fresh copy of the fixture in a temporary directory.
fn copy_fixture(case: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-malformed-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    dir
}

fn header(bytes: &[u8]) -> (usize, serde_json::Map<String, serde_json::Value>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (n, serde_json::from_slice(&bytes[8..8 + n]).unwrap())
}

fn with_header(
    bytes: &[u8],
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Vec<u8> {
    let (n, mut h) = header(bytes);
    edit(&mut h);
    let mut json = serde_json::to_vec(&h).unwrap();
    // Keep the data section where it was by padding the header to its old length.
    assert!(json.len() <= n, "edited header grew");
    json.resize(n, b' ');
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// Loads `dir` and checks the error mentions every `want` fragment.
fn check(dir: &Path, want: &[&str]) {
    let err = Model::load_dir(dir, Precision::F32)
        .expect_err("load should fail")
        .to_string();
    for w in want {
        assert!(err.contains(w), "error `{err}` should mention `{w}`");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

fn edit_safetensors(dir: &Path, f: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, f(bytes)).unwrap();
}

#[test]
fn truncated_safetensors() {
    let dir = copy_fixture("truncated");
    edit_safetensors(&dir, |b| b[..b.len() / 2].to_vec());
    check(&dir, &["model.safetensors", "out of range"]);
}

#[test]
fn truncated_header() {
    let dir = copy_fixture("truncated-header");
    edit_safetensors(&dir, |b| b[..100].to_vec());
    check(&dir, &["model.safetensors", "truncated"]);
}

#[test]
fn offsets_out_of_range() {
    let dir = copy_fixture("offsets");
    edit_safetensors(&dir, |b| {
        with_header(&b, |h| {
            let t = h.get_mut("model.norm.weight").unwrap();
            t["data_offsets"] = serde_json::json!([0, 1u64 << 40]);
        })
    });
    check(
        &dir,
        &["model.safetensors", "model.norm.weight", "out of range"],
    );
}

#[test]
fn dtype_mismatch() {
    let dir = copy_fixture("dtype");
    edit_safetensors(&dir, |b| {
        with_header(&b, |h| {
            h.get_mut("model.norm.weight").unwrap()["dtype"] = serde_json::json!("BF16");
        })
    });
    check(&dir, &["model.safetensors", "model.norm.weight", "BF16"]);
}

#[test]
fn shape_mismatch() {
    let dir = copy_fixture("shape");
    edit_safetensors(&dir, |b| {
        with_header(&b, |h| {
            // Same byte count, wrong shape: [40] -> [2, 20].
            h.get_mut("model.norm.weight").unwrap()["shape"] = serde_json::json!([2, 20]);
        })
    });
    check(
        &dir,
        &[
            "model.safetensors",
            "model.norm.weight",
            "expected [40]",
            "[2, 20]",
        ],
    );
}

#[test]
fn missing_tensor() {
    let dir = copy_fixture("missing");
    edit_safetensors(&dir, |b| {
        with_header(&b, |h| {
            let v = h.remove("model.layers.0.self_attn.q_proj.weight").unwrap();
            h.insert("renamed.q_proj.weight".into(), v);
        })
    });
    check(
        &dir,
        &["missing tensor", "model.layers.0.self_attn.q_proj.weight"],
    );
}

#[test]
fn broken_config() {
    let dir = copy_fixture("config-json");
    std::fs::write(dir.join("config.json"), "{\"hidden_size\": 40,").unwrap();
    check(&dir, &["config.json", "invalid config JSON"]);

    let dir = copy_fixture("config-field");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("num_hidden_layers");
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    check(&dir, &["config.json", "num_hidden_layers"]);

    let dir = copy_fixture("config-unsupported");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["hidden_act"] = serde_json::json!("gelu");
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    check(&dir, &["config.json", "hidden_act", "gelu"]);

    let dir = copy_fixture("config-rope");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["rope_parameters"] = serde_json::json!({"rope_type": "longrope", "rope_theta": 10000.0});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    check(&dir, &["config.json", "rope_type", "longrope"]);
}

#[test]
fn out_of_range_token_is_an_error() {
    let model = Model::load_dir(&fixture(), Precision::F32).unwrap();
    let mut cache = model.new_cache();
    let mut seqs = [strata_model::SeqInput {
        tokens: &[1, 100_000],
        cache: &mut cache,
        logits: strata_model::LogitsWanted::All,
    }];
    let err = model.forward(&mut seqs).unwrap_err().to_string();
    assert!(err.contains("100000"), "{err}");
}

/// The KV cache holds memory for the sequence's own length (whole blocks), and gives it
/// back when the sequence is rewound.
#[test]
fn kv_cache_grows_in_blocks_and_shrinks_on_truncate() {
    let model = Model::load_dir(&fixture(), Precision::F32).unwrap();
    let mut cache = model.new_cache();
    let per_pos: usize = cache.widths().iter().map(|(a, b)| (a + b) * 4).sum();
    let tokens: Vec<u32> = (0..40).collect();
    let mut seqs = [strata_model::SeqInput {
        tokens: &tokens,
        cache: &mut cache,
        logits: strata_model::LogitsWanted::None,
    }];
    model.forward(&mut seqs).unwrap();
    // 40 positions occupy three blocks of 16.
    assert_eq!(cache.bytes(), 48 * per_pos);
    cache.truncate(10);
    assert_eq!(cache.len(), 10);
    assert_eq!(cache.bytes(), 16 * per_pos);
}
