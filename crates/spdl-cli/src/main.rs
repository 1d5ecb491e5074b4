//! `spdl`: run the demo, benchmark an image dataset, inspect media, make test data.
//!
//! - `spdl demo` makes (once, cached) a deterministic dataset of ~2,000 photo-like JPEGs and runs the full
//!   image-loading pipeline on it: list → read (async) → decode + resize/crop (N threads) → batch → \[GPU\].
//! - `spdl bench PATH` runs the same pipeline over a directory (an ImageNet-style tree works), a file
//!   listing one path per line, or an object store: `spdl bench s3://bucket/prefix` (feature `s3`; `--endpoint`
//!   for S3-compatible servers) lists and reads it; `spdl bench KEYS.txt --store URL` reads listed keys from any
//!   store (features `s3`, `http`). The read stage then awaits the store's GETs (`--io-concurrency` in flight).
//! - `spdl bench --video DIR` (feature `ffmpeg`) runs the clip pipeline over a directory of videos: read →
//!   decode `--clips` clips of `--frames` frames each (N threads, one video each) → batch.
//! - `spdl probe FILE` prints what a media file holds.
//! - `spdl gen-data DIR` writes the synthetic corpora the tests and benchmarks use.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

mod clips;
mod corrupt;
mod data;
mod loader;
mod probe;
mod report;

/// Scalable and performant data loading: a thread-based pipeline that keeps GPUs fed.
#[derive(Debug, Parser)]
#[command(name = "spdl", about, disable_version_flag = true)]
struct Cli {
    /// Print the version, the JPEG decoder, the FFmpeg found and whether CUDA is built in (also after a
    /// command: `spdl probe --version`).
    #[arg(short = 'V', long, global = true)]
    version: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make the demo dataset (once, cached) and run the full image-loading pipeline on it.
    Demo {
        /// Where the demo dataset lives (default: $SPDL_DEMO_DIR, else ~/.cache/spdl-rs/demo-v1).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Number of images in the demo dataset.
        #[arg(long, default_value_t = 2000)]
        images: usize,
        #[command(flatten)]
        opts: LoaderArgs,
    },
    /// Run the image-loading pipeline over a directory of images, a file listing one path per line, or an
    /// object store (`s3://bucket/prefix`; builds with the `s3`/`http` features).
    Bench {
        /// A directory (walked recursively; class folders give labels), a list file, or an `s3://` address
        /// (listed; folders give labels).
        path: PathBuf,
        /// Read the keys of the list file PATH from this object store (`s3://bucket/prefix`,
        /// `https://host/path`) instead of local files.
        #[arg(long)]
        store: Option<String>,
        /// An S3-compatible server for `s3://` addresses (e.g. `http://127.0.0.1:9000`; path-style requests).
        /// Credentials and region come from the standard AWS chain (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, ...).
        #[arg(long)]
        endpoint: Option<String>,
        /// PATH is a directory of videos (mp4, mkv, webm, avi, mov): run the clip pipeline (read, decode
        /// --clips clips of --frames frames at --size x --size from each video, batch). Needs the `ffmpeg`
        /// feature.
        #[arg(long, conflicts_with_all = ["store", "endpoint"])]
        video: bool,
        /// Clips per video (with --video).
        #[arg(long, default_value_t = 4, requires = "video")]
        clips: usize,
        /// Consecutive frames per clip (with --video).
        #[arg(long, default_value_t = 16, requires = "video")]
        frames: usize,
        #[command(flatten)]
        opts: LoaderArgs,
    },
    /// Print the streams, codecs, duration, size, frame rate and sample rate of a media file.
    Probe {
        /// The file.
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write synthetic test corpora: photo-like images in an ImageNet-style tree.
    GenData {
        /// Output directory.
        dir: PathBuf,
        /// Number of images.
        #[arg(long, default_value_t = 2000)]
        images: usize,
        /// Number of class folders.
        #[arg(long, default_value_t = 10)]
        classes: usize,
        /// Seed of the generator (the same seed makes the same files).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Also write a corpus of broken media under DIR/corrupt.
        #[arg(long)]
        corrupt: bool,
    },
}

/// Options of the loading pipeline shared by `demo` and `bench`.
#[derive(Debug, Clone, Args)]
pub struct LoaderArgs {
    /// Decode threads (the blocking pool of the pipeline; default: the cores). Setting it (or
    /// --io-concurrency) turns the auto-tuner off unless --autotune is given too.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Images per batch.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Output side length (square).
    #[arg(long, default_value_t = 224)]
    pub size: u32,
    /// `center-crop`: resize the shorter side to size*256/224 then center-crop (ImageNet eval);
    /// `resize`: resize straight to size x size; `random-resized-crop`: a random crop of 8-100% of the area
    /// resized to size x size, flipped half the time (ImageNet training).
    #[arg(long, default_value = "center-crop", value_parser = spdl_io::image::TransformName::NAMES)]
    pub transform: String,
    /// Seed of `random-resized-crop` (torchvision's RandomResizedCrop(size) + RandomHorizontalFlip()): each
    /// image's crop and flip follow from the seed, the epoch and the image's place in the listing, whatever
    /// the threads and batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop after this many images per epoch.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Passes over the dataset.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Concurrent reads (default: 16 for local files, 64 for an object store, where each GET waits on the
    /// network; docs/benchmarks.md has the measurements behind these defaults).
    #[arg(long)]
    pub io_concurrency: Option<usize>,
    /// Normalize batches to f32 with ImageNet's mean/std (fused into the batch write).
    #[arg(long)]
    pub normalize: bool,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Do not draw the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Do not use the GPU even when one is available.
    #[arg(long)]
    pub no_gpu: bool,
    /// Tune the reads in flight, the batches decoded at once and the pool's threads while the run goes,
    /// starting from --io-concurrency and --threads; the report lists each change and why. On by default
    /// when neither --threads nor --io-concurrency is given (docs/benchmarks.md, "Autotune").
    #[arg(long, conflicts_with = "no_autotune")]
    pub autotune: bool,
    /// Keep --threads and --io-concurrency (or their defaults) as they are for the whole run.
    #[arg(long)]
    pub no_autotune: bool,
}

pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
}

/// What `spdl --version` prints: the version, the JPEG decoder, FFmpeg (found at run time, or why not) and
/// whether CUDA is built in.
fn version_text() -> String {
    let mut out = format!("spdl {}\njpeg: {}\n", env!("CARGO_PKG_VERSION"), spdl_io::image::jpeg_decoder());
    #[cfg(feature = "ffmpeg")]
    {
        let s = spdl_io::media::ffmpeg_status();
        match (s.available, s.error) {
            (true, _) => {
                let libs: Vec<String> = s.libraries.iter().map(|(l, v)| format!("{l} {v}")).collect();
                let how = s.backend.unwrap_or_default();
                out.push_str(&format!("ffmpeg: {} ({how})\n", libs.join(", ")));
            }
            (false, e) => out.push_str(&format!("ffmpeg: not available: {}\n", e.unwrap_or_default())),
        }
    }
    #[cfg(not(feature = "ffmpeg"))]
    out.push_str("ffmpeg: not built in (build with --features ffmpeg for video)\n");
    let cuda = if cfg!(feature = "cuda") { "built in (the driver is loaded at run time)" } else { "not built in" };
    out.push_str(&format!("cuda: {cuda}\n"));
    out
}

/// Runs the command; an error is printed with each of its causes once, on one line (`Error: what failed:
/// why: the OS error`), and the exit status is 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", spdl_report::error_chain(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    // `--version` needs no command: answer it before the command line is checked.
    if std::env::args().skip(1).any(|a| a == "--version" || a == "-V") {
        print!("{}", version_text());
        return Ok(());
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Demo { dir, images, opts } => {
            let dir = dir.unwrap_or_else(data::default_demo_dir);
            data::ensure_demo_dataset(&dir, images, !opts.json)?;
            loader::run(&dir, &opts, "demo", &loader::Remote::default())
        }
        Command::Bench { path, video: true, clips, frames, opts, .. } => {
            clips::run(&path, &opts, clips::ClipArgs { clips, frames })
        }
        Command::Bench { path, store, endpoint, opts, .. } => {
            loader::run(&path, &opts, "bench", &loader::Remote { store, endpoint })
        }
        Command::Probe { file, json } => probe::run(&file, json),
        Command::GenData { dir, images, classes, seed, corrupt } => {
            data::gen_data(&dir, images, classes, seed, corrupt)
        }
    }
}
