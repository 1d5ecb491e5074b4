//! The crate's error type, and how each error reaches Python.

use pyo3::PyErr;
use pyo3::exceptions::{PyEOFError, PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use spdl_report::error_chain;

/// What can go wrong in the facade, on the Rust side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Python op raised; the exception was logged with its traceback and kept for `PipelineFailure`.
    #[error("stage `{stage}`: {message}")]
    Python {
        /// The stage (or `source`).
        stage: String,
        /// `ExceptionType: message`.
        message: String,
    },
    /// A native op failed on an item.
    #[error("stage `{stage}`: native op `{op}` failed on {item}")]
    Native {
        /// The stage.
        stage: String,
        /// The op.
        op: String,
        /// The item, described.
        item: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A native op got an item of a type it does not take.
    #[error("stage `{stage}`: native op `{op}` cannot take {item} (it takes {expected})")]
    WrongInput {
        /// The stage.
        stage: String,
        /// The op.
        op: String,
        /// The item, described.
        item: String,
        /// What the op takes.
        expected: &'static str,
    },
    /// The asyncio loop that runs the pipeline's async ops is gone (the pipeline is stopping).
    #[error("stage `{stage}`: the pipeline's event loop is not running")]
    LoopGone {
        /// The stage.
        stage: String,
    },
    /// A pipeline description from the Python layer is malformed.
    #[error("invalid pipeline: {0}")]
    Invalid(String),
    /// The engine refused or ended the pipeline.
    #[error(transparent)]
    Pipeline(#[from] spdl_exec::PipelineError),
}

impl Error {
    /// A native op `op` of stage `stage` failed on `item` (its path or key, or "a batch of N").
    pub fn native(
        stage: &str,
        op: &str,
        item: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::Native { stage: stage.to_owned(), op: op.to_owned(), item: item.into(), source: source.into() }
    }

    /// A native op `op` of stage `stage` got `item` (described), which is not what it takes (`expected`).
    pub fn wrong_input(stage: &str, op: &str, item: impl Into<String>, expected: &'static str) -> Self {
        Error::WrongInput { stage: stage.to_owned(), op: op.to_owned(), item: item.into(), expected }
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        let msg = error_chain(&e);
        match &e {
            Error::Invalid(_) => PyValueError::new_err(msg),
            Error::WrongInput { .. } => PyTypeError::new_err(msg),
            Error::Pipeline(p) if p.is_timeout() => PyTimeoutError::new_err(msg),
            Error::Pipeline(spdl_exec::PipelineError::InvalidOption { .. }) => PyValueError::new_err(msg),
            Error::LoopGone { .. } => PyEOFError::new_err(msg),
            _ => PyRuntimeError::new_err(msg),
        }
    }
}

/// A failed item of a spdl-io batch, as Python sees it: `(index, item, cause)`.
#[cfg(feature = "io")]
pub(crate) fn batch_failure(f: &spdl_io::Error) -> (usize, String, String) {
    let (index, cause) = f.batch_item().unwrap_or((usize::MAX, f));
    (index, cause.item().unwrap_or_default().to_owned(), error_chain(cause))
}
