use std::fmt;

/// Errors from allocating or viewing a [`crate::Buffer`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BufferError {
    /// The allocator could not provide `bytes` bytes.
    OutOfMemory {
        /// Name of the allocator that failed.
        allocator: String,
        /// Requested size in bytes.
        bytes: usize,
        /// What the allocator reported.
        cause: String,
    },
    /// The shape's element count times the element size overflows `usize` or exceeds `isize::MAX`.
    SizeOverflow {
        /// The shape that was asked for.
        shape: Vec<usize>,
    },
    /// A typed view or an operation asked for one dtype but the buffer holds another.
    DTypeMismatch {
        /// The dtype that was asked for.
        expected: crate::DType,
        /// The dtype the buffer holds.
        actual: crate::DType,
    },
    /// A reshape to a shape with a different number of elements, or data of the wrong length.
    ShapeMismatch {
        /// Number of elements of the buffer.
        expected: usize,
        /// Number of elements of the requested shape or data.
        actual: usize,
    },
    /// An alignment that is not a power of two.
    BadAlignment(usize),
}

impl fmt::Display for BufferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferError::OutOfMemory { allocator, bytes, cause } => {
                write!(f, "allocator `{allocator}` could not allocate {bytes} bytes: {cause}")
            }
            BufferError::SizeOverflow { shape } => {
                write!(f, "buffer of shape {shape:?} is too large to address")
            }
            BufferError::DTypeMismatch { expected, actual } => {
                write!(f, "buffer holds {actual} elements, {expected} was requested")
            }
            BufferError::ShapeMismatch { expected, actual } => {
                write!(f, "element count mismatch: buffer has {expected}, got {actual}")
            }
            BufferError::BadAlignment(a) => write!(f, "alignment {a} is not a power of two"),
        }
    }
}

impl std::error::Error for BufferError {}
