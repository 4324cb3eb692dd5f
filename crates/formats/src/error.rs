use std::path::PathBuf;

/// Errors from reading checkpoint files. Every variant names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// File concerned.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// The file's structure is invalid (header, offsets, lengths).
    #[error("{path}: {message}")]
    Malformed {
        /// File concerned.
        path: PathBuf,
        /// What was wrong, with expected vs got where it applies.
        message: String,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor {
        /// File or directory searched.
        path: PathBuf,
        /// Tensor name.
        name: String,
    },
    /// A tensor exists but its dtype or shape is not what the model expects.
    #[error("{path}: tensor `{name}`: {message}")]
    BadTensor {
        /// File holding the tensor.
        path: PathBuf,
        /// Tensor name.
        name: String,
        /// What was wrong, expected vs got.
        message: String,
    },
}

impl Error {
    pub(crate) fn malformed(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Malformed {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
