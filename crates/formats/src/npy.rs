//! NumPy `.npy` files of float32 arrays: the `logits` command's output and reference logits.
//!
//! Only what Strata exchanges: little-endian `<f4`, C order, any rank. Writing goes to a
//! temporary file renamed into place, so a failed write never leaves a partial file.

use std::io::Write;
use std::path::Path;

use crate::{Error, Result};

/// A float32 array read from a `.npy` file.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyF32 {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Values in C order.
    pub data: Vec<f32>,
}

/// Reads a little-endian float32 `.npy` file.
pub fn read_f32(path: &Path) -> Result<NpyF32> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    let bad = |m: &str| Error::malformed(path, m.to_owned());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file (bad magic)"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(bad(&format!("unsupported .npy version {v}"))),
    };
    let header = bytes
        .get(start..start + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("truncated .npy header"))?;
    if !header.contains("'descr': '<f4'") {
        return Err(bad(&format!("expected dtype '<f4', header is {header}")));
    }
    if header.contains("'fortran_order': True") {
        return Err(bad("Fortran-order arrays are not supported"));
    }
    let shape_str = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("no shape in .npy header"))?;
    let shape = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| bad(&format!("bad shape `{shape_str}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let data = &bytes[start + header_len..];
    let n: usize = shape.iter().product();
    if data.len() != n * 4 {
        return Err(bad(&format!(
            "shape {shape:?} needs {} data bytes, file has {}",
            n * 4,
            data.len()
        )));
    }
    Ok(NpyF32 {
        shape,
        data: data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

/// Writes a float32 array atomically (temporary file, then rename).
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    assert_eq!(
        shape.iter().product::<usize>(),
        data.len(),
        "npy shape and data disagree"
    );
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_str = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_str}, }}");
    // Pad so that magic + version + length + header + newline is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("npy.tmp");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    let write = |f: &mut std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
        f.write_all(b"\x93NUMPY\x01\x00")?;
        f.write_all(&(header.len() as u16).to_le_bytes())?;
        f.write_all(header.as_bytes())?;
        for v in data {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()
    };
    if let Err(e) = write(&mut f) {
        drop(f);
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("strata-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        write_f32(&p, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, -6.5]).unwrap();
        let a = read_f32(&p).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data[5], -6.5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
