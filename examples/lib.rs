//! End-to-end examples of spdl-rs; run one with `cargo run --release -p spdl-examples --example NAME`.
