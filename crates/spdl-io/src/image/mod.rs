//! Image decoding (being built).
