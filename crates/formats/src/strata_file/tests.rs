use super::*;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn write_sample(path: &Path) -> PackedMatrix {
    let w: Vec<f32> = (0..40 * 70)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 9.0)
        .collect();
    let p = PackedMatrix::pack(&w, 40, 70, PackedFormat::Int4 { group: 32 }).expect("packs");
    let mut wr = StrataWriter::create(path).expect("creates");
    wr.add_f32("norm", &[3], &[1.0, 2.0, 3.0]).expect("f32");
    wr.add_bf16("emb", &[2, 2], &[half::bf16::from_f32(0.5); 4])
        .expect("bf16");
    wr.add_packed("proj", &p).expect("packed");
    wr.add_blob("tokenizer.json", b"{}").expect("blob");
    wr.finish(serde_json::json!({"a": 1}), Value::Null)
        .expect("finishes");
    p
}

#[test]
fn round_trip_maps_every_kind() {
    let path = tmp("round.strata");
    let p = write_sample(&path);
    assert!(!path.with_file_name("round.strata.tmp").exists());
    assert!(StrataFile::sniff(&path));
    let f = StrataFile::open(&path).expect("opens");
    assert_eq!(f.config()["a"], 1);
    assert_eq!(f.blob("tokenizer.json"), Some(&b"{}"[..]));
    let norm = f.get("norm").expect("norm").view().expect("view");
    assert_eq!(norm.to_f32().expect("f32"), vec![1.0, 2.0, 3.0]);
    let emb = f.get("emb").expect("emb").view().expect("view");
    assert_eq!(emb.as_bf16().expect("bf16 in place").len(), 4);
    let q = f.packed(f.get("proj").expect("proj")).expect("maps");
    assert!(q.is_mapped());
    assert_eq!(q.dequantize(), p.dequantize());
    for t in f.tensors() {
        let off = t.data.start;
        assert_eq!(off % 64, 0, "{}", t.name);
    }
}

#[test]
fn dropped_writer_leaves_nothing() {
    let path = tmp("dropped.strata");
    {
        let mut w = StrataWriter::create(&path).expect("creates");
        w.add_f32("x", &[1], &[1.0]).expect("adds");
        assert!(w.add_f32("x", &[1], &[1.0]).is_err());
        assert!(w.add_f32("y", &[2], &[1.0]).is_err());
    }
    assert!(!path.exists());
    assert!(!path.with_file_name("dropped.strata.tmp").exists());
}

/// Rewrites the sample's directory through `edit` (keeping the header consistent).
fn with_directory(name: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let path = tmp(name);
    write_sample(&path);
    let mut b = std::fs::read(&path).expect("reads");
    let (off, len) = (le_u64(&b[16..24]) as usize, le_u64(&b[24..32]) as usize);
    let mut dir: Value = serde_json::from_slice(&b[off..off + len]).expect("json");
    edit(&mut dir);
    let json = serde_json::to_vec(&dir).expect("json");
    b.truncate(off);
    b.extend_from_slice(&json);
    b[24..32].copy_from_slice(&(json.len() as u64).to_le_bytes());
    std::fs::write(&path, &b).expect("writes");
    path
}

fn open_err(path: &Path) -> String {
    StrataFile::open(path).expect_err("must fail").to_string()
}

#[test]
fn malformed_files_are_named_errors() {
    let path = tmp("bad.strata");
    write_sample(&path);
    let good = std::fs::read(&path).expect("reads");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..40].to_vec(), "truncated"),
        (good[..good.len() - 10].to_vec(), "outside the file"),
        (
            [b"GGUF".as_slice(), &good[4..]].concat(),
            "not a .strata file",
        ),
        (
            [&good[..8], &99u32.to_le_bytes()[..], &good[12..]].concat(),
            "file format version 99",
        ),
        (
            [
                &good[..12],
                &(LAYOUT_VERSION + 1).to_le_bytes()[..],
                &good[16..],
            ]
            .concat(),
            "re-run `strata convert`",
        ),
    ];
    for (bytes, want) in cases {
        std::fs::write(&path, &bytes).expect("writes");
        let e = open_err(&path);
        assert!(e.contains(want) && e.contains("bad.strata"), "{e}");
    }
    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: Vec<(&str, Edit, &str)> = vec![
        (
            "past.strata",
            Box::new(|d| d["tensors"][0]["offset"] = 1u64.wrapping_shl(40).into()),
            "outside the file",
        ),
        (
            "misaligned.strata",
            Box::new(|d| {
                let o = d["tensors"][0]["offset"].as_u64().expect("offset");
                d["tensors"][0]["offset"] = (o + 4).into();
            }),
            "not a multiple of 64",
        ),
        (
            "size.strata",
            Box::new(|d| d["tensors"][0]["shape"] = serde_json::json!([4])),
            "needs 16 bytes",
        ),
        (
            "packedsize.strata",
            Box::new(|d| d["tensors"][2]["packed"]["k"] = 300.into()),
            "disagrees",
        ),
        (
            "format.strata",
            Box::new(|d| d["tensors"][2]["packed"]["format"] = "int3".into()),
            "unknown packed format",
        ),
        (
            "kind.strata",
            Box::new(|d| d["tensors"][0]["kind"] = "f16".into()),
            "unknown tensor kind",
        ),
        (
            "overflow.strata",
            Box::new(|d| d["tensors"][0]["shape"] = serde_json::json!([u64::MAX, 4])),
            "overflows",
        ),
    ];
    for (name, edit, want) in edits {
        let p = with_directory(name, edit);
        let e = open_err(&p);
        assert!(e.contains(want) && e.contains(name), "{name}: {e}");
    }
}
