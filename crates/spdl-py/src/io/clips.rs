//! `spdl_rs.io` clips (feature `ffmpeg`): `load_clips` (one video, explicit starts), the samplers
//! (`clips_at_random_indices`, ...), `load_clips_batch` (many videos into one `[B, clips, T, H, W, C]` buffer)
//! and their native ops. Each video is demuxed once and each GOP its clips need decoded once (spdl-io's clip
//! plan). Every function releases the GIL for its whole duration.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use spdl_buffer::{Buffer, DType, Layout, system_allocator};
use spdl_io::video::{
    ClipOptions, ClipRequest, ClipSampler, ClipStarts, ClipStats, ClipStep, Clips, DemuxOptions, MAX_SAMPLED_CLIPS,
    PastEnd, Timeline, decode_clips_into, demux_video, load_clips as load_clips_rs, load_sampled_clips, plan_on,
};

use super::media::limits_from;
use super::options::{KeywordOptions, missing};
use super::video::{pixel_format, scale_filter};
use super::{Src, buffer_result, interruptible, io_err, media_src, src_from_py, src_from_value};
use crate::error::Error;
use crate::pipeline::{NativeOp, PyNativeOp};
use crate::value::Value;

/// Most videos in one `load_clips_batch` call.
const MAX_BATCH: usize = 1 << 16;
/// Most threads of one `load_clips_batch` call.
const MAX_THREADS: usize = 1024;

keyword_options! {
    /// How clips are decoded: the output, the policy past the end, and the unit of the starts.
    struct ClipOutputArgs {
        by: String as "Literal[\"index\", \"time\"]" = "index".to_owned(),
        width: Option<u32> = None,
        height: Option<u32> = None,
        pix_fmt: String = "rgb24".to_owned(),
        filter: String = "bicubic".to_owned(),
        policy: String as "Literal[\"error\", \"repeat_last\", \"wrap\", \"pad\"]" = "error".to_owned(),
        threads: usize = 1,
        skip_unused: bool = true,
        limits: Option<Py<PyDict>> as "dict[str, int] | None" = None,
    }
}

keyword_options! {
    /// How clips are taken and decoded: the step between frames (``stride`` frames or ``fps``), and the output.
    struct ClipArgs [output: ClipOutputArgs] {
        stride: usize = 1,
        fps: Option<f64> = None,
    }
}

/// The spdl-io form of [`ClipArgs`], checked once.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClipSpec {
    step: ClipStep,
    by_time: bool,
    past_end: PastEnd,
    opts: ClipOptions,
}

impl ClipArgs {
    pub(super) fn spec(&self, py: Python<'_>) -> PyResult<ClipSpec> {
        let step = match (self.fps, self.stride) {
            (Some(f), 1) => ClipStep::Fps(f),
            (Some(_), _) => return Err(PyValueError::new_err("give fps or stride, not both")),
            (None, k) => ClipStep::Stride(k),
        };
        let by_time = match self.output.by.as_str() {
            "index" => false,
            "time" => true,
            other => return Err(PyValueError::new_err(format!("by must be \"index\" or \"time\", got {other:?}"))),
        };
        let size = match (self.output.width, self.output.height) {
            (None, None) => None,
            (Some(w), Some(h)) => Some((w, h)),
            _ => return Err(PyValueError::new_err("give both width and height (or neither, for the coded size)")),
        };
        let opts = ClipOptions {
            size,
            pixel_format: pixel_format(&self.output.pix_fmt)?,
            filter: scale_filter(&self.output.filter)?,
            threads: self.output.threads,
            skip_unused: self.output.skip_unused,
            limits: limits_from(self.output.limits.as_ref().map(|l| l.bind(py)))?,
        };
        opts.validate().map_err(io_err)?;
        let spec = ClipSpec { step, by_time, past_end: PastEnd::from_name(&self.output.policy).map_err(io_err)?, opts };
        // What does not depend on the video, checked here rather than per video.
        ClipRequest { starts: ClipStarts::Indices(Vec::new()), num_frames: 1, step, past_end: spec.past_end }
            .validate()
            .map_err(io_err)?;
        Ok(spec)
    }
}

/// Where clips start: given, or drawn by a sampler from each video.
#[derive(Debug, Clone)]
pub(super) enum Starts {
    Given(ClipStarts),
    Sampled(ClipSampler),
}

/// The starts of `obj` (a sequence of numbers): frame indices, or seconds with `by="time"`.
fn starts_from(obj: &Bound<'_, PyAny>, by_time: bool) -> PyResult<ClipStarts> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err("starts must be a sequence of numbers"));
    }
    let mut n = 0usize;
    let items = obj.try_iter().map_err(|_| PyTypeError::new_err("starts must be a sequence of numbers"))?;
    if by_time {
        let mut v = Vec::new();
        for x in items {
            n += 1;
            if n > MAX_SAMPLED_CLIPS {
                return Err(PyValueError::new_err(format!("more than {MAX_SAMPLED_CLIPS} clip starts")));
            }
            v.push(x?.extract::<f64>().map_err(|_| PyTypeError::new_err("starts must be numbers (seconds)"))?);
        }
        Ok(ClipStarts::Times(v))
    } else {
        let mut v = Vec::new();
        for x in items {
            n += 1;
            if n > MAX_SAMPLED_CLIPS {
                return Err(PyValueError::new_err(format!("more than {MAX_SAMPLED_CLIPS} clip starts")));
            }
            let x = x?;
            let i: i64 = x.extract().map_err(|_| {
                PyTypeError::new_err("starts must be integer frame indices (or seconds, with by=\"time\")")
            })?;
            v.push(u64::try_from(i).map_err(|_| PyValueError::new_err(format!("clip start {i} is negative")))?);
        }
        Ok(ClipStarts::Indices(v))
    }
}

/// The sampler named `name`.
pub(super) fn sampler(name: &str, num_clips: Option<usize>, seed: u64, fps: Option<f64>) -> PyResult<ClipSampler> {
    let clips = |num_clips: Option<usize>| num_clips.ok_or_else(|| missing(name, "num_clips"));
    Ok(match name {
        "random_indices" => ClipSampler::RandomIndices { num_clips: clips(num_clips)?, seed },
        "regular_indices" => ClipSampler::RegularIndices { num_clips: clips(num_clips)? },
        "random_timestamps" => ClipSampler::RandomTimes { num_clips: clips(num_clips)?, seed },
        "regular_timestamps" => ClipSampler::RegularTimes { num_clips: clips(num_clips)? },
        "all_at_fps" => ClipSampler::AllAtFps { fps: fps.ok_or_else(|| missing(name, "fps"))? },
        other => {
            return Err(PyValueError::new_err(format!(
                "sampler must be \"random_indices\", \"regular_indices\", \"random_timestamps\", \
                 \"regular_timestamps\" or \"all_at_fps\", got {other:?}"
            )));
        }
    })
}

fn check_clip_count(n: usize) -> PyResult<()> {
    if n > MAX_SAMPLED_CLIPS {
        return Err(PyValueError::new_err(format!("num_clips {n} is above {MAX_SAMPLED_CLIPS}")));
    }
    Ok(())
}

/// One video's packets and plan, ready to decode.
struct Planned {
    packets: spdl_io::video::Packets,
    plan: spdl_io::video::ClipPlan,
}

/// Demuxes `src` and plans its clips.
fn plan_one(src: &Src, starts: &Starts, num_frames: usize, spec: &ClipSpec) -> spdl_io::Result<Planned> {
    let packets = demux_video(src.media(), &DemuxOptions { window: None, limits: spec.opts.limits })?;
    let timeline = Timeline::new(&packets);
    let request = match starts {
        Starts::Given(s) => ClipRequest { starts: s.clone(), num_frames, step: spec.step, past_end: spec.past_end },
        Starts::Sampled(s) => s.request(&timeline, num_frames, spec.step, spec.past_end)?,
    };
    let plan = plan_on(&timeline, &packets, &request, &spec.opts)?;
    Ok(Planned { packets, plan })
}

/// Demuxes, plans and decodes one video.
pub(super) fn load_one(src: &Src, starts: &Starts, num_frames: usize, spec: &ClipSpec) -> spdl_io::Result<Clips> {
    let alloc = system_allocator();
    match starts {
        Starts::Given(s) => {
            let request = ClipRequest { starts: s.clone(), num_frames, step: spec.step, past_end: spec.past_end };
            load_clips_rs(src.media(), &request, &spec.opts, &alloc)
        }
        Starts::Sampled(s) => {
            load_sampled_clips(src.media(), *s, num_frames, spec.step, spec.past_end, &spec.opts, &alloc)
        }
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &ClipStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("frames_in_video", s.frames_in_video)?;
    d.set_item("frames_kept", s.frames_kept)?;
    d.set_item("frames_decoded", s.frames_decoded)?;
    d.set_item("frames_converted", s.frames_converted)?;
    d.set_item("packets_sent", s.packets_sent)?;
    d.set_item("packets_skippable", s.packets_skippable)?;
    d.set_item("runs", s.runs)?;
    Ok(d)
}

/// The clips as a buffer, with `(buffer, info)` when asked.
fn clips_result(py: Python<'_>, clips: Clips, return_info: bool) -> PyResult<Py<PyAny>> {
    let info = if return_info {
        let d = PyDict::new(py);
        let t = clips.buffer.shape().get(1).copied().unwrap_or(1).max(1);
        let indices: Vec<&[u64]> = clips.indices.chunks(t).collect();
        let pts: Vec<&[f64]> = clips.pts_s.chunks(t).collect();
        d.set_item("indices", indices)?;
        d.set_item("pts", pts)?;
        d.set_item("frame_rate", clips.frame_rate)?;
        d.set_item("codec", &clips.codec)?;
        d.set_item("item", &clips.item)?;
        d.set_item("stats", stats_dict(py, &clips.stats)?)?;
        Some(d)
    } else {
        None
    };
    buffer_result(py, clips.buffer, info)
}

/// What one call asks for: where clips start (made once the options say how starts are read), how long
/// they are, and whether the info comes back.
struct Want<F> {
    starts: F,
    num_frames: usize,
    return_info: bool,
}

fn run_one(
    py: Python<'_>,
    func: &str,
    src: &Bound<'_, PyAny>,
    name: Option<&str>,
    want: Want<impl FnOnce(&ClipSpec) -> PyResult<Starts>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let spec = ClipArgs::from_kwargs(func, options)?.spec(py)?;
    let starts = (want.starts)(&spec)?;
    let src = media_src(src, name)?;
    let Want { num_frames, return_info, .. } = want;
    let clips = crate::lifecycle::detach(py, || load_one(&src, &starts, num_frames, &spec)).map_err(io_err)?;
    clips_result(py, clips, return_info)
}

/// Decodes clips of ``num_frames`` frames from one video (a path or encoded bytes) into one ``uint8``
/// :py:class:`spdl_rs.Buffer` ``[len(starts), num_frames, H, W, C]`` (GIL released, no copy). The video is
/// demuxed once and each GOP the clips need is decoded once, whatever the number of clips; frames no clip
/// keeps are skipped by the decoder where the codec allows and never converted; conversion and resize run in
/// one swscale pass, straight into each frame's slot.
///
/// Args:
///     src: A path (``str`` or ``os.PathLike``) or encoded bytes.
///     starts: Where each clip starts: frame indices (presentation order, from the first keyframe), or
///         seconds with ``by="time"`` (the frame on screen then).
///     num_frames: Frames per clip.
///     stride: Every ``stride``-th frame from the start (``1``: consecutive frames).
///     fps: Instead of ``stride``, a target rate: frame ``i`` is the one on screen at ``start + i / fps``.
///     by: ``"index"`` or ``"time"``: how ``starts`` are read.
///     width, height: Output size (both or neither; neither keeps the coded size).
///     pix_fmt: ``"rgb24"`` (``C = 3``) or ``"gray"`` (``C = 1``).
///     filter: Scaling filter: ``"bicubic"``, ``"bilinear"``, ``"nearest"`` or ``"area"``.
///     policy: A clip past the last frame: ``"error"`` (``ValueError`` naming the clip), ``"repeat_last"`` or
///         ``"wrap"`` (torchcodec's policies).
///     threads: Decoder threads (``0``: FFmpeg picks one per core).
///     skip_unused: Let the decoder skip non-reference frames that no clip keeps (default ``True``).
///     limits: Overrides of the bounds (``max_frames``, ``max_output_bytes``, ... as :py:func:`load_video`):
///         an oversized request is refused before anything is allocated.
///     name: The name of ``src`` in error messages when it is bytes.
///     return_info: Also return a dict: ``indices`` and ``pts`` (per clip, per frame), ``frame_rate``,
///         ``codec``, ``item``, ``stats`` (frames decoded, kept, converted; packets sent; runs).
///
/// Raises:
///     OSError: The file cannot be read.
///     ValueError: Invalid options, or a clip past the end under ``policy="error"``.
///     RuntimeError: The input is corrupt, has no video stream, a kept frame does not decode, or a limit is
///         reached; the message names the item.
#[pyfunction]
#[pyo3(signature = (src, starts, *, num_frames, name=None, return_info=false, **options: "Unpack[ClipArgs]"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_clips(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    starts: &Bound<'_, PyAny>,
    num_frames: usize,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let starts = |spec: &ClipSpec| Ok(Starts::Given(starts_from(starts, spec.by_time)?));
    run_one(py, "load_clips", src, name, Want { starts, num_frames, return_info }, options)
}

/// Draws ``num_clips`` clip starts uniformly (with replacement) among the frame indices whose clip fits, from
/// ``seed`` and the video alone, sorted, and decodes them as :py:func:`load_clips` does (torchcodec's
/// ``clips_at_random_indices``). Options as :py:func:`load_clips`.
#[pyfunction]
#[pyo3(signature = (src, num_clips, num_frames, *, seed=0, name=None, return_info=false, **options: "Unpack[ClipArgs]"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn clips_at_random_indices(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    num_clips: usize,
    num_frames: usize,
    seed: u64,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    check_clip_count(num_clips)?;
    let s = Starts::Sampled(ClipSampler::RandomIndices { num_clips, seed });
    run_one(
        py,
        "clips_at_random_indices",
        src,
        name,
        Want { starts: move |_: &ClipSpec| Ok(s), num_frames, return_info },
        options,
    )
}

/// ``num_clips`` clip starts evenly spaced over the frame indices whose clip fits, decoded as
/// :py:func:`load_clips` does. Options as :py:func:`load_clips`.
#[pyfunction]
#[pyo3(signature = (src, num_clips, num_frames, *, name=None, return_info=false, **options: "Unpack[ClipArgs]"))]
pub(crate) fn clips_at_regular_indices(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    num_clips: usize,
    num_frames: usize,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    check_clip_count(num_clips)?;
    let s = Starts::Sampled(ClipSampler::RegularIndices { num_clips });
    run_one(
        py,
        "clips_at_regular_indices",
        src,
        name,
        Want { starts: move |_: &ClipSpec| Ok(s), num_frames, return_info },
        options,
    )
}

/// ``num_clips`` clip start times drawn uniformly (with replacement) over the times whose clip fits, from
/// ``seed`` and the video alone, sorted, decoded as :py:func:`load_clips` does. Options as
/// :py:func:`load_clips` (``fps`` sets the clip's frame rate).
#[pyfunction]
#[pyo3(signature = (src, num_clips, num_frames, *, seed=0, name=None, return_info=false, **options: "Unpack[ClipArgs]"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn clips_at_random_timestamps(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    num_clips: usize,
    num_frames: usize,
    seed: u64,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    check_clip_count(num_clips)?;
    let s = Starts::Sampled(ClipSampler::RandomTimes { num_clips, seed });
    run_one(
        py,
        "clips_at_random_timestamps",
        src,
        name,
        Want { starts: move |_: &ClipSpec| Ok(s), num_frames, return_info },
        options,
    )
}

/// ``num_clips`` clip start times evenly spaced over the times whose clip fits, decoded as
/// :py:func:`load_clips` does. Options as :py:func:`load_clips`.
#[pyfunction]
#[pyo3(signature = (src, num_clips, num_frames, *, name=None, return_info=false, **options: "Unpack[ClipArgs]"))]
pub(crate) fn clips_at_regular_timestamps(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    num_clips: usize,
    num_frames: usize,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    check_clip_count(num_clips)?;
    let s = Starts::Sampled(ClipSampler::RegularTimes { num_clips });
    run_one(
        py,
        "clips_at_regular_timestamps",
        src,
        name,
        Want { starts: move |_: &ClipSpec| Ok(s), num_frames, return_info },
        options,
    )
}

/// The whole video at ``fps``, cut into consecutive clips of ``num_frames`` frames (the last one padded or
/// refused by ``policy``), decoded as :py:func:`load_clips` does. Options as :py:func:`load_clips`.
#[pyfunction]
#[pyo3(signature = (src, fps, num_frames, *, name=None, return_info=false, **options: "Unpack[ClipOutputArgs]"))]
pub(crate) fn clips_at_fps(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    fps: f64,
    num_frames: usize,
    name: Option<&str>,
    return_info: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    if options.is_some_and(|o| o.contains("fps").unwrap_or(false) || o.contains("stride").unwrap_or(false)) {
        return Err(PyTypeError::new_err("clips_at_fps() takes its rate as fps; stride does not apply"));
    }
    let s = Starts::Sampled(ClipSampler::AllAtFps { fps });
    run_one(py, "clips_at_fps", src, name, Want { starts: move |_: &ClipSpec| Ok(s), num_frames, return_info }, options)
}

/// Runs `f(i)` for every `i` in `0..n` on `threads` scoped threads, each taking the next index (videos differ
/// in cost, so a shared counter balances better than fixed chunks).
fn for_each_index(n: usize, threads: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            f(i);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
}

/// One video's plan and its slot of the batch, taken by the thread that decodes it.
type Work<'a> = std::sync::Mutex<Option<(Planned, &'a mut [u8])>>;

/// Plans each video (in parallel), checks they agree on the clip shape, then decodes each straight into
/// its slot of one `[B, clips, T, H, W, C]` buffer.
fn run_batch(
    srcs: Vec<Src>,
    starts: Vec<Starts>,
    num_frames: usize,
    spec: ClipSpec,
    threads: usize,
) -> spdl_io::Result<Buffer> {
    let n = srcs.len();
    let threads = threads.clamp(1, n.max(1));
    let batch_item = |i: usize, e: spdl_io::Error| spdl_io::Error::BatchItem { index: i, source: Box::new(e) };
    let planned: Vec<std::sync::Mutex<Option<spdl_io::Result<Planned>>>> =
        (0..n).map(|_| std::sync::Mutex::new(None)).collect();
    for_each_index(n, threads, |i| {
        let st = &starts[i.min(starts.len() - 1)];
        let r = plan_one(&srcs[i], st, num_frames, &spec);
        *planned[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    let mut plans = Vec::with_capacity(n);
    for (i, slot) in planned.into_iter().enumerate() {
        let r = slot.into_inner().unwrap_or_else(|e| e.into_inner());
        plans.push(
            r.unwrap_or_else(|| Err(spdl_io::Error::InvalidOptions("not planned".into())))
                .map_err(|e| batch_item(i, e))?,
        );
    }
    // One shape for the batch: the clips of each video, and its output frame size.
    let (clips, (w, h)) = match plans.first() {
        Some(p) => (p.plan.num_clips(), spec.opts.output_size(&p.packets)?),
        None => (0, spec.opts.size.unwrap_or((1, 1))),
    };
    for (i, p) in plans.iter().enumerate() {
        let size = spec.opts.output_size(&p.packets)?;
        if p.plan.num_clips() != clips || size != (w, h) {
            return Err(batch_item(
                i,
                spdl_io::Error::InvalidOptions(format!(
                    "{}: {} clips of {}x{} frames, where the batch's first video has {clips} of {w}x{h} (give \
                     width and height, and the same number of starts for every video)",
                    p.packets.item(),
                    p.plan.num_clips(),
                    size.0,
                    size.1
                )),
            ));
        }
    }
    let c = spec.opts.pixel_format.channels();
    let per_video = clips * num_frames * h as usize * w as usize * c;
    // The batch buffer is one allocation: held to the output limit and to the decode memory budget.
    let total = (per_video as u64).saturating_mul(n as u64);
    let limit = spec.opts.limits.max_output_bytes.min(spdl_io::decode_memory_budget());
    if total > limit {
        return Err(spdl_io::Error::LimitExceeded {
            item: format!("a batch of {n} videos"),
            what: "batch output bytes".into(),
            value: total,
            limit,
        });
    }
    let shape = [n, clips, num_frames, h as usize, w as usize, c];
    let mut buffer = Buffer::zeros(DType::U8, &shape, Layout::Nhwc, &system_allocator())?;
    if per_video > 0 {
        let work: Vec<Work<'_>> = plans
            .into_iter()
            .zip(buffer.as_bytes_mut().chunks_exact_mut(per_video))
            .map(|(p, dst)| std::sync::Mutex::new(Some((p, dst))))
            .collect();
        let errors: std::sync::Mutex<Vec<(usize, spdl_io::Error)>> = std::sync::Mutex::new(Vec::new());
        for_each_index(n, threads, |i| {
            let Some((Planned { packets, plan }, dst)) = work[i].lock().unwrap_or_else(|e| e.into_inner()).take()
            else {
                return;
            };
            if let Err(e) = decode_clips_into(packets, &plan, &spec.opts, dst) {
                errors.lock().unwrap_or_else(|e| e.into_inner()).push((i, e));
            }
        });
        let mut errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
        errors.sort_by_key(|(i, _)| *i);
        if let Some((i, e)) = errors.into_iter().next() {
            return Err(batch_item(i, e));
        }
    }
    Ok(buffer)
}

keyword_options! {
    /// What a batch or an op adds to the clip options: where clips start, and the batch's threads.
    struct ClipBatchArgs [clip: ClipArgs] {
        sampler: Option<String> = None,
        num_clips: Option<usize> = None,
        seed: u64 = 0,
        num_threads: Option<usize> = None,
    }
}

impl ClipBatchArgs {
    /// The starts for every video: `starts` (one sequence for all, or one per video), else the sampler.
    fn starts(&self, starts: Option<&Bound<'_, PyAny>>, videos: Option<usize>, by_time: bool) -> PyResult<Vec<Starts>> {
        match (starts, &self.sampler) {
            (Some(_), Some(_)) => Err(PyValueError::new_err("give starts or sampler, not both")),
            (None, None) => Err(PyValueError::new_err("give starts (per video, or one list for all) or a sampler")),
            (None, Some(name)) => {
                if let Some(n) = self.num_clips {
                    check_clip_count(n)?;
                }
                Ok(vec![Starts::Sampled(sampler(name, self.num_clips, self.seed, self.clip.fps)?)])
            }
            (Some(obj), None) => {
                // A sequence of sequences: one per video; a sequence of numbers: the same for all.
                let first = obj.try_iter().ok().and_then(|mut it| it.next()).transpose()?;
                let nested = first.is_some_and(|f| f.try_iter().is_ok() && !f.is_instance_of::<PyString>());
                if !nested {
                    return Ok(vec![Starts::Given(starts_from(obj, by_time)?)]);
                }
                let per: Vec<Starts> =
                    obj.try_iter()?.map(|s| Ok(Starts::Given(starts_from(&s?, by_time)?))).collect::<PyResult<_>>()?;
                if let Some(v) = videos
                    && per.len() != v
                {
                    return Err(PyValueError::new_err(format!("{} lists of starts for {v} videos", per.len())));
                }
                Ok(per)
            }
        }
    }

    fn threads(&self, default: usize) -> PyResult<usize> {
        match self.num_threads {
            None => Ok(default),
            Some(0) => Err(PyValueError::new_err("num_threads must be >= 1")),
            Some(t) if t > MAX_THREADS => Err(PyValueError::new_err(format!("num_threads {t} is above {MAX_THREADS}"))),
            Some(t) => Ok(t),
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Decodes clips from many videos into one ``uint8`` :py:class:`spdl_rs.Buffer` ``[B, clips, T, H, W, C]``,
/// videos in parallel, GIL released; each video is decoded straight into its slot.
///
/// Args:
///     srcs: Paths or encoded bytes.
///     starts: One sequence of starts for every video, or one per video (the same length each); or ``None``
///         with ``sampler=``.
///     num_frames: Frames per clip (``T``).
///     sampler: ``"random_indices"``, ``"regular_indices"``, ``"random_timestamps"``, ``"regular_timestamps"``
///         (with ``num_clips``, and ``seed`` for the random ones) or ``"all_at_fps"`` (with ``fps``; every
///         video must then give the same number of clips).
///     num_threads: Videos decoded at once (``None``: all cores).
///     Other options as :py:func:`load_clips`. Every video must give the same output size: give ``width`` and
///     ``height`` unless they all have the same coded size.
///
/// Raises:
///     ValueError, RuntimeError, OSError: as :py:func:`load_clips`, naming the batch index and the item.
#[pyfunction]
#[pyo3(signature = (srcs, starts=None, *, num_frames, **options: "Unpack[ClipBatchArgs]"))]
pub(crate) fn load_clips_batch(
    py: Python<'_>,
    srcs: &Bound<'_, PyAny>,
    starts: Option<&Bound<'_, PyAny>>,
    num_frames: usize,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let args = ClipBatchArgs::from_kwargs("load_clips_batch", options)?;
    let spec = args.clip.spec(py)?;
    if srcs.is_instance_of::<PyString>() || srcs.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err("load_clips_batch takes a sequence of paths or encoded bytes"));
    }
    let mut list = Vec::new();
    for (i, s) in srcs.try_iter()?.enumerate() {
        if i >= MAX_BATCH {
            return Err(PyValueError::new_err(format!("more than {MAX_BATCH} videos in one batch")));
        }
        list.push(src_from_py(&s?, i)?);
    }
    let starts = args.starts(starts, Some(list.len()), spec.by_time)?;
    let threads = args.threads(cores())?;
    let buffer = interruptible(py, move || run_batch(list, starts, num_frames, spec, threads))?.map_err(io_err)?;
    buffer_result(py, buffer, None)
}

const CLIP_INPUT: &str = "a path (str) or encoded bytes, or a (src, starts) pair";
const BATCH_INPUT: &str = "a list of paths or encoded bytes (aggregate first)";

/// `load_clips` as an op: each item is a video (clips from the op's starts or sampler) or a `(src, starts)`
/// pair.
#[derive(Debug)]
struct LoadClipsOp {
    /// `None`: every item is a `(src, starts)` pair.
    starts: Option<Starts>,
    num_frames: usize,
    spec: ClipSpec,
}

impl LoadClipsOp {
    /// The op's starts for an item that is only a video.
    fn own_starts(&self, stage: &str) -> Result<Starts, Error> {
        self.starts.clone().ok_or_else(|| {
            Error::wrong_input(
                stage,
                "load_clips",
                "a video alone".to_owned(),
                "a (src, starts) pair (the op has no starts or sampler)",
            )
        })
    }
}

impl NativeOp for LoadClipsOp {
    fn name(&self) -> &str {
        "load_clips"
    }
    fn expects(&self) -> &'static str {
        CLIP_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let (src, starts) = match input {
            Value::Py(obj) => crate::pipeline::tstate::attach(|py| {
                let b = obj.bind(py);
                match b.cast::<pyo3::types::PyTuple>() {
                    Ok(t) if t.len() == 2 => {
                        let src = t.get_item(0).and_then(|s| src_from_py(&s, 0));
                        let st = t.get_item(1).and_then(|s| starts_from(&s, self.spec.by_time));
                        match (src, st) {
                            (Ok(src), Ok(st)) => Ok((src, Starts::Given(st))),
                            (Err(e), _) | (_, Err(e)) => Err(Error::wrong_input(
                                stage,
                                self.name(),
                                format!("a pair that is not (src, starts): {e}"),
                                CLIP_INPUT,
                            )),
                        }
                    }
                    _ => {
                        let src = src_from_py(b, 0).map_err(|e| {
                            Error::wrong_input(stage, self.name(), format!("a Python object ({e})"), CLIP_INPUT)
                        })?;
                        Ok((src, self.own_starts(stage)?))
                    }
                }
            })?,
            other => (src_from_value(other, stage, self.name(), CLIP_INPUT, 0)?, self.own_starts(stage)?),
        };
        let clips = load_one(&src, &starts, self.num_frames, &self.spec)
            .map_err(|e| Error::native(stage, self.name(), src.name(), e))?;
        Ok(vec![Value::Buffer(Arc::new(clips.buffer))])
    }
}

/// `load_clips_batch` as an op: each item is a list of videos (after `aggregate`).
#[derive(Debug)]
struct LoadClipsBatchOp {
    starts: Vec<Starts>,
    num_frames: usize,
    spec: ClipSpec,
    threads: usize,
}

impl NativeOp for LoadClipsBatchOp {
    fn name(&self) -> &str {
        "load_clips_batch"
    }
    fn expects(&self) -> &'static str {
        BATCH_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let Value::List(items) = input else {
            return Err(Error::wrong_input(stage, self.name(), input.describe(), BATCH_INPUT));
        };
        let n = items.len();
        let srcs = items
            .into_iter()
            .enumerate()
            .map(|(i, v)| src_from_value(v, stage, self.name(), BATCH_INPUT, i))
            .collect::<Result<Vec<_>, _>>()?;
        let starts = match self.starts.as_slice() {
            [one] => vec![one.clone()],
            many if many.len() == n => many.to_vec(),
            many => {
                return Err(Error::wrong_input(
                    stage,
                    self.name(),
                    format!("a batch of {n} (the op has {} lists of starts)", many.len()),
                    BATCH_INPUT,
                ));
            }
        };
        let buf = run_batch(srcs, starts, self.num_frames, self.spec, self.threads)
            .map_err(|e| Error::native(stage, self.name(), format!("a batch of {n}"), e))?;
        Ok(vec![Value::Buffer(Arc::new(buf))])
    }
}

/// Native op: decodes clips from each item (a video, or a ``(src, starts)`` pair) into a
/// ``[clips, T, H, W, C]`` ``uint8`` buffer, without the GIL. Clips start at ``starts`` (the same for every
/// item) or where ``sampler`` puts them (see :py:func:`load_clips_batch`); a pair's own starts win. Options
/// as :py:func:`spdl_rs.io.load_clips`.
#[pyfunction]
#[pyo3(signature = (*, num_frames, starts=None, **options: "Unpack[ClipBatchArgs]"))]
pub(crate) fn load_clips_op(
    py: Python<'_>,
    num_frames: usize,
    starts: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyNativeOp> {
    let args = ClipBatchArgs::from_kwargs("load_clips_op", options)?;
    if args.num_threads.is_some() {
        return Err(PyTypeError::new_err("load_clips_op() got an unexpected keyword argument 'num_threads'"));
    }
    let spec = args.clip.spec(py)?;
    let starts = match (starts, &args.sampler) {
        (None, None) => None,
        _ => args.starts(starts, None, spec.by_time)?.into_iter().next(),
    };
    Ok(PyNativeOp { op: Arc::new(LoadClipsOp { starts, num_frames, spec }) })
}

/// Native op: decodes each item (a list of videos, e.g. after ``aggregate(8)``) into one
/// ``[B, clips, T, H, W, C]`` buffer, without the GIL. Arguments as :py:func:`spdl_rs.io.load_clips_batch`;
/// ``num_threads`` (``None``) means 1 here (the pipeline's ``concurrency`` gives the parallelism).
#[pyfunction]
#[pyo3(signature = (*, num_frames, starts=None, **options: "Unpack[ClipBatchArgs]"))]
pub(crate) fn load_clips_batch_op(
    py: Python<'_>,
    num_frames: usize,
    starts: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyNativeOp> {
    let args = ClipBatchArgs::from_kwargs("load_clips_batch_op", options)?;
    let spec = args.clip.spec(py)?;
    let starts = args.starts(starts, None, spec.by_time)?;
    let threads = args.threads(1)?;
    Ok(PyNativeOp { op: Arc::new(LoadClipsBatchOp { starts, num_frames, spec, threads }) })
}
