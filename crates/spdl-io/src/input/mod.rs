//! The input layer, shared by every medium: where encoded bytes come from ([`MediaInput`]: a path read
//! with seeks, or bytes already in memory), how a path is read whole with its cost bounded first
//! ([`read_file`], [`ReadLimits`]), and which part of a timed input to decode ([`TimeWindow`]).
//!
//! Everything here is re-exported at the crate root (`spdl_io::MediaInput`, `spdl_io::read_file`, ...).

mod media;
mod read;
mod window;

pub use media::MediaInput;
pub use read::{DEFAULT_MAX_FILE_BYTES, ReadLimits, read_file};
pub use window::TimeWindow;
