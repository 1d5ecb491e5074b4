//! The image-loading pipeline of `spdl demo` and `spdl bench`:
//! list → read bytes (async) → aggregate → decode + resize/crop the batch (blocking pool) → sink.
//!
//! Each batch is decoded by one call of [`BatchDecoder::decode`] on one pool thread, which writes every image
//! straight into its slot of the batch buffer: no per-image buffer is copied into the batch. Parallelism
//! comes from `--threads` batches in flight at once.
//!
//! With a GPU (feature `cuda`, a driver and a device at run time, and no `--no-gpu`), batches are built in
//! the pinned pool of [`spdl_cuda::Transfer`] and a last stage `h2d` queues each batch's copy on a dedicated
//! copy stream; the report then carries the H2D GB/s and the pinned pool's hit rate. Without one the run
//! says "no GPU: CPU batches" once and delivers host batches.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use spdl_buffer::{CachingPool, HeapBackend, Layout, PoolConfig, SharedAllocator};
use spdl_exec::{BuildOptions, OutputOrder, PipelineBuilder, Stage};
use spdl_io::image::{BatchDecoder, BatchOptions, Normalize, ResizeFilter, Transform};

use crate::LoaderArgs;
use crate::report::{Report, StageReport};
use crate::usage;

/// Where `spdl bench` reads bytes from when they are not local files: an object store (`s3://bucket/prefix`,
/// `http(s)://host/path`) given as the PATH (listed) or with `--store` (PATH is then a list file of its keys).
#[derive(Debug, Clone, Default)]
pub struct Remote {
    /// `--store URL`: read the keys of the list file PATH from this store.
    pub store: Option<String>,
    /// `--endpoint URL`: an S3-compatible server (path-style addressing), instead of AWS.
    pub endpoint: Option<String>,
}

/// Listed items: (path or key, label or -1).
type Items = Vec<(String, i64)>;

fn is_store_url(s: &str) -> bool {
    ["s3://", "http://", "https://"].iter().any(|p| s.starts_with(p))
}

/// The items, and the store to read them from (`None`: local files) when `path` or `--store` names one.
fn list_items(path: &Path, remote: &Remote) -> Result<(Items, Option<spdl_source::DedicatedStore>)> {
    let url = match (&remote.store, path.to_str()) {
        (Some(url), _) => url.clone(),
        (None, Some(p)) if is_store_url(p) => p.to_owned(),
        (None, _) => {
            if remote.endpoint.is_some() {
                bail!("--endpoint applies to s3:// stores (as PATH or --store)");
            }
            return Ok((list(path)?, None));
        }
    };
    let mut opts = spdl_source::StoreOptions::default();
    if let Some(endpoint) = &remote.endpoint {
        opts = opts.s3(spdl_source::S3Options { endpoint: Some(endpoint.clone()), ..Default::default() });
    }
    // One I/O thread of its own: the store's connections live on it, the pipeline's runtime only awaits.
    let opened = spdl_source::DedicatedStore::open(&url, &opts, 1).with_context(|| format!("cannot open {url}"))?;
    let store = opened.store();
    let dataset = if remote.store.is_some() {
        // Keys from the list file, as they are (relative to the store).
        spdl_source::Dataset::from_manifest(path)
            .with_context(|| format!("cannot read the list file {}", path.display()))?
    } else {
        // Class folders give labels; a store without any is listed flat (no labels), as a directory is.
        let layout = spdl_source::FolderLayout::Auto;
        opened
            .block_on(spdl_source::Dataset::from_store(&**store, "", IMAGE_EXTENSIONS, layout))
            .with_context(|| format!("cannot list {url} (an HTTP store cannot: give a list file and --store)"))?
    };
    let items: Items = dataset.iter().map(|r| (r.key.clone(), r.label.unwrap_or(-1))).collect();
    if items.is_empty() {
        bail!("no images ({}) found in {url}", IMAGE_EXTENSIONS.join(", "));
    }
    Ok((items, Some(opened)))
}

/// Extensions the listing keeps.
const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"];

/// One sample on its way to the decoder.
#[derive(Debug)]
struct Encoded {
    path: String,
    label: i64,
    /// Seeds the image's random transform (see [`item_key`]).
    key: u64,
    bytes: Vec<u8>,
}

/// The key of the `index`-th image of the listing in `epoch`: random crops differ across epochs and
/// images, and do not depend on which batch or thread decodes them.
fn item_key(epoch: usize, index: usize) -> u64 {
    ((epoch as u64) << 40) ^ index as u64
}

/// Where a batch's pixels are.
#[derive(Debug)]
enum Images {
    /// In host memory (pinned when a GPU is used, before the `h2d` stage).
    Host(spdl_buffer::Buffer),
    /// On the GPU; the copy may still be running (its event orders later work on the device).
    Device(spdl_cuda::DeviceBuffer),
}

/// A decoded batch as the training loop receives it.
#[derive(Debug)]
struct Batch {
    images: Images,
    labels: Vec<i64>,
    failed: usize,
}

impl Batch {
    fn outer_len(&self) -> usize {
        match &self.images {
            Images::Host(b) => b.shape()[0],
            Images::Device(d) => d.shape()[0],
        }
    }
}

/// Opens the GPU stage unless `--no-gpu`; `None` (with the reason printed once) when no GPU can be used.
fn open_gpu(args: &LoaderArgs) -> Result<Option<Arc<spdl_cuda::Transfer>>> {
    let say = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };
    if args.no_gpu {
        say("no GPU (--no-gpu): CPU batches");
        return Ok(None);
    }
    match spdl_cuda::Transfer::open_if_available(&spdl_cuda::TransferConfig::default()) {
        Ok(Some(t)) => {
            let name = t.device().name().unwrap_or_else(|_| "?".into());
            say(&format!("GPU {} ({name}): pinned batches, async H2D copies", t.device().index()));
            Ok(Some(Arc::new(t)))
        }
        Ok(None) => {
            say(if cfg!(feature = "cuda") {
                "no GPU: CPU batches"
            } else {
                "no GPU: CPU batches (built without the `cuda` feature)"
            });
            Ok(None)
        }
        Err(e) => Err(e).context("a GPU is present but could not be set up (use --no-gpu to run on CPU)"),
    }
}

/// Lists `path`: a directory (recursive walk; class folders become labels) or a file with one path per line.
fn list(path: &Path) -> Result<Vec<(String, i64)>> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot open {}", path.display()))?;
    if !meta.is_dir() && !meta.is_file() {
        // A FIFO would block the listing forever, /dev/zero would never end.
        bail!("{} is not a directory nor a regular file (a list of paths)", path.display());
    }
    let dataset = if meta.is_dir() {
        // Class folders give labels; a directory without any is listed flat (no labels), as a store is.
        spdl_source::Dataset::from_dir_with_layout(path, IMAGE_EXTENSIONS, spdl_source::FolderLayout::Auto)
            .with_context(|| format!("cannot list {}", path.display()))?
    } else {
        spdl_source::Dataset::from_manifest(path)
            .with_context(|| format!("cannot read the list file {}", path.display()))?
    };
    let base =
        if meta.is_dir() { path.to_path_buf() } else { path.parent().map(Path::to_path_buf).unwrap_or_default() };
    let items: Vec<(String, i64)> = dataset
        .iter()
        .map(|r| {
            let p = PathBuf::from(&r.key);
            let full = if p.is_absolute() { p } else { base.join(p) };
            (full.to_string_lossy().into_owned(), r.label.unwrap_or(-1))
        })
        .collect();
    if items.is_empty() {
        bail!("no images ({}) found in {}", IMAGE_EXTENSIONS.join(", "), path.display());
    }
    Ok(items)
}

fn transform(args: &LoaderArgs) -> Result<Transform> {
    if args.size == 0 {
        bail!("--size must be at least 1");
    }
    Ok(match args.transform.as_str() {
        "resize" => Transform::Resize { width: args.size, height: args.size, filter: ResizeFilter::Bilinear },
        "random-resized-crop" => Transform::imagenet_train(args.size, args.seed),
        _ => Transform::ResizeShorterCenterCrop {
            shorter: (args.size * 256).div_ceil(224),
            crop_width: args.size,
            crop_height: args.size,
            filter: ResizeFilter::Bilinear,
        },
    })
}

/// Most decode threads and concurrent reads: each is a thread or a task with its own buffers, and far
/// above what any machine can use (a request for 100,000 threads would fail to spawn them).
const MAX_THREADS: usize = 1024;
const MAX_IO_CONCURRENCY: usize = 4096;
const MAX_BATCH_SIZE: usize = 65_536;

/// Checks the arguments whose cost grows with their value before any of it is paid: thread and task
/// counts, and the bytes of one batch against the process's decode memory budget.
fn check_bounds(args: &LoaderArgs) -> Result<()> {
    if args.threads > MAX_THREADS {
        bail!("--threads {} is above the limit of {MAX_THREADS}", args.threads);
    }
    if args.io_concurrency.is_some_and(|c| c > MAX_IO_CONCURRENCY) {
        bail!("--io-concurrency is above the limit of {MAX_IO_CONCURRENCY}");
    }
    if args.batch_size > MAX_BATCH_SIZE {
        bail!("--batch-size {} is above the limit of {MAX_BATCH_SIZE}", args.batch_size);
    }
    let sample = if args.normalize { 4u64 } else { 1 };
    let batch_bytes = (args.batch_size as u64)
        .saturating_mul(u64::from(args.size))
        .saturating_mul(u64::from(args.size))
        .saturating_mul(3 * sample);
    let budget = spdl_io::decode_memory_budget();
    if batch_bytes > budget {
        bail!(
            "one batch of --batch-size {} at --size {} is {batch_bytes} bytes, above the decode memory budget of \
             {budget} bytes (a quarter of this machine's memory)",
            args.batch_size,
            args.size
        );
    }
    Ok(())
}

/// Runs the pipeline and prints the report (table or JSON).
pub fn run(path: &Path, args: &LoaderArgs, mode: &str, remote: &Remote) -> Result<()> {
    if args.threads == 0 || args.batch_size == 0 || args.epochs == 0 || args.io_concurrency == Some(0) {
        bail!("--threads, --batch-size, --epochs and --io-concurrency must be at least 1");
    }
    check_bounds(args)?;
    let (mut items, opened) = list_items(path, remote)?;
    // The store goes into the read stage; its runtime stays alive here until the pipeline is done.
    let store = opened.as_ref().map(|o| Arc::clone(o.store()));
    let io_concurrency = args.io_concurrency.unwrap_or(if store.is_some() { 64 } else { 16 });
    if let Some(limit) = args.limit {
        items.truncate(limit);
    }
    let per_epoch = items.len();
    let total = per_epoch.saturating_mul(args.epochs);

    let gpu = open_gpu(args)?;
    if !args.json && !cfg!(feature = "turbojpeg") {
        eprintln!(
            "JPEG: {} (full decodes); build with --features turbojpeg (needs cmake and nasm) to decode only what \
             the crop keeps with libjpeg-turbo",
            spdl_io::image::JPEG_DECODER
        );
    }
    // Batches are recycled either way: pinned blocks with a GPU, a heap pool without one (no mmap, page faults
    // and munmap per batch; RSS stays flat). A cap keeps a stalled consumer from growing it without bound.
    let (allocator, heap_pool): (SharedAllocator, _) = match &gpu {
        Some(t) => (t.allocator(), None),
        None => {
            let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig { max_bytes: 2 << 30 }));
            (pool.clone(), Some(pool))
        }
    };
    let decoder = Arc::new(
        BatchDecoder::new(
            BatchOptions {
                transform: transform(args)?,
                layout: Layout::Nhwc,
                normalize: args.normalize.then(Normalize::imagenet),
                strict: false,
                threads: Some(1),
                ..BatchOptions::default()
            },
            allocator,
        )
        .context("invalid decode options")?,
    );

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // Ctrl-C: stop feeding, print what was measured so far. A second Ctrl-C exits at once.
        let _ = ctrlc::set_handler(move || {
            if stop.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }

    let failed_images = Arc::new(AtomicU64::new(0));
    let epochs = args.epochs;
    // Each image carries a key that seeds its random transform: its place in the listing and the epoch.
    let source = (0..epochs).flat_map(move |epoch| {
        items.clone().into_iter().enumerate().map(move |(i, (path, label))| (path, label, item_key(epoch, i)))
    });
    let decode_failed = failed_images.clone();
    let builder = PipelineBuilder::new()
        .source(source)
        .pipe(
            Stage::map_async("read", move |(path, label, key): (String, i64, u64)| {
                let store = store.clone();
                async move {
                    match store {
                        // Regular files only, size-capped (a FIFO or /dev/zero in the list is refused).
                        None => {
                            let read = {
                                let path = path.clone();
                                tokio::task::spawn_blocking(move || {
                                    spdl_io::read_file(&path, &spdl_io::ReadLimits::default())
                                })
                            };
                            match read.await {
                                Ok(Ok(bytes)) => Ok(Encoded { path, label, key, bytes }),
                                Ok(Err(e)) => Err(e.to_string()),
                                Err(e) => Err(format!("{path}: cannot read: {e}")),
                            }
                        }
                        // The error names the object's full address, the attempts and the cause.
                        Some(store) => match store.get(&path).await {
                            Ok(bytes) => Ok(Encoded { path, label, key, bytes: Vec::from(bytes) }),
                            Err(e) => Err(e.to_string()),
                        },
                    }
                }
            })
            .concurrency(io_concurrency),
        )
        .aggregate(args.batch_size)
        .pipe(
            Stage::map("decode", move |batch: Vec<Encoded>| {
                let named: Vec<(&str, &[u8])> = batch.iter().map(|e| (e.path.as_str(), e.bytes.as_slice())).collect();
                let keys: Vec<u64> = batch.iter().map(|e| e.key).collect();
                let out = decoder.decode_keyed(&named, &keys)?;
                for f in &out.failures {
                    tracing::warn!(stage = "decode", item = %f.item, "image failed: {}", f.error);
                }
                decode_failed.fetch_add(out.failures.len() as u64, Ordering::Relaxed);
                Ok::<_, spdl_io::Error>(Batch {
                    images: Images::Host(out.buffer),
                    labels: batch.iter().map(|e| e.label).collect(),
                    failed: out.failures.len(),
                })
            })
            .concurrency(args.threads)
            .order(OutputOrder::Completion),
        );
    let builder = match &gpu {
        // One copy stream: copies queue in order on the copy engine and overlap decoding and compute.
        Some(t) => {
            let t = t.clone();
            builder.pipe(Stage::map("h2d", move |batch: Batch| match batch.images {
                Images::Host(host) => {
                    Ok(Batch { images: Images::Device(t.transfer(host)?), labels: batch.labels, failed: batch.failed })
                }
                Images::Device(_) => Ok::<_, spdl_cuda::Error>(batch),
            }))
        }
        None => builder,
    };
    let started = Instant::now();
    let pipeline = builder
        .sink(3)
        .build(BuildOptions { num_threads: args.threads, ..BuildOptions::default() })
        .context("cannot build the pipeline")?;

    let progress = if args.json || args.no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(total as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} images  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    };

    let cpu0 = usage::cpu_seconds();
    let t0 = Instant::now();
    let mut images = 0u64;
    let mut batches = 0u64;
    let mut interrupted = false;
    let mut error = None;
    let mut first_batch = None;
    let mut iter = pipeline.iter();
    loop {
        if stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        match iter.next_timeout(Duration::from_millis(100)) {
            None => break,
            Some(Ok(batch)) => {
                first_batch.get_or_insert_with(|| started.elapsed().as_secs_f64());
                let n = batch.labels.len();
                debug_assert_eq!(batch.outer_len(), n);
                images += (n - batch.failed) as u64;
                batches += 1;
                progress.inc(n as u64);
            }
            Some(Err(e)) if e.is_timeout() => continue,
            Some(Err(e)) => {
                error = Some(e);
                break;
            }
        }
    }
    pipeline.stop();
    progress.finish_and_clear();
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = usage::cpu_seconds() - cpu0;
    let stats = pipeline.stats();
    let transfer = match &gpu {
        Some(t) => {
            // Let the last copies finish so the figures cover every batch.
            if let Err(e) = t.synchronize() {
                tracing::warn!(stage = "h2d", "waiting for the last copies failed: {e}");
            }
            Some(t.stats())
        }
        None => None,
    };
    // Failed reads are counted by the pipeline (stage "read"); failed decodes inside a batch by the decoder.
    let read_failed = stats.stage("read").map(|s| s.items_failed).unwrap_or(0);
    let decode_stage_failed = stats.stage("decode").map(|s| s.items_failed).unwrap_or(0);
    let report = Report {
        mode: mode.to_string(),
        path: path.display().to_string(),
        images,
        failed: failed_images.load(Ordering::Relaxed) + read_failed,
        failed_batches: decode_stage_failed,
        batches,
        seconds,
        first_batch_seconds: first_batch,
        images_per_sec: images as f64 / seconds.max(1e-9),
        cpu_seconds: cpu,
        images_per_cpu_second: images as f64 / cpu.max(1e-9),
        peak_rss_bytes: usage::peak_rss_bytes(),
        threads: args.threads,
        batch_size: args.batch_size,
        size: args.size,
        epochs: args.epochs,
        interrupted,
        gpu: gpu.is_some(),
        h2d_gbps: transfer.and_then(|t| t.h2d_gbps()),
        h2d_bytes: transfer.map(|t| t.bytes),
        pinned_hit_rate: transfer.and_then(|t| t.pool).map(|p| p.hit_rate()),
        batch_pool_hit_rate: transfer
            .and_then(|t| t.pool)
            .or_else(|| heap_pool.as_ref().map(|p| p.stats()))
            .map_or(0.0, |p| p.hit_rate()),
        bottleneck: stats.bottleneck().map(|s| s.name.clone()),
        stages: stats.stages.iter().map(StageReport::from).collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{stats}");
        report.print_summary();
    }
    if let Some(e) = error {
        return Err(e).context("the pipeline stopped on an error");
    }
    if report.images == 0 && report.failed > 0 && !interrupted {
        // A run that loaded nothing is a failed run, whatever the table says (wrong root, unreadable listing
        // paths, a corpus of one unsupported format): exit non-zero so scripts and CI notice.
        bail!(
            "no image was loaded from {}: all {} failed (each is named in the warnings above)",
            path.display(),
            report.failed
        );
    }
    Ok(())
}
