//! Decode throughput of whole audio or video files across threads, as one JSON line.
//!
//! The Rust side of `benches/compare/av_compare.py` (spdl-rs against Meta's SPDL `load_audio` /
//! `load_video`), usable on its own:
//!
//! ```sh
//! cargo run --release -p spdl-io --example av_throughput --features ffmpeg-linked -- \
//!     video --threads 2 --repeat 3 a.mp4 b.mp4
//! cargo run --release -p spdl-io --example av_throughput -- audio --threads 1 --list files.txt
//! ```
//!
//! Every file is decoded `--repeat` times by `--threads` std threads that take the next job from a shared
//! atomic index. The job is the same as the Python one: audio, the whole file as `f32` `[C, T]` at the
//! source rate and channel count ([`AudioOptions::default`]); video, every frame as RGB24 `[N, H, W, 3]` at
//! the coded size with one decoder thread per video ([`VideoOptions::default`], feature `ffmpeg`).
//!
//! The first file is decoded once before the clock starts (library initialisation, as in the Python
//! runner). Output fields: `items` (decodes), `failed`, `seconds` (wall time of the decode loop),
//! `cpu_seconds` (user + system time of the process over the loop, from `getrusage`), `audio_seconds`
//! and `frames` decoded (audio: samples per channel; video: frames), `peak_rss_mib` (`ru_maxrss`), and
//! `shapes` (the output shape of each file's first decode, to check both loaders agree).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use spdl_buffer::{SharedAllocator, system_allocator};
use spdl_io::audio::{AudioBackend, AudioOptions, decode_audio};

const USAGE: &str = "usage: av_throughput (audio|video) [--threads T] [--repeat R] [--backend auto|symphonia|ffmpeg] \
                     [--list FILE] FILE...";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Audio,
    Video,
}

#[derive(Debug)]
struct Args {
    kind: Kind,
    threads: usize,
    repeat: usize,
    /// Audio decoder (`--backend`, default auto).
    backend: AudioBackend,
    files: Vec<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let kind = match it.next().as_deref() {
        Some("audio") => Kind::Audio,
        Some("video") => Kind::Video,
        Some("-h" | "--help") | None => return Err(USAGE.into()),
        Some(other) => return Err(format!("unknown kind {other:?}\n{USAGE}")),
    };
    let (mut threads, mut repeat, mut files) = (1usize, 1usize, Vec::new());
    let mut backend = AudioBackend::Auto;
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--threads" => threads = parse_count("--threads", &value("--threads")?)?,
            "--repeat" => repeat = parse_count("--repeat", &value("--repeat")?)?,
            "--backend" => {
                backend = match value("--backend")?.as_str() {
                    "auto" => AudioBackend::Auto,
                    "symphonia" => AudioBackend::Symphonia,
                    "ffmpeg" => AudioBackend::Ffmpeg,
                    other => return Err(format!("--backend takes auto, symphonia or ffmpeg, got {other:?}")),
                }
            }
            "--list" => {
                let list = value("--list")?;
                let text = std::fs::read_to_string(&list).map_err(|e| format!("{list}: {e}"))?;
                files.extend(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(PathBuf::from));
            }
            "-h" | "--help" => return Err(USAGE.into()),
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}\n{USAGE}")),
            path => files.push(PathBuf::from(path)),
        }
    }
    if files.is_empty() {
        return Err(format!("no input files\n{USAGE}"));
    }
    Ok(Args { kind, threads, repeat, backend, files })
}

fn parse_count(name: &str, s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{name} must be an integer >= 1, got {s:?}")),
    }
}

/// What one decode yielded.
struct Decoded {
    shape: Vec<usize>,
    audio_seconds: f64,
    /// Audio: frames (samples per channel); video: frames.
    frames: u64,
}

fn decode_one(args: &Args, path: &Path, alloc: &SharedAllocator) -> Result<Decoded, spdl_io::Error> {
    match args.kind {
        Kind::Audio => {
            let audio = decode_audio(path, &AudioOptions { backend: args.backend, ..AudioOptions::default() }, alloc)?;
            Ok(Decoded {
                shape: audio.buffer.shape().to_vec(),
                audio_seconds: audio.frames as f64 / f64::from(audio.sample_rate),
                frames: audio.frames as u64,
            })
        }
        Kind::Video => decode_video(path, alloc),
    }
}

#[cfg(feature = "ffmpeg")]
fn decode_video(path: &Path, alloc: &SharedAllocator) -> Result<Decoded, spdl_io::Error> {
    let frames = spdl_io::video::decode_video(path, &spdl_io::video::VideoOptions::default(), alloc)?;
    let shape = frames.buffer.shape().to_vec();
    let n = shape.first().copied().unwrap_or(0) as u64;
    Ok(Decoded { shape, audio_seconds: 0.0, frames: n })
}

#[cfg(not(feature = "ffmpeg"))]
fn decode_video(_path: &Path, _alloc: &SharedAllocator) -> Result<Decoded, spdl_io::Error> {
    Err(spdl_io::Error::InvalidOptions("video needs spdl-io's `ffmpeg` feature (--features ffmpeg-linked)".into()))
}

/// Totals over all threads.
#[derive(Default)]
struct Totals {
    items: u64,
    failed: u64,
    audio_seconds: f64,
    frames: u64,
    first_error: Option<String>,
    shapes: BTreeMap<usize, Vec<usize>>,
}

fn run(args: &Args) -> Totals {
    let alloc = system_allocator();
    let jobs = args.files.len() * args.repeat;
    let next = AtomicUsize::new(0);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|s| {
        for _ in 0..args.threads {
            s.spawn(|| {
                let mut local = Totals::default();
                loop {
                    let job = next.fetch_add(1, Ordering::Relaxed);
                    if job >= jobs {
                        break;
                    }
                    let file = job % args.files.len();
                    let Some(path) = args.files.get(file) else { break };
                    match decode_one(args, path, &alloc) {
                        Ok(d) => {
                            local.items += 1;
                            local.audio_seconds += d.audio_seconds;
                            local.frames += d.frames;
                            local.shapes.entry(file).or_insert(d.shape);
                        }
                        Err(e) => {
                            local.failed += 1;
                            local.first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                // A poisoned lock means another worker panicked; its totals are lost but ours still count.
                let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                t.items += local.items;
                t.failed += local.failed;
                t.audio_seconds += local.audio_seconds;
                t.frames += local.frames;
                if t.first_error.is_none() {
                    t.first_error = local.first_error;
                }
                for (k, v) in local.shapes {
                    t.shapes.entry(k).or_insert(v);
                }
            });
        }
    });
    totals.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// `(user + system CPU seconds, peak RSS in KiB)` of this process.
#[cfg(target_os = "linux")]
fn rusage() -> Option<(f64, u64)> {
    use std::ffi::{c_int, c_long};
    #[repr(C)]
    struct Timeval {
        sec: c_long,
        usec: c_long,
    }
    #[repr(C)]
    struct Rusage {
        utime: Timeval,
        stime: Timeval,
        maxrss: c_long,
        rest: [c_long; 13],
    }
    unsafe extern "C" {
        fn getrusage(who: c_int, usage: *mut Rusage) -> c_int;
    }
    const RUSAGE_SELF: c_int = 0;
    let mut ru =
        Rusage { utime: Timeval { sec: 0, usec: 0 }, stime: Timeval { sec: 0, usec: 0 }, maxrss: 0, rest: [0; 13] };
    // SAFETY: `Rusage` has the layout of Linux's `struct rusage` (two `struct timeval` of two longs, then 14
    // longs); getrusage only writes into the struct we own for the duration of the call.
    let rc = unsafe { getrusage(RUSAGE_SELF, &mut ru) };
    let secs = |t: &Timeval| t.sec as f64 + t.usec as f64 * 1e-6;
    (rc == 0).then(|| (secs(&ru.utime) + secs(&ru.stime), u64::try_from(ru.maxrss).unwrap_or(0)))
}

#[cfg(not(target_os = "linux"))]
fn rusage() -> Option<(f64, u64)> {
    None
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "null".into(), |x| format!("{x:.digits$}"))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let alloc = system_allocator();
    if let Some(first) = args.files.first()
        && let Err(e) = decode_one(&args, first, &alloc)
    {
        eprintln!("warm-up decode failed: {e}");
        return ExitCode::FAILURE;
    }
    drop(alloc);
    let before = rusage();
    let start = Instant::now();
    let totals = run(&args);
    let seconds = start.elapsed().as_secs_f64();
    let after = rusage();
    let cpu = before.zip(after).map(|((c0, _), (c1, _))| c1 - c0);
    let peak_rss_mib = after.map(|(_, kib)| kib as f64 / 1024.0);

    let shapes: Vec<String> = totals
        .shapes
        .iter()
        .filter_map(|(&i, shape)| {
            let path = args.files.get(i)?;
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            Some(format!("{}:[{}]", json_str(&path.to_string_lossy()), dims.join(",")))
        })
        .collect();
    let kind = match args.kind {
        Kind::Audio => "audio",
        Kind::Video => "video",
    };
    println!(
        "{{\"runner\":\"spdl-rs\",\"kind\":\"{kind}\",\"threads\":{},\"repeat\":{},\"items\":{},\"failed\":{},\
         \"seconds\":{seconds:.6},\"cpu_seconds\":{},\"audio_seconds\":{:.3},\"frames\":{},\"peak_rss_mib\":{},\
         \"first_error\":{},\"shapes\":{{{}}}}}",
        args.threads,
        args.repeat,
        totals.items,
        totals.failed,
        json_opt(cpu, 6),
        totals.audio_seconds,
        totals.frames,
        json_opt(peak_rss_mib, 1),
        totals.first_error.as_deref().map_or_else(|| "null".into(), json_str),
        shapes.join(","),
    );
    if totals.failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
