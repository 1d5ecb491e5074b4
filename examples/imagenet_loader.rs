//! An ImageNet-style training loader on spdl-loader's recipe: class folders → labels, a shuffled order per
//! epoch sharded by rank (`RANK`/`WORLD_SIZE`), reads through the local store, random-resized-crop +
//! normalize fused into one f32 NCHW batch, and a resumable position.
//!
//! ```sh
//! cargo run --release -p spdl-examples --example imagenet_loader -- [DIR]
//! ```
//! Without DIR it makes a small synthetic dataset in the system temp dir.

use std::path::PathBuf;

use anyhow::Result;
use spdl_buffer::Layout;
use spdl_exec::{FailureBudget, OutputOrder};
use spdl_io::image::Transform;
use spdl_loader::{GpuMode, ImageLoader, ListOptions, Listing, LoaderOptions};
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
    let listing = Listing::open(&dir.to_string_lossy(), &ListOptions::default())?;
    let classes = listing.samples.iter().map(|s| s.label).max().unwrap_or(-1) + 1;
    println!("{} images in {classes} classes", listing.samples.len());

    // Every rank computes the same shuffled order from (seed, epoch) and takes its share.
    let sampler = ShardedSampler::from_env(ShuffledSampler::new(listing.samples.len(), 1234), Remainder::Pad)?;
    let mut order = SamplerIter::new(sampler);

    for epoch in 0..2u64 {
        let indices: Vec<usize> = order.epoch_iter().collect();
        let opts = LoaderOptions {
            batch_size: 32,
            threads: 2,
            // New crops every epoch: the seed mixes in the epoch.
            transform: Transform::random_resized_crop(224, 224, 1234 ^ epoch),
            layout: Layout::Nchw,
            normalize: true,
            gpu: GpuMode::Auto,
            order: OutputOrder::Input,
            // A few unreadable files are logged and skipped; more than 1% ends the run with the causes.
            failure_budget: FailureBudget::Fraction(0.01),
            ..LoaderOptions::default()
        };
        let loader = ImageLoader::new(listing.select(&indices), opts)?;
        let mut n = 0;
        for batch in loader.pipeline() {
            let batch = batch?;
            assert_eq!(batch.images.len(), batch.labels.len());
            n += batch.labels.len();
        }
        println!("epoch {epoch}: {n} images; resume state: {:?}", order.state());
        println!("{}", loader.pipeline().stats());
    }
    Ok(())
}
