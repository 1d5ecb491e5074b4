//! An ImageNet-style training loader: class folders → labels, a shuffled order per epoch sharded by rank
//! (`RANK`/`WORLD_SIZE`), async reads, random-resized-crop + normalize fused into one f32 NCHW batch, and a
//! resumable position.
//!
//! ```sh
//! cargo run --release -p spdl-examples --example imagenet_loader -- [DIR]
//! ```
//! Without DIR it makes a small synthetic dataset in the system temp dir.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use spdl_buffer::{Layout, system_allocator};
use spdl_exec::{BuildOptions, FailureBudget, OutputOrder, PipelineBuilder, Stage};
use spdl_io::image::{BatchDecoder, BatchOptions, Normalize, Transform};
use spdl_source::Dataset;
use spdl_source::sampler::{Remainder, SamplerIter, ShardedSampler, ShuffledSampler};

fn main() -> Result<()> {
    let dir = match std::env::args().nth(1) {
        Some(d) => PathBuf::from(d),
        None => {
            let d = std::env::temp_dir().join("spdl-example-imagenet");
            spdl_io::synth::write_dataset(&d, 256, 7, 4)?;
            d
        }
    };
    let dataset = Arc::new(Dataset::image_folder(&dir, &["jpg", "jpeg", "png"])?);
    println!("{} images in {} classes", dataset.len(), dataset.classes().len());

    // Every rank computes the same shuffled order from (seed, epoch) and takes its share.
    let sampler = ShardedSampler::from_env(ShuffledSampler::new(dataset.len(), 1234), Remainder::Pad)?;
    let mut order = SamplerIter::new(sampler);

    for epoch in 0..2u64 {
        let indices: Vec<usize> = order.epoch_iter().collect();
        let records = dataset.clone();
        let root = dir.clone();
        let decoder = Arc::new(BatchDecoder::new(
            BatchOptions {
                // New crops every epoch: the seed mixes in the epoch.
                transform: Transform::random_resized_crop(224, 224, 1234 ^ epoch),
                layout: Layout::Nchw,
                normalize: Some(Normalize::imagenet()),
                strict: false,
                threads: Some(1),
                ..BatchOptions::default()
            },
            system_allocator(),
        )?);
        let pipeline = PipelineBuilder::new()
            .source(indices)
            .pipe(
                Stage::map_async("read", move |i: usize| {
                    let rec = records.records()[i].clone();
                    // Keys are relative to the dataset root.
                    let path = root.join(&rec.key);
                    async move {
                        let bytes = tokio::fs::read(&path).await.with_context(|| path.display().to_string())?;
                        Ok::<_, anyhow::Error>((rec.key, rec.label.unwrap_or(-1), bytes))
                    }
                })
                .concurrency(16),
            )
            .aggregate(32)
            .pipe(
                Stage::map("decode", move |batch: Vec<(String, i64, Vec<u8>)>| {
                    let items: Vec<(&str, &[u8])> = batch.iter().map(|(k, _, b)| (k.as_str(), b.as_slice())).collect();
                    let out = decoder.decode(&items)?;
                    let labels: Vec<i64> = batch.iter().map(|(_, l, _)| *l).collect();
                    Ok::<_, spdl_io::Error>((out.buffer, labels))
                })
                .concurrency(2)
                .order(OutputOrder::Input),
            )
            .sink(3)
            // A few unreadable files are logged and skipped; more than 1% ends the run with the causes.
            .build(BuildOptions {
                num_threads: 2,
                failure_budget: FailureBudget::Fraction(0.01),
                ..BuildOptions::default()
            })?;
        let mut n = 0;
        for batch in &pipeline {
            let (images, labels) = batch?;
            assert_eq!(images.shape()[0], labels.len());
            n += labels.len();
        }
        println!("epoch {epoch}: {n} images; resume state: {:?}", order.state());
        println!("{}", pipeline.stats());
    }
    Ok(())
}
