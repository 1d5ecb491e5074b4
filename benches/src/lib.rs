//! criterion benchmarks live in `benches/benches/`.
