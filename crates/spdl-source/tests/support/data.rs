//! Deterministic test objects and the fetch pipeline the store tests run.
#![allow(dead_code)]

use std::sync::Arc;

use bytes::Bytes;
use spdl_exec::{BuildOptions, FailureBudget, OutputOrder, PipelineBuilder, Stage};
use spdl_source::{ObjectStore, SourceError};

/// splitmix64: spreads a counter or an index into well-mixed bits (fault decisions, object contents).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Object `i`'s bytes: `min_len` to `min_len + spread - 1` pseudo-random bytes, the same on every run, so a
/// test can check every byte it reads. `salt` makes another family of contents.
pub fn content(i: usize, min_len: usize, spread: u64, salt: u64) -> Bytes {
    let len = min_len + (mix(i as u64) % spread) as usize;
    let mut x = mix(i as u64 + salt);
    Bytes::from(
        (0..len)
            .map(|_| {
                x = mix(x);
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

/// keys → `store.get` (async stage, `concurrency` in flight, input order, `budget`) → sink of `sink`
/// batches. The stage's result keeps its key, so a test can check each object against what it wrote.
pub fn fetch_pipeline<S: ObjectStore + 'static>(
    store: Arc<S>,
    keys: impl IntoIterator<Item = String, IntoIter: Send + 'static> + Send + 'static,
    concurrency: usize,
    sink: usize,
    budget: FailureBudget,
) -> spdl_exec::Pipeline<(String, Bytes)> {
    PipelineBuilder::new()
        .source(keys)
        .pipe(
            Stage::map_async("fetch", move |key: String| {
                let store = store.clone();
                async move {
                    let bytes = store.get(&key).await?;
                    Ok::<_, SourceError>((key, bytes))
                }
            })
            .concurrency(concurrency)
            .order(OutputOrder::Input)
            .failure_budget(budget),
        )
        .sink(sink)
        .build(BuildOptions { num_threads: 2, ..BuildOptions::default() })
        .expect("build")
}
