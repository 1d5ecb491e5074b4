//! `spdl gen-data DIR --corrupt`: the broken-media corpus, written by spdl-io's generator (feature `corrupt`).

pub use spdl_io::corrupt::write_corpus;
