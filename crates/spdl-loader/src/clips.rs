//! The video-clip recipe (feature `video`): list videos, read their bytes through the store, decode a few
//! clips of each, batch them.
//!
//! ```text
//! Listing ──> read (async, ObjectStore) ──> decode (blocking, one video each) ──> aggregate ──> batch ──> ClipBatch
//!             spdl-source                  spdl-io: demux + sample + plan + decode_clips
//! ```

use std::sync::Arc;

use spdl_buffer::{Buffer, CachingPool, HeapBackend, PoolConfig, PoolStats, SharedAllocator};
use spdl_exec::{BuildOptions, FailureBudget, OutputOrder, Pipeline, PipelineBuilder, Stage};
use spdl_io::MediaInput;
use spdl_io::video::{ClipOptions, ClipSampler, ClipStats, ClipStep, PastEnd, load_sampled_clips};

use crate::{Listing, LoaderError, Sample, check_pipeline_options, item_key};

/// Most frames one video gives (`num_clips * num_frames`).
pub const MAX_CLIP_FRAMES: usize = 1 << 16;
/// Largest side of a clip frame.
pub const MAX_CLIP_SIDE: u32 = 8192;

/// How the clips of a video are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClipSampling {
    /// Start frames drawn at random among those whose clip fits, from the seed, the epoch and the video's
    /// place in the listing (default).
    #[default]
    Random,
    /// Start frames evenly spaced over the video.
    Regular,
}

/// Options of a [`ClipLoader`].
#[derive(Debug, Clone)]
pub struct ClipLoaderOptions {
    /// Videos per batch (default 8).
    pub batch_size: usize,
    /// Videos decoded at once, and the threads of the pipeline's pool (default 4).
    pub threads: usize,
    /// Reads in flight (default: 8 for local files, 32 for an object store).
    pub io_concurrency: Option<usize>,
    /// Passes over the listing (default 1).
    pub epochs: usize,
    /// Clips per video (default 4).
    pub num_clips: usize,
    /// Consecutive frames per clip (default 16).
    pub num_frames: usize,
    /// Output `(width, height)` of the frames (default 112x112); `None` keeps each video's coded size.
    pub size: Option<(u32, u32)>,
    /// How clips are placed (default: random).
    pub sampling: ClipSampling,
    /// The seed of [`ClipSampling::Random`].
    pub seed: u64,
    /// Order of the batches: as they are decoded (default), or in the listing's order.
    pub order: OutputOrder,
    /// The failures the whole pipeline tolerates (default: unlimited; each failure is logged).
    pub failure_budget: FailureBudget,
    /// Most bytes of clip buffers kept for reuse (default 1 GiB).
    pub pool_bytes: usize,
}

impl Default for ClipLoaderOptions {
    fn default() -> Self {
        Self {
            batch_size: 8,
            threads: 4,
            io_concurrency: None,
            epochs: 1,
            num_clips: 4,
            num_frames: 16,
            size: Some((112, 112)),
            sampling: ClipSampling::Random,
            seed: 0,
            order: OutputOrder::Completion,
            failure_budget: FailureBudget::Unlimited,
            pool_bytes: 1 << 30,
        }
    }
}

impl ClipLoaderOptions {
    fn check(&self) -> Result<(), LoaderError> {
        let bad = |option, reason: String| Err(LoaderError::InvalidOption { option, reason });
        check_pipeline_options(self.threads, self.batch_size, self.io_concurrency, self.epochs)?;
        if self.num_clips == 0 || self.num_frames == 0 {
            return bad("num_clips", "clips and frames per clip must be at least 1".into());
        }
        let frames = self.num_clips.saturating_mul(self.num_frames);
        if frames > MAX_CLIP_FRAMES {
            return bad(
                "num_frames",
                format!(
                    "{} clips of {} frames is {frames} frames a video, above {MAX_CLIP_FRAMES}",
                    self.num_clips, self.num_frames
                ),
            );
        }
        if let Some((w, h)) = self.size {
            if w == 0 || h == 0 || w > MAX_CLIP_SIDE || h > MAX_CLIP_SIDE {
                return bad("size", format!("each side must be within 1..={MAX_CLIP_SIDE}, got {w}x{h}"));
            }
            // One video's clips, checked against the process's decode memory budget before any is paid.
            let bytes = (frames as u64).saturating_mul(u64::from(w) * u64::from(h) * 3);
            let budget = spdl_io::decode_memory_budget();
            if bytes > budget {
                return bad(
                    "size",
                    format!(
                        "{frames} frames of {w}x{h} are {bytes} bytes a video, above the decode memory budget of \
                         {budget} bytes"
                    ),
                );
            }
        }
        Ok(())
    }

    fn sampler(&self, key: u64) -> ClipSampler {
        match self.sampling {
            ClipSampling::Random => {
                // A different draw for every video and epoch, the same whatever thread decodes it.
                let seed = self.seed ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                ClipSampler::RandomIndices { num_clips: self.num_clips, seed }
            }
            ClipSampling::Regular => ClipSampler::RegularIndices { num_clips: self.num_clips },
        }
    }
}

/// A batch of videos' clips, as the training loop receives it.
#[derive(Debug)]
pub struct ClipBatch {
    /// One `[clips, T, H, W, 3]` `u8` buffer per video that decoded.
    pub clips: Vec<Buffer>,
    /// One label per buffer of `clips` (-1: none).
    pub labels: Vec<i64>,
    /// Where each video came from (the store's address of its key).
    pub items: Vec<String>,
    /// Frames decoded (and skipped) per video.
    pub stats: Vec<ClipStats>,
    /// Videos of this batch that failed; always 0 here, as a failed video is a failed item of `read` or
    /// `decode` and leaves no slot.
    pub failed: usize,
}

impl ClipBatch {
    /// Videos in the batch.
    pub fn len(&self) -> usize {
        self.clips.len()
    }

    /// Whether the batch holds no video.
    pub fn is_empty(&self) -> bool {
        self.clips.is_empty()
    }

    /// Clips in the batch (over all its videos).
    pub fn num_clips(&self) -> usize {
        self.clips.iter().map(|b| b.shape().first().copied().unwrap_or(0)).sum()
    }

    /// The videos' clips in one `[B, clips, T, H, W, 3]` buffer from `allocator` (one copy of each), for a
    /// training step that wants one tensor. The videos must share a shape (a fixed `size`).
    ///
    /// ```
    /// use spdl_buffer::{Buffer, DType, Layout, system_allocator};
    /// use spdl_loader::ClipBatch;
    ///
    /// let one = || Buffer::zeros(DType::U8, &[2, 4, 8, 8, 3], Layout::Nhwc, &system_allocator()).unwrap();
    /// let batch = ClipBatch { clips: vec![one(), one()], labels: vec![0, 1], items: vec![], stats: vec![], failed: 0 };
    /// assert_eq!(batch.stack(&system_allocator())?.shape(), &[2, 2, 4, 8, 8, 3]);
    /// # Ok::<(), spdl_loader::LoaderError>(())
    /// ```
    pub fn stack(&self, allocator: &SharedAllocator) -> Result<Buffer, LoaderError> {
        let shape: Vec<usize> = self.clips.first().map(|b| b.shape().to_vec()).unwrap_or_else(|| vec![0, 0, 0, 0, 3]);
        if let Some((i, b)) = self.clips.iter().enumerate().find(|(_, b)| b.shape() != shape.as_slice()) {
            return Err(LoaderError::InvalidOption {
                option: "size",
                reason: format!(
                    "video {i} of the batch has clips of shape {:?}, the first {shape:?}: give a fixed size to \
                     stack a batch",
                    b.shape()
                ),
            });
        }
        let mut full = vec![self.clips.len()];
        full.extend_from_slice(&shape);
        let mut out =
            Buffer::zeros(spdl_buffer::DType::U8, &full, spdl_buffer::Layout::Nhwc, allocator).map_err(|e| {
                LoaderError::InvalidOption {
                    option: "batch_size",
                    reason: format!("cannot allocate the batch: {}", spdl_report::error_chain(&e)),
                }
            })?;
        let per: usize = shape.iter().product();
        if per > 0 {
            for (dst, src) in out.as_bytes_mut().chunks_exact_mut(per).zip(&self.clips) {
                dst.copy_from_slice(src.as_bytes());
            }
        }
        Ok(out)
    }
}

struct EncodedVideo {
    location: String,
    label: i64,
    key: u64,
    bytes: Vec<u8>,
}

struct DecodedVideo {
    location: String,
    label: i64,
    clips: Buffer,
    stats: ClipStats,
}

/// The video-clip pipeline: list → read → decode (one video each: demux, sample clips, decode them into
/// one `[clips, T, H, W, 3]` buffer) → batch.
///
/// ```no_run
/// use spdl_loader::{ClipLoader, ClipLoaderOptions, ListOptions, Listing, VIDEO_EXTENSIONS};
///
/// let listing = Listing::open_with_extensions("videos/", &ListOptions::default(), VIDEO_EXTENSIONS)?;
/// let loader = ClipLoader::new(listing, ClipLoaderOptions { num_clips: 2, num_frames: 8, ..Default::default() })?;
/// for batch in loader.pipeline() {
///     let batch = batch?;
///     for clips in &batch.clips {
///         assert_eq!(clips.shape(), &[2, 8, 112, 112, 3]);
///     }
/// }
/// println!("{}", loader.pipeline().stats());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ClipLoader {
    // Dropped first: the pipeline's stages hold clones of the store.
    pipeline: Pipeline<ClipBatch>,
    pool: Arc<CachingPool<HeapBackend>>,
    listing: Listing,
}

impl std::fmt::Debug for ClipLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipLoader").field("listing", &self.listing).finish()
    }
}

impl ClipLoader {
    /// Builds the pipeline over `listing` (it starts on the first batch asked).
    pub fn new(listing: Listing, opts: ClipLoaderOptions) -> Result<Self, LoaderError> {
        opts.check()?;
        let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig { max_bytes: opts.pool_bytes }));
        let allocator: SharedAllocator = pool.clone();
        let io_concurrency = opts.io_concurrency.unwrap_or(if listing.is_remote() { 32 } else { 8 });
        let store = Arc::clone(listing.store.store());
        let handle = listing.store.handle().clone();
        let samples = Arc::new(listing.samples.clone());
        let source = (0..opts.epochs).flat_map(move |epoch| {
            let samples = Arc::clone(&samples);
            (0..samples.len()).map(move |i| (epoch, i, Arc::clone(&samples)))
        });
        let read = Stage::map_async("read", move |(epoch, i, samples): (usize, usize, Arc<Vec<Sample>>)| {
            let store = Arc::clone(&store);
            let handle = handle.clone();
            async move {
                let Sample { key, label } = samples[i].clone();
                let location = store.location(&key);
                let task = handle.spawn(async move { store.get(&key).await });
                match task.await {
                    Ok(Ok(bytes)) => {
                        Ok(EncodedVideo { location, label, key: item_key(epoch, i), bytes: Vec::from(bytes) })
                    }
                    Ok(Err(e)) => Err(spdl_report::error_chain(&e)),
                    Err(e) => Err(format!("{location}: the read was cancelled: {e}")),
                }
            }
        })
        .concurrency(io_concurrency);
        let clip_opts = ClipOptions { size: opts.size, ..ClipOptions::default() };
        let (num_frames, frame_bytes) = (opts.num_frames, opts.size.map_or(112 * 112 * 3, |(w, h)| w * h * 3));
        let video_bytes = (opts.num_clips * opts.num_frames) as u64 * u64::from(frame_bytes);
        let sampling = opts.clone();
        let decode = Stage::map("decode", move |v: EncodedVideo| {
            // spdl-io's errors name the item; the location is added where one does not.
            let fail = |e: spdl_io::Error| {
                let msg = spdl_report::error_chain(&e);
                if msg.contains(&v.location) { msg } else { format!("{}: {msg}", v.location) }
            };
            let input = MediaInput::bytes(&v.bytes, &v.location);
            let sampler = sampling.sampler(v.key);
            let clips = load_sampled_clips(
                input,
                sampler,
                num_frames,
                ClipStep::Stride(1),
                PastEnd::RepeatLast,
                &clip_opts,
                &allocator,
            )
            .map_err(fail)?;
            Ok::<_, String>(DecodedVideo {
                location: v.location.clone(),
                label: v.label,
                clips: clips.buffer,
                stats: clips.stats,
            })
        })
        .concurrency(opts.threads)
        .item_bytes(video_bytes)
        .order(opts.order);
        let batch = Stage::map("batch", |videos: Vec<DecodedVideo>| {
            let mut out = ClipBatch {
                clips: Vec::with_capacity(videos.len()),
                labels: Vec::with_capacity(videos.len()),
                items: Vec::with_capacity(videos.len()),
                stats: Vec::with_capacity(videos.len()),
                failed: 0,
            };
            for v in videos {
                out.clips.push(v.clips);
                out.labels.push(v.label);
                out.items.push(v.location);
                out.stats.push(v.stats);
            }
            Ok::<_, String>(out)
        });
        let build =
            BuildOptions { num_threads: opts.threads, failure_budget: opts.failure_budget, ..BuildOptions::default() };
        let pipeline = PipelineBuilder::new()
            .source(source)
            .pipe(read)
            .pipe(decode)
            .aggregate(opts.batch_size)
            .pipe(batch)
            .sink(3)
            .build(build)?;
        Ok(Self { pipeline, pool, listing })
    }

    /// The pipeline: iterate it for batches, read its stats, stop it.
    pub fn pipeline(&self) -> &Pipeline<ClipBatch> {
        &self.pipeline
    }

    /// The clip buffer pool's stats.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Videos per epoch.
    pub fn videos_per_epoch(&self) -> usize {
        self.listing.samples.len()
    }

    /// Failed videos so far: failed reads and failed decodes.
    pub fn failed_videos(&self) -> u64 {
        let stats = self.pipeline.stats();
        let read = stats.stage("read").map_or(0, |s| s.items_failed);
        let decode = stats.stage("decode").map_or(0, |s| s.items_failed);
        read + decode
    }
}
