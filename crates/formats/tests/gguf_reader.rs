//! GGUF reader: synthetic files built byte by byte, valid and hostile.

use std::path::{Path, PathBuf};

use strata_formats::Error;
use strata_formats::gguf::{GgmlType, GgufFile, MAX_DIMS, Value, parse_header};

/// GGUF value type ids.
const U8: u32 = 0;
const I8: u32 = 1;
const U16: u32 = 2;
const I16: u32 = 3;
const U32: u32 = 4;
const I32: u32 = 5;
const F32: u32 = 6;
const BOOL: u32 = 7;
const STR: u32 = 8;
const ARR: u32 = 9;
const U64: u32 = 10;
const I64: u32 = 11;
const F64: u32 = 12;

fn gguf_str(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

/// A GGUF file under construction: raw metadata values and tensors with their data.
struct Builder {
    version: u32,
    alignment: u64,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    /// Offsets to write instead of the computed ones, by tensor index.
    offset_override: Vec<(usize, u64)>,
}

impl Builder {
    fn new() -> Self {
        Builder {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
            offset_override: Vec::new(),
        }
    }

    fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
        self.kvs.push((key.into(), ty, value));
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.into(), dims.to_vec(), ty.id(), data));
        self
    }

    fn raw_tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.into(), dims.to_vec(), type_id, data));
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            b.extend(gguf_str(k));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        let mut offsets = Vec::new();
        let mut next = 0u64;
        for (i, (name, dims, ty, data)) in self.tensors.iter().enumerate() {
            b.extend(gguf_str(name));
            b.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            let off = self
                .offset_override
                .iter()
                .find(|(j, _)| *j == i)
                .map_or(next, |&(_, o)| o);
            b.extend(off.to_le_bytes());
            offsets.push(off);
            next = (next + data.len() as u64).next_multiple_of(self.alignment);
        }
        if !self.tensors.is_empty() {
            b.resize(b.len().next_multiple_of(self.alignment as usize), 0);
        }
        let start = b.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            // Hostile offsets point far away: leave their data out.
            let Some(at) = (start as u64).checked_add(off).filter(|&a| a < 1 << 20) else {
                continue;
            };
            let at = at as usize;
            if b.len() < at + data.len() {
                b.resize(at + data.len(), 0);
            }
            b[at..at + data.len()].copy_from_slice(data);
        }
        b
    }
}

fn u32v(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn array(elem: u32, items: &[Vec<u8>]) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend((items.len() as u64).to_le_bytes());
    for i in items {
        b.extend(i);
    }
    b
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small valid file with one of every metadata type and three tensors.
fn sample() -> Builder {
    Builder::new()
        .kv("general.architecture", STR, gguf_str("llama"))
        .kv("a.u8", U8, vec![200])
        .kv("a.i8", I8, vec![0xff])
        .kv("a.u16", U16, 60000u16.to_le_bytes().to_vec())
        .kv("a.i16", I16, (-300i16).to_le_bytes().to_vec())
        .kv("a.u32", U32, u32v(4_000_000_000))
        .kv("a.i32", I32, (-7i32).to_le_bytes().to_vec())
        .kv("a.f32", F32, 1.5f32.to_le_bytes().to_vec())
        .kv("a.bool", BOOL, vec![1])
        .kv("a.u64", U64, (1u64 << 40).to_le_bytes().to_vec())
        .kv("a.i64", I64, (-5i64).to_le_bytes().to_vec())
        .kv("a.f64", F64, 0.25f64.to_le_bytes().to_vec())
        .kv(
            "a.strs",
            ARR,
            array(STR, &[gguf_str("x"), gguf_str(""), gguf_str("zé")]),
        )
        .kv(
            "a.nested",
            ARR,
            array(
                ARR,
                &[
                    array(I32, &[u32v(1), u32v(2)]),
                    array(F32, &[f32_bytes(&[0.5])]),
                ],
            ),
        )
        .tensor(
            "w.f32",
            &[3, 2],
            GgmlType::F32,
            f32_bytes(&[1., 2., 3., 4., 5., 6.]),
        )
        .tensor("w.q8", &[64, 2], GgmlType::Q8_0, q8_0_blocks(4))
        .tensor("w.q4k", &[256], GgmlType::Q4_K, vec![0; 144])
}

/// `n` Q8_0 blocks with scale 1 and values 0..32.
fn q8_0_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for _ in 0..n {
        b.extend(half_one());
        b.extend(0u8..32);
    }
    b
}

fn half_one() -> [u8; 2] {
    0x3c00u16.to_le_bytes()
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn reads_every_metadata_type_and_tensor() {
    let bytes = sample().bytes();
    let path = temp_file("sample.gguf", &bytes);
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.metadata("a.u8"), Some(&Value::U8(200)));
    assert_eq!(g.metadata("a.i8"), Some(&Value::I8(-1)));
    assert_eq!(g.metadata("a.u16"), Some(&Value::U16(60000)));
    assert_eq!(g.metadata("a.i16"), Some(&Value::I16(-300)));
    assert_eq!(g.get_u32("a.u32"), Some(4_000_000_000));
    assert_eq!(g.get_u32("a.i32"), None, "negative does not fit u32");
    assert_eq!(g.metadata("a.i32").and_then(Value::as_i32), Some(-7));
    assert_eq!(g.get_f32("a.f32"), Some(1.5));
    assert_eq!(g.get_f32("a.f64"), Some(0.25));
    assert_eq!(g.get_bool("a.bool"), Some(true));
    assert_eq!(g.get_u64("a.u64"), Some(1 << 40));
    assert_eq!(g.get_u32("a.u64"), None, "too large for u32");
    assert_eq!(g.metadata("a.i64"), Some(&Value::I64(-5)));
    assert_eq!(g.get_str_array("a.strs"), Some(vec!["x", "", "zé"]));
    assert_eq!(g.get_str("a.strs"), None);
    let nested = g.metadata("a.nested").unwrap().as_array().unwrap();
    assert_eq!(nested[0], Value::Array(vec![Value::I32(1), Value::I32(2)]));
    assert_eq!(nested[1], Value::Array(vec![Value::F32(0.5)]));
    assert_eq!(g.metadata_entries().len(), 14);
    assert_eq!(g.require_u32("a.u32").unwrap(), 4_000_000_000);
    let e = g.require_u32("a.strs").unwrap_err().to_string();
    assert!(e.contains("a.strs") && e.contains("sample.gguf"), "{e}");
    let e = g.require_str("nope").unwrap_err().to_string();
    assert!(e.contains("`nope`: missing"), "{e}");

    assert_eq!(g.tensors().len(), 3);
    let t = g.tensor("w.f32").unwrap();
    assert_eq!(t.dims, vec![3, 2]);
    assert_eq!(t.shape(), vec![2, 3]);
    assert_eq!((t.row_len(), t.n_rows(), t.row_bytes()), (3, 2, 12));
    assert_eq!(
        g.tensor_to_f32("w.f32").unwrap(),
        vec![1., 2., 3., 4., 5., 6.]
    );
    assert_eq!(g.data_offset() % 32, 0);
    let q = g.tensor("w.q8").unwrap();
    assert_eq!(
        (q.ggml_type, q.n_bytes, q.offset % 32),
        (GgmlType::Q8_0, 136, 0)
    );
    assert_eq!(g.tensor_bytes("w.q8").unwrap(), &q8_0_blocks(4)[..]);
    let deq = g.tensor_to_f32("w.q8").unwrap();
    assert_eq!(deq.len(), 128);
    assert_eq!(deq[31], 31.0);
    assert!(g.tensor_to_f32("w.q4k").unwrap().iter().all(|&v| v == 0.0));
    assert!(matches!(
        g.tensor("missing"),
        Err(Error::MissingTensor { .. })
    ));
}

#[test]
fn honours_general_alignment_and_version_2() {
    let mut b = sample().kv("general.alignment", U32, u32v(64));
    b.alignment = 64;
    b.version = 2;
    let h = parse_header(Path::new("a.gguf"), &b.bytes()).unwrap();
    assert_eq!((h.alignment(), h.version()), (64, 2));
    assert_eq!(h.data_offset() % 64, 0);
    assert!(h.tensors().iter().all(|t| t.offset % 64 == 0));
    // Alignment 32 would misplace the second tensor.
    assert_eq!(h.tensor_info("w.q8").unwrap().offset, 64);
}

#[test]
fn empty_file_without_tensors_is_valid() {
    let h = parse_header(Path::new("e.gguf"), &Builder::new().bytes()).unwrap();
    assert!(h.tensors().is_empty() && h.metadata_entries().is_empty());
}

/// Parsing `bytes` fails with a message naming the file and containing `want`.
fn check_err(bytes: &[u8], want: &str) {
    match parse_header(Path::new("bad.gguf"), bytes) {
        Ok(_) => panic!("expected an error containing {want:?}"),
        Err(e) => {
            let m = e.to_string();
            assert!(m.starts_with("bad.gguf: "), "{m}");
            assert!(m.contains(want), "expected {want:?} in {m:?}");
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().bytes();
    for n in 0..bytes.len() {
        let e = parse_header(Path::new("t.gguf"), &bytes[..n]);
        assert!(e.is_err(), "prefix of {n} bytes parsed");
    }
    check_err(&bytes[..10], "truncated gguf file");
    check_err(
        &bytes[..bytes.len() - 1],
        "past the end of the data section",
    );
}

#[test]
fn rejects_bad_magic_and_versions() {
    let mut b = sample().bytes();
    b[..4].copy_from_slice(b"GGML");
    check_err(&b, "not a gguf file");
    let mut s = sample();
    s.version = 1;
    check_err(&s.bytes(), "gguf version 1 is not supported");
    s.version = 4;
    check_err(&s.bytes(), "unsupported gguf version 4");
    s.version = 3u32.swap_bytes();
    check_err(&s.bytes(), "big-endian");
}

#[test]
fn rejects_bad_tensors() {
    let one = || Builder::new();
    check_err(
        &one().raw_tensor("t", &[32], 99, vec![0; 32]).bytes(),
        "tensor `t`: unknown tensor type 99",
    );
    check_err(
        &one()
            .tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4])
            .bytes(),
        &format!("5 dims exceed the limit of {MAX_DIMS}"),
    );
    check_err(
        &one()
            .tensor("t", &[33], GgmlType::Q8_0, vec![0; 68])
            .bytes(),
        "row length 33 is not a multiple of the block size 32",
    );
    check_err(
        &one()
            .tensor("t", &[1 << 32, 1 << 32], GgmlType::F32, vec![])
            .bytes(),
        "overflows",
    );
    // Found by fuzzing: a zero-length row made the total 0 while the row count overflowed.
    check_err(
        &one()
            .tensor("t", &[0, 1 << 32, 1 << 32], GgmlType::F32, vec![])
            .bytes(),
        "element count overflows",
    );
    let mut b = one().tensor("a", &[8], GgmlType::F32, vec![0; 32]).tensor(
        "b",
        &[8],
        GgmlType::F32,
        vec![0; 32],
    );
    b.offset_override = vec![(1, 16)];
    check_err(&b.bytes(), "not a multiple of the alignment 32");
    b.offset_override = vec![(1, 0)];
    check_err(&b.bytes(), "tensors `a` and `b` overlap");
    b.offset_override = vec![(1, 1 << 40)];
    check_err(
        &b.bytes(),
        "tensor `b`: data [1099511627776, +32) lies past the end",
    );
    b.offset_override = vec![(1, u64::MAX - 31)];
    check_err(&b.bytes(), "lies past the end");
    check_err(
        &one()
            .tensor("a", &[8], GgmlType::F32, vec![0; 32])
            .tensor("a", &[8], GgmlType::F32, vec![0; 32])
            .bytes(),
        "duplicate tensor name `a`",
    );
}

#[test]
fn rejects_bad_metadata() {
    let one = || Builder::new();
    check_err(
        &one().kv("k", U32, u32v(1)).kv("k", U32, u32v(2)).bytes(),
        "duplicate metadata key `k`",
    );
    check_err(
        &one().kv("k", 13, vec![]).bytes(),
        "metadata `k`: unknown value type 13",
    );
    check_err(&one().kv("k", BOOL, vec![2]).bytes(), "bool byte is 2");
    check_err(
        &one().kv("general.alignment", U32, u32v(48)).bytes(),
        "general.alignment",
    );
    check_err(
        &one()
            .kv("general.alignment", U64, 32u64.to_le_bytes().to_vec())
            .bytes(),
        "power of two of type u32",
    );
    check_err(
        &one().kv("k", ARR, array(77, &[])).bytes(),
        "unknown array element type 77",
    );
    // Huge declared lengths fail before anything is allocated.
    let mut huge = STR.to_le_bytes().to_vec();
    huge.extend((1u64 << 25).to_le_bytes());
    check_err(
        &one().kv("k", ARR, huge).bytes(),
        "declares 33554432 elements",
    );
    let mut huge = U8.to_le_bytes().to_vec();
    huge.extend(u64::MAX.to_le_bytes());
    check_err(&one().kv("k", ARR, huge).bytes(), "exceeds the limit");
    let mut long = (1u64 << 40).to_le_bytes().to_vec();
    long.extend(b"abc");
    check_err(
        &one().kv("k", STR, long).bytes(),
        "string length 1099511627776 exceeds",
    );
    // Nesting deeper than the cap.
    let mut v = array(U8, &[vec![1]]);
    for _ in 0..4 {
        v = array(ARR, &[v]);
    }
    check_err(
        &one().kv("k", ARR, v).bytes(),
        "nested deeper than the limit of 4",
    );
    // Counts that cannot fit in the file.
    let mut b = one().bytes();
    b[8..16].copy_from_slice(&1000u64.to_le_bytes());
    check_err(&b, "cannot fit");
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    check_err(&b, "tensor count 18446744073709551615 exceeds the limit");
}

#[test]
fn open_names_the_file_in_io_errors() {
    let e = GgufFile::open(Path::new("/nonexistent/x.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/x.gguf"), "{e}");
}

#[test]
fn type_table_is_consistent() {
    for t in GgmlType::ALL {
        assert_eq!(GgmlType::from_id(t.id()), Some(t));
        assert!(t.block_size() > 0 && t.block_bytes() > 0);
        assert_eq!(
            t.row_bytes(t.block_size() as u64 * 3),
            Some(3 * t.block_bytes() as u64)
        );
    }
    assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed");
    assert_eq!(GgmlType::Q4_K.to_string(), "Q4_K");
    assert_eq!(
        (GgmlType::Q6_K.block_size(), GgmlType::Q6_K.block_bytes()),
        (256, 210)
    );
    assert_eq!(GgmlType::IQ4_XS.block_bytes(), 136);
    assert_eq!(GgmlType::Q4_K.row_bytes(255), None);
}

#[test]
fn parses_files_written_by_gguf_py() {
    // The fuzzer's seeds, written by gguf-py's GGUFWriter (fuzz/make_seeds.py).
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/gguf_header/");
    let g = GgufFile::open(Path::new(&format!("{dir}tiny.gguf"))).unwrap();
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count"), Some(1));
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(g.get_bool("flag"), Some(true));
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens"),
        Some(vec!["a", "b", "ab"])
    );
    let a = g.tensor("a.weight").unwrap();
    assert_eq!((a.ggml_type, a.dims.clone()), (GgmlType::F32, vec![4, 2]));
    let b = g.tensor("b.weight").unwrap();
    assert_eq!((b.ggml_type, b.dims.clone()), (GgmlType::F16, vec![8, 3]));
    for (i, ty) in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::IQ4_NL]
        .into_iter()
        .enumerate()
    {
        let g = GgufFile::open(Path::new(&format!("{dir}quant{i}.gguf"))).unwrap();
        let q = g.tensor("q.weight").unwrap();
        assert_eq!(q.ggml_type, ty);
        assert_eq!(q.n_rows(), 2);
        assert_eq!(
            g.tensor_to_f32("q.weight").unwrap().len() as u64,
            q.n_elements()
        );
    }
}
