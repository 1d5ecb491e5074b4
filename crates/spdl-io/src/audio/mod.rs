//! Audio decoding (being built).
