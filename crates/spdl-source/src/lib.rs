//! Where the bytes of a training set come from, and in which order: object stores, dataset listings and samplers.
//!
//! - [`ObjectStore`] is the one async trait every storage backend implements: `get`, `get_range`, `head`, `list`
//!   (streamed), plus `get_parallel` for large objects. [`LocalStore`] needs nothing but tokio; the HTTP(S) store
//!   (feature `http`, reqwest + rustls) and the S3 store (feature `s3`, aws-sdk-s3) time out stalled requests,
//!   retry transient failures (5xx, throttling, resets, timeouts — never 404/403) with exponential backoff and
//!   jitter, and cap the requests in flight. Errors name the object, the attempts and the last cause.
//!   [`open_store`] picks the store from an address: `s3://bucket/prefix`, `https://host/path`, `/local/dir`.
//! - [`Dataset`] is a sorted, indexed list of `(key, label)` [`Record`]s from a directory walk, the ImageNet
//!   class-folder layout, a manifest (keys, CSV, TSV) or any store's listing; [`dataset::ShardReader`] and
//!   [`dataset::stream_shards`] read WebDataset tar shards without extracting them.
//! - [`tar_index::index`] lists the regular members of a TAR archive held in memory as `(path, offset, size)`,
//!   so their data can be handed out as slices of the buffer (`spdl_rs.io.iter_tarfile`);
//!   [`tar_index::TarReader`] reads the same members from any `Read` (the WebDataset reader is built on it), and
//!   [`tar_index::TarParser`] is the header logic both share.
//! - [`sampler::Sampler`] gives the order of indices per epoch: sequential, shuffled from (seed, epoch) with a fixed
//!   portable algorithm, weighted, and sharded by (rank, world size); [`sampler::SamplerIter`] saves its position as
//!   a small serde value and resumes exactly.
//!
//! The crate does not depend on the pipeline engine: a sampler is a plain iterator of indices (a source), and
//! `store.get(key)` is an async function (a stage), so both plug into `spdl-exec` or any other executor.
//!
//! # Example
//!
//! ```
//! use spdl_source::sampler::{SamplerIter, ShuffledSampler};
//! use spdl_source::{Dataset, ObjectStore, open_store};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let root = tempfile::tempdir()?;
//! for class in ["cat", "dog"] {
//!     std::fs::create_dir_all(root.path().join(class))?;
//!     for i in 0..3 {
//!         std::fs::write(root.path().join(class).join(format!("{i}.jpg")), format!("{class} {i}"))?;
//!     }
//! }
//! // The same code reads "s3://bucket/train" or "https://host/train" with the matching feature.
//! let store = open_store(root.path().to_str().unwrap()).await?;
//! let dataset = Dataset::image_folder(root.path(), &["jpg"])?;
//!
//! let mut order = SamplerIter::new(ShuffledSampler::new(dataset.len(), 42));
//! for index in order.epoch_iter() {
//!     let record = &dataset.records()[index];
//!     let bytes = store.get(&record.key).await?;
//!     assert!(bytes.starts_with(dataset.classes()[record.label.unwrap() as usize].as_bytes()));
//! }
//! assert_eq!(order.epoch(), 1); // the epoch is done; `order.state()` would resume at epoch 1
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

pub mod dataset;
mod error;
pub mod sampler;
pub mod store;
pub mod tar_index;
mod walk;

pub use dataset::{Dataset, FolderLayout, ManifestFormat, Record};
pub use error::{Result, SourceError};
pub use sampler::{Sampler, SamplerIter, SamplerState};
#[cfg(feature = "http")]
pub use store::http::HttpStore;
pub use store::local::LocalStore;
#[cfg(feature = "s3")]
pub use store::s3::S3Store;
pub use store::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_MAX_OBJECT_SIZE, DedicatedStore, ObjectMeta, ObjectStore, ParallelRead,
    RetryPolicy, S3Options, StoreOptions, open_store, open_store_with,
};
