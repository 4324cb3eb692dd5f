//! The `.strata` parser against mutated files, on stable Rust in CI (the deep search is the
//! `strata_header` cargo-fuzz target in fuzz/): the fuzz seeds parse; random byte flips,
//! truncations and directory edits (numbers set to edge values, fields dropped or retyped)
//! of a valid file either parse, with every promise of a parsed header holding, or fail
//! with an error naming the file, and never panic.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use strata_formats::strata_file::{ALIGN, StoredKind, StrataHeader, StrataWriter, parse_header};
use strata_kernels::{PackedFormat, PackedMatrix};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-mutations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A valid file holding every kind: f32, bf16, packed bf16 / int8 / int4, a blob.
fn valid_file() -> Vec<u8> {
    // Tests run in parallel: one file each.
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = tmp(&format!(
        "valid-{}.strata",
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let w: Vec<f32> = (0..5 * 70).map(|i| (i % 13) as f32 / 7.0 - 0.9).collect();
    let mut wr = StrataWriter::create(&path).unwrap();
    wr.add_f32("norm", &[3], &[1.0, 2.0, 3.0]).unwrap();
    wr.add_bf16("emb", &[2, 2], &[half::bf16::from_f32(0.5); 4])
        .unwrap();
    for (name, fmt) in [
        ("a", PackedFormat::Bf16),
        ("b", PackedFormat::Int8 { group: None }),
        ("c", PackedFormat::Int4 { group: 32 }),
    ] {
        wr.add_packed(name, &PackedMatrix::pack(&w, 5, 70, fmt).unwrap())
            .unwrap();
    }
    wr.add_blob("tokenizer.json", b"{\"v\": 1}").unwrap();
    wr.finish(json!({"hidden_size": 4}), json!({"options": {}}))
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// Every promise of a parsed header, checked against the bytes it came from.
fn check(h: &StrataHeader, data: &[u8]) {
    let inside = |r: &std::ops::Range<usize>| {
        assert!(
            r.start <= r.end && r.end <= data.len(),
            "{r:?} of {}",
            data.len()
        );
        assert_eq!(r.start as u64 % ALIGN, 0, "{r:?}");
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
            StoredKind::Ggml(ty) => {
                assert_eq!(t.shape.len(), 2);
                let row = ty.row_bytes(t.shape[1] as u64).expect("whole blocks");
                assert_eq!(t.data.len() as u64, row * t.shape[0] as u64);
            }
        }
    }
    for (_, r) in &h.blobs {
        inside(r);
    }
}

fn directory(b: &[u8]) -> (usize, Value) {
    let off = u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
    (off, serde_json::from_slice(&b[off..off + len]).unwrap())
}

/// `b` with its directory replaced by `dir` (the header's length updated).
fn with_directory(b: &[u8], off: usize, dir: &Value) -> Vec<u8> {
    let json = serde_json::to_vec(dir).unwrap();
    let mut out = b[..off].to_vec();
    out.extend_from_slice(&json);
    out[24..32].copy_from_slice(&(json.len() as u64).to_le_bytes());
    out
}

/// Every number in `v` (depth first), as a JSON pointer.
fn numbers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Number(_) => out.push(at),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, x)| numbers(x, format!("{at}/{i}"), out)),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, x)| numbers(x, format!("{at}/{k}"), out)),
        _ => {}
    }
}

fn edit_directory(rng: &mut Rng, b: &[u8]) -> Vec<u8> {
    let (off, mut dir) = directory(b);
    let len = b.len() as u64;
    let edits = 1 + rng.below(3);
    for _ in 0..edits {
        let mut ptrs = Vec::new();
        numbers(&dir, String::new(), &mut ptrs);
        let edge = [
            0,
            1,
            2,
            31,
            32,
            63,
            64,
            65,
            len - 1,
            len,
            len + 64,
            1 << 31,
            1 << 32,
            (1 << 32) + 64,
            1 << 62,
            (1 << 63) - 64,
            u64::MAX / 2,
            u64::MAX - 63,
            u64::MAX,
        ];
        match rng.below(5) {
            4 => {
                // A packed tensor's row or column count, consistently in `shape` and
                // `packed`, so that the size checks behind the agreement are reached.
                let (t, d) = (2 + rng.below(3), rng.below(2));
                let v: Value = edge[rng.below(edge.len())].into();
                let n_or_k = ["n", "k"][d];
                for p in [
                    format!("/tensors/{t}/shape/{d}"),
                    format!("/tensors/{t}/packed/{n_or_k}"),
                ] {
                    if let Some(x) = dir.pointer_mut(&p) {
                        *x = v.clone();
                    }
                }
            }
            0 | 1 if !ptrs.is_empty() => {
                let p = &ptrs[rng.below(ptrs.len())];
                *dir.pointer_mut(p).unwrap() = edge[rng.below(edge.len())].into();
            }
            2 => {
                let t = rng.below(5);
                let key = ["name", "kind", "shape", "offset", "packed", "length"][rng.below(6)];
                if let Some(Value::Object(o)) = dir.pointer_mut(&format!("/tensors/{t}")) {
                    o.remove(key);
                }
            }
            _ => {
                let t = rng.below(5);
                let (key, v) = [
                    ("kind", json!("packed")),
                    ("kind", json!("bf16")),
                    ("kind", json!(7)),
                    ("name", json!("norm")),
                    ("shape", json!([])),
                    ("shape", json!([u64::MAX, 2])),
                    ("shape", json!([5, 70, 1])),
                    ("packed", json!({"format": "int4g0", "n": 1, "k": 1})),
                    ("packed", Value::Null),
                ][rng.below(9)]
                .clone();
                if let Some(Value::Object(o)) = dir.pointer_mut(&format!("/tensors/{t}")) {
                    o.insert(key.into(), v);
                }
            }
        }
    }
    with_directory(b, off, &dir)
}

fn mutate(rng: &mut Rng, good: &[u8]) -> Vec<u8> {
    let mut b = good.to_vec();
    match rng.below(4) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            // The fixed header: version, offsets, lengths.
            let i = 8 + rng.below(24);
            b[i] = rng.next() as u8;
        }
        2 => b.truncate(rng.below(b.len())),
        _ => b = edit_directory(rng, &b),
    }
    b
}

#[test]
fn fuzz_seeds_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/strata_header");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let b = std::fs::read(&p).unwrap();
        let h = parse_header(&p, &b).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        check(&h, &b);
        n += 1;
    }
    assert!(n >= 3, "{n} seeds in {}", dir.display());
}

#[test]
fn mutated_files_parse_or_fail_with_named_errors() {
    let good = valid_file();
    let path = Path::new("mutated.strata");
    check(&parse_header(path, &good).unwrap(), &good);
    let mut rng = Rng(0x5EED_CAFE);
    let (mut parsed, mut failed) = (0, 0);
    for i in 0..20_000 {
        let b = mutate(&mut rng, &good);
        let r = std::panic::catch_unwind(|| parse_header(path, &b));
        match r {
            Ok(Ok(h)) => {
                check(&h, &b);
                parsed += 1;
            }
            Ok(Err(e)) => {
                assert!(e.to_string().contains("mutated.strata"), "{e}");
                failed += 1;
            }
            Err(_) => {
                let keep = tmp(&format!("panic-{i}.strata"));
                std::fs::write(&keep, &b).unwrap();
                panic!("mutation {i} panicked; input kept at {}", keep.display());
            }
        }
    }
    println!("{parsed} parsed, {failed} failed");
    // Both outcomes are exercised: the mutations are neither all fatal nor all harmless.
    assert!(
        parsed > 500 && failed > 5000,
        "{parsed} parsed, {failed} failed"
    );
}

/// Regression: packed shapes whose element count fits in 64 bits but whose padded layout
/// does not (a huge row count with one column, or rows near `u64::MAX` with none) are size
/// errors, not an arithmetic overflow in the layout computation.
#[test]
fn packed_layouts_too_big_to_compute_are_errors() {
    let good = valid_file();
    let (off, dir) = directory(&good);
    for (t, n, k) in [
        (2, 1u64 << 62, 1u64),
        (3, 1 << 62, 1),
        (4, 1 << 62, 1),
        (4, u64::MAX, 0),
        (2, u64::MAX - 63, 0),
        (3, 0, u64::MAX),
        (4, 1, 1 << 62),
    ] {
        let mut d = dir.clone();
        d["tensors"][t]["shape"] = json!([n, k]);
        d["tensors"][t]["packed"]["n"] = n.into();
        d["tensors"][t]["packed"]["k"] = k.into();
        let b = with_directory(&good, off, &d);
        let name = d["tensors"][t]["name"].as_str().unwrap().to_owned();
        let e = parse_header(Path::new("huge.strata"), &b)
            .expect_err("cannot fit")
            .to_string();
        assert!(e.contains("huge.strata") && e.contains(&name), "{e}");
    }
}
