//! Video decoding through FFmpeg (being built).
