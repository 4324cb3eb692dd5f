//! Converted models (`.strata`): every committed fixture, converted with the loader's
//! recording and loaded back by mapping, gives logits bit-identical to the source loaded
//! with the same options; broken converted files fail with named errors.

use std::path::{Path, PathBuf};

use serde_json::json;
use strata_kernels::PackedFormat;
use strata_model::experts::ExpertSet;
use strata_model::linear::write_converted;
use strata_model::model::open;
use strata_model::moe::Ffn;
use strata_model::source::Source;
use strata_model::{KvCache, LoadOptions, LogitsWanted, Model, Precision, SeqInput};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-converted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Logits at every position of two sequences run as one batch, then one decode step.
fn logits(m: &Model) -> Vec<Vec<f32>> {
    let v = m.config.vocab_size as u32;
    let a: Vec<u32> = (0..7).map(|i| (i * 37 + 3) % v).collect();
    let b: Vec<u32> = (0..4).map(|i| (i * 11 + 5) % v).collect();
    let (mut ca, mut cb): (KvCache, KvCache) = (m.new_cache(), m.new_cache());
    let mut seqs = [
        SeqInput {
            tokens: &a,
            cache: &mut ca,
            logits: LogitsWanted::All,
        },
        SeqInput {
            tokens: &b,
            cache: &mut cb,
            logits: LogitsWanted::All,
        },
    ];
    let mut out = m.forward(&mut seqs).expect("forward");
    let next = [1 % v];
    let mut step = [SeqInput {
        tokens: &next,
        cache: &mut ca,
        logits: LogitsWanted::Last,
    }];
    out.extend(m.forward(&mut step).expect("decode"));
    out
}

/// Converts `src` with `opts` to `out`, returning the source model built while recording.
fn convert(src: &Path, opts: LoadOptions, out: &Path) -> Model {
    let (config, source) = open(src).expect("source opens");
    let (model, rec) = Model::convert(config.clone(), &source, opts).expect("converts");
    write_converted(out, &config, opts, &rec, &[], json!({})).expect("writes");
    model
}

fn check(src: &Path, opts: LoadOptions) {
    let out = tmp(&format!(
        "{}-{:?}-{}.strata",
        src.file_name().unwrap().to_string_lossy(),
        opts.precision,
        opts.experts.name()
    ));
    let recorded = convert(src, opts, &out);
    let plain = Model::load(src, opts).expect("source loads");
    // Ask for other options: a converted model keeps the ones it was made with.
    let mapped = Model::load(&out, LoadOptions::new(Precision::Fast)).expect("converted loads");
    assert_eq!(mapped.config, plain.config, "{}", src.display());
    assert_eq!(mapped.precision(), opts.precision);
    let want = logits(&plain);
    assert_eq!(
        logits(&recorded),
        want,
        "{}: recording changed the model",
        src.display()
    );
    assert_eq!(logits(&mapped), want, "{} {opts:?}", src.display());
    assert_eq!(
        mapped.param_counts(),
        plain.param_counts(),
        "{}",
        src.display()
    );
    std::fs::remove_file(&out).expect("removes");
}

#[test]
fn every_fixture_converts_bit_identically() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("tests/fixtures"))
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(root().join("tests/fixtures-gguf"))
        .expect("gguf fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    ggufs.sort();
    assert!(dirs.len() >= 10 && ggufs.len() >= 10);
    for src in dirs.iter().chain(&ggufs) {
        check(src, LoadOptions::new(Precision::Fast));
    }
    let int4 = LoadOptions {
        precision: Precision::Fast,
        experts: PackedFormat::Int4 { group: 32 },
        keep_blocks: false,
    };
    for name in [
        "tests/fixtures/qwen3_moe",
        "tests/fixtures-gguf/deepseek_v3.gguf",
    ] {
        check(&root().join(name), int4);
        check(&root().join(name), LoadOptions::new(Precision::F32));
    }
}

#[test]
fn tiny_moe_converts_to_a_directory_and_maps_its_weights() {
    let src = root().join("models/strata-tiny-moe");
    let dir = tmp("tiny-dir");
    std::fs::create_dir_all(&dir).expect("dir");
    let opts = LoadOptions {
        precision: Precision::Fast,
        experts: PackedFormat::Int8 { group: None },
        keep_blocks: false,
    };
    convert(&src, opts, &dir.join(strata_model::model::STRATA_FILE));
    let (_, source) = open(&dir).expect("the directory opens");
    let Source::Strata(f) = &source else {
        panic!("expected a converted source, got {source:?}")
    };
    assert!(
        f.tensors()
            .iter()
            .any(|t| t.name.ends_with(".experts.0.gate_up"))
    );
    let plain = Model::load(&src, opts).expect("source loads");
    let mapped = Model::load(&dir, opts).expect("converted loads");
    assert_eq!(logits(&mapped), logits(&plain));
    // The experts are used in place, not repacked.
    let moe = mapped
        .layers()
        .iter()
        .find_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense(_) => None,
        })
        .expect("a MoE layer");
    let ExpertSet::Packed(p) = &moe.experts else {
        panic!("experts should be packed")
    };
    assert!(
        p.experts()
            .iter()
            .all(|e| e.parts().0.is_mapped() && e.parts().1.is_mapped())
    );
    std::fs::remove_dir_all(&dir).expect("removes");
}

fn load_err(path: &Path) -> String {
    Model::load(path, LoadOptions::new(Precision::Fast))
        .expect_err("must fail")
        .to_string()
}

#[test]
fn broken_converted_files_are_named_errors() {
    let good = tmp("good.strata");
    convert(
        &root().join("tests/fixtures/qwen3_moe"),
        LoadOptions::new(Precision::Fast),
        &good,
    );
    let bytes = std::fs::read(&good).expect("reads");
    let layout = strata_kernels::packed::LAYOUT_VERSION + 1;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated.strata",
            bytes[..bytes.len() / 2].to_vec(),
            "outside the file",
        ),
        ("header.strata", bytes[..20].to_vec(), "truncated"),
        (
            "layout.strata",
            [&bytes[..12], &layout.to_le_bytes()[..], &bytes[16..]].concat(),
            "re-run `strata convert`",
        ),
    ];
    for (name, b, want) in cases {
        let p = tmp(name);
        std::fs::write(&p, b).expect("writes");
        let e = load_err(&p);
        assert!(e.contains(want) && e.contains(name), "{name}: {e}");
    }
    let p = tmp("magic.strata");
    std::fs::write(&p, [b"STRATB".as_slice(), &bytes[6..]].concat()).expect("writes");
    let e = load_err(&p);
    assert!(
        e.contains("magic.strata") && e.contains("not a .strata file"),
        "{e}"
    );
    // A tensor the model needs, missing from the file: named.
    let (off, len) = (
        u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize,
        u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize,
    );
    let mut dir: serde_json::Value = serde_json::from_slice(&bytes[off..off + len]).unwrap();
    let tensors = dir["tensors"].as_array_mut().unwrap();
    let i = tensors
        .iter()
        .position(|t| t["name"] == "model.norm.weight")
        .expect("norm stored");
    tensors.remove(i);
    let json = serde_json::to_vec(&dir).unwrap();
    let mut b = bytes[..off].to_vec();
    b.extend_from_slice(&json);
    b[24..32].copy_from_slice(&(json.len() as u64).to_le_bytes());
    let p = tmp("missing.strata");
    std::fs::write(&p, b).expect("writes");
    let e = load_err(&p);
    assert!(
        e.contains("model.norm.weight") && e.contains("missing.strata"),
        "{e}"
    );
}
