//! Read-only memory mapping of checkpoint files, shared between the tensors that view it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Error, Result};

/// A read-only mapped file. Cloning shares the mapping.
#[derive(Clone)]
pub struct MappedFile {
    path: Arc<PathBuf>,
    map: Arc<memmap2::Mmap>,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .finish()
    }
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this process. A checkpoint modified
        // on disk while mapped is outside what we can defend against (as for every mmap loader);
        // all offsets are validated against the mapping's length before use.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(MappedFile {
            path: Arc::new(path.to_owned()),
            map: Arc::new(map),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
