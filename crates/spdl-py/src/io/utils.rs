//! `spdl_rs.io.utils`' native half: the FFmpeg in use (versions, filters, log level), what this build has
//! (`built_with_*`), and the trace writer behind `tracing`/`trace_event`/`trace_counter`/`trace_gc`, which
//! streams Chrome trace-event JSON (an array of events) to a file.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt};

use crate::args::{self, Int};
use crate::build_info::{_build_info, _ffmpeg_filters, _ffmpeg_log_level, _ffmpeg_status, _set_ffmpeg_log_level};

/// Counters a trace records (``trace_counter``'s index is below this).
const NUM_COUNTERS: i64 = 8;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `libraries` of FFmpeg's status, or the `RuntimeError` saying why FFmpeg is not available.
fn ffmpeg_libraries(py: Python<'_>) -> PyResult<Vec<(String, String)>> {
    let status = _ffmpeg_status(py)?;
    let available = status.get_item("available")?.is_some_and(|v| v.is_truthy().unwrap_or(false));
    if !available {
        let error = status.get_item("error")?.map(|e| e.str().map(|s| s.to_string())).transpose()?.unwrap_or_default();
        let prefix = "FFmpeg is not available: ";
        let message = if error.starts_with(prefix) { error } else { format!("{prefix}{error}") };
        return Err(PyRuntimeError::new_err(message));
    }
    let Some(libs) = status.get_item("libraries")? else { return Ok(Vec::new()) };
    libs.cast::<PyDict>()?.iter().map(|(k, v)| Ok((k.extract()?, v.str()?.to_string()))).collect()
}

/// The versions of the FFmpeg libraries in use: ``{"libavcodec": (59, 37, 100), ...}`` (``libavutil``,
/// ``libavcodec``, ``libavformat``, ``libavfilter``, ``libswscale``, ``libswresample``).
///
/// Raises:
///     RuntimeError: FFmpeg is not available on this machine (the message says why and how to install it).
#[pyfunction]
pub(crate) fn get_ffmpeg_versions(py: Python<'_>) -> PyResult<std::collections::BTreeMap<String, (u32, u32, u32)>> {
    let mut out = std::collections::BTreeMap::new();
    // FFmpeg's own release string ("5.1.9-0+deb12u1") is not a library.
    for (lib, version) in ffmpeg_libraries(py)?.into_iter().filter(|(lib, _)| lib.starts_with("lib")) {
        let mut parts = version.split('.').take(3).map(|p| {
            p.parse::<u32>()
                .map_err(|_| PyValueError::new_err(format!("invalid literal for int() with base 10: {p:?}")))
        });
        let mut next = || parts.next().transpose().map(Option::unwrap_or_default);
        out.insert(lib, (next()?, next()?, next()?));
    }
    Ok(out)
}

/// The names of the filters the FFmpeg in use has (``"scale"``, ``"aresample"``, ...), sorted.
///
/// Raises:
///     RuntimeError: FFmpeg is not available on this machine.
#[pyfunction]
pub(crate) fn get_ffmpeg_filters(py: Python<'_>) -> PyResult<Vec<String>> {
    _ffmpeg_filters(py)
}

/// FFmpeg's log level. spdl_rs keeps it at ``8`` (fatal) so that damaged files in a dataset do not print,
/// unless ``SPDL_FFMPEG_LOG`` or :py:func:`set_ffmpeg_log_level` says otherwise.
///
/// Raises:
///     RuntimeError: FFmpeg is not available on this machine.
#[pyfunction]
pub(crate) fn get_ffmpeg_log_level(py: Python<'_>) -> PyResult<i32> {
    _ffmpeg_log_level(py)
}

/// Sets FFmpeg's log level, for the whole process: ``-8`` quiet, ``0`` panic, ``8`` fatal, ``16`` error,
/// ``24`` warning, ``32`` info, ``40`` verbose, ``48`` debug, ``56`` trace (as ``ffmpeg -loglevel``).
///
/// Raises:
///     TypeError: ``val`` is not an integer.
///     RuntimeError: FFmpeg is not available on this machine.
#[pyfunction]
#[pyo3(signature = (val, /))]
pub(crate) fn set_ffmpeg_log_level(val: &Bound<'_, PyAny>) -> PyResult<()> {
    if val.is_instance_of::<PyBool>() || !val.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!("the log level must be an int, got {}", val.get_type().name()?)));
    }
    _set_ffmpeg_log_level(val.py(), val.extract()?)
}

/// True when this build has CUDA support and a CUDA driver with a device was found (transfers to the GPU
/// work).
#[pyfunction]
pub(crate) fn built_with_cuda(py: Python<'_>) -> PyResult<bool> {
    let Some(cuda) = _build_info(py)?.get_item("cuda")? else { return Ok(false) };
    let built = cuda.get_item("built")?.is_truthy()?;
    Ok(built && cuda.get_item("devices")?.extract::<i64>()? > 0)
}

/// False: spdl_rs has no NVDEC decoder (video decodes on the CPU; see the README's list of what is not
/// carried over).
#[pyfunction]
pub(crate) fn built_with_nvcodec() -> bool {
    false
}

/// False: spdl_rs has no nvJPEG decoder (JPEGs decode on the CPU with libjpeg-turbo or zune-jpeg).
#[pyfunction]
pub(crate) fn built_with_nvjpeg() -> bool {
    false
}

// ------------------------------------------------------------------------------------------------ tracing

/// Where the events go and what is buffered for it.
#[derive(Debug)]
struct Sink {
    out: File,
    buffer: String,
    first: bool,
    closed: bool,
}

/// One trace being written: events are buffered and streamed to the output as a JSON array.
#[derive(Debug)]
struct Session {
    id: u64,
    pid: u32,
    t0: Instant,
    limit: usize,
    sink: Mutex<Sink>,
}

/// The trace being recorded in this process, if any.
static CURRENT: Mutex<Option<Arc<Session>>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `text` as a JSON string, non-ASCII escaped (as Python's `json.dumps` writes it).
fn json_str(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number of a Python `bool`, `int` or `float` (as `json.dumps` writes them).
fn json_value(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(if b.is_true() { "true" } else { "false" }.to_owned());
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(value.cast::<PyInt>()?.str()?.to_string());
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        let v = f.value();
        return Ok(if v.is_nan() {
            "NaN".to_owned()
        } else if v.is_infinite() {
            if v > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
        } else {
            value.repr()?.to_string()
        });
    }
    Err(PyTypeError::new_err(format!("Object of type {} is not JSON serializable", value.get_type().name()?)))
}

/// The OS id of the calling thread (`threading.get_native_id()`).
fn native_thread_id() -> i64 {
    // SAFETY: `gettid` has no preconditions and cannot fail.
    i64::from(unsafe { libc::gettid() })
}

impl Session {
    /// Adds one event: `name`, `ph`, the `args` object's JSON text if any, and the pid, tid and time.
    fn add(&self, name: &str, ph: &str, args: Option<&str>, ts: Option<f64>) -> std::io::Result<()> {
        let ts = ts.unwrap_or_else(|| self.t0.elapsed().as_nanos() as f64 / 1000.0);
        let args = args.map(|a| format!(",\"args\":{a}")).unwrap_or_default();
        let event = format!(
            "{{\"name\":{},\"ph\":{}{args},\"pid\":{},\"tid\":{},\"ts\":{ts:?}}}",
            json_str(name),
            json_str(ph),
            self.pid,
            native_thread_id()
        );
        let mut sink = lock(&self.sink);
        if sink.closed {
            return Ok(());
        }
        if !sink.buffer.is_empty() || !sink.first {
            sink.buffer.push_str(",\n");
        }
        sink.buffer.push_str(&event);
        if sink.buffer.len() >= self.limit { Self::flush(&mut sink) } else { Ok(()) }
    }

    fn flush(sink: &mut Sink) -> std::io::Result<()> {
        if sink.buffer.is_empty() {
            return Ok(());
        }
        let text = std::mem::take(&mut sink.buffer);
        sink.first = false;
        sink.out.write_all(text.as_bytes())
    }
}

/// The trace being recorded, when `session` (an id from [`trace`]) is it or is not given.
fn current(session: Option<u64>) -> Option<Arc<Session>> {
    lock(&CURRENT).as_ref().filter(|s| session.is_none_or(|id| s.id == id)).cloned()
}

/// A trace being recorded (made by :py:func:`trace_start`); :py:meth:`close` ends it.
#[pyclass(name = "TraceSession", module = "spdl_rs._native.io", frozen)]
#[derive(Debug)]
pub struct PyTraceSession {
    session: Arc<Session>,
}

#[pymethods]
impl PyTraceSession {
    /// Stops recording, writes the buffered events and the end of the JSON array (again: nothing).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        {
            let mut current = lock(&CURRENT);
            if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.session)) {
                *current = None;
            }
        }
        let session = Arc::clone(&self.session);
        crate::lifecycle::detach(py, move || {
            let mut sink = lock(&session.sink);
            if sink.closed {
                return Ok(());
            }
            sink.closed = true;
            Session::flush(&mut sink)?;
            sink.out.write_all(b"\n]\n")?;
            sink.out.flush()
        })
        .map_err(|e| PyOSError::new_err(e.to_string()))
    }
}

/// An output of a trace: a path (created or truncated), or an open file descriptor (duplicated; the caller's
/// stays open).
fn open_output(output: &Bound<'_, PyAny>) -> PyResult<File> {
    if output.is_instance_of::<PyInt>() && !output.is_instance_of::<PyBool>() {
        let fd: std::os::fd::RawFd = output.extract()?;
        if fd < 0 {
            return Err(PyOSError::new_err(format!("[Errno 9] Bad file descriptor: {fd}")));
        }
        // SAFETY: the caller passes an open descriptor that stays open for this call; it is duplicated at once
        // and only the duplicate is owned (and closed) here.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        return Ok(File::from(borrowed.try_clone_to_owned()?));
    }
    let path: PathBuf = output.extract()?;
    Ok(File::create(&path)?)
}

/// Starts recording a trace into ``output`` (a path, or an open file descriptor left open), buffering
/// ``buffer_size`` KiB of events between writes; the process is named ``process_name`` in it.
///
/// Raises:
///     ValueError: ``buffer_size`` is not a positive integer.
///     RuntimeError: A trace is already being recorded in this process.
#[pyfunction]
pub(crate) fn trace_start(
    output: &Bound<'_, PyAny>,
    buffer_size: &Bound<'_, PyAny>,
    process_name: &str,
) -> PyResult<PyTraceSession> {
    let kib = (buffer_size.is_instance_of::<PyInt>() && !buffer_size.is_instance_of::<PyBool>())
        .then(|| buffer_size.extract::<Int>())
        .transpose()?
        .and_then(|v| args::count("buffer_size", &v, 1, u64::MAX >> 10).ok())
        .ok_or_else(|| {
            let shown = buffer_size.repr().map(|r| r.to_string()).unwrap_or_default();
            PyValueError::new_err(format!("buffer_size must be a positive number of KiB, got {shown}"))
        })?;
    let mut current = lock(&CURRENT);
    if current.is_some() {
        return Err(PyRuntimeError::new_err("a trace is already being recorded in this process"));
    }
    let mut out = open_output(output)?;
    out.write_all(b"[\n")?;
    let session = Arc::new(Session {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        pid: std::process::id(),
        t0: Instant::now(),
        limit: kib.saturating_mul(1024).max(1),
        sink: Mutex::new(Sink { out, buffer: String::new(), first: true, closed: false }),
    });
    let name = format!("{{\"name\":{}}}", json_str(process_name));
    session.add("process_name", "M", Some(&name), Some(0.0))?;
    *current = Some(Arc::clone(&session));
    Ok(PyTraceSession { session })
}

/// Records an event ``name`` of phase ``ph`` (``"B"`` begins a slice of the calling thread, ``"E"`` ends it)
/// into the trace being recorded (only if it is ``session``, when given): the id of the trace it went into, or
/// ``None`` outside a trace.
#[pyfunction]
#[pyo3(signature = (name, ph, session=None))]
pub(crate) fn trace(py: Python<'_>, name: &str, ph: &str, session: Option<u64>) -> PyResult<Option<u64>> {
    let Some(s) = current(session) else { return Ok(None) };
    let (name, ph) = (name.to_owned(), ph.to_owned());
    let id = s.id;
    crate::lifecycle::detach(py, move || s.add(&name, &ph, None, None))?;
    Ok(Some(id))
}

/// Records counter ``i`` (``0`` to ``7``) at ``val`` (nothing outside :py:func:`tracing`).
///
/// Raises:
///     ValueError: ``i`` is not in ``[0, 7]``.
#[pyfunction]
pub(crate) fn trace_counter(i: &Bound<'_, PyAny>, val: &Bound<'_, PyAny>) -> PyResult<()> {
    let index = (i.is_instance_of::<PyInt>() && !i.is_instance_of::<PyBool>())
        .then(|| i.extract::<i64>().ok())
        .flatten()
        .filter(|i| (0..NUM_COUNTERS).contains(i))
        .ok_or_else(|| {
            let shown = i.repr().map(|r| r.to_string()).unwrap_or_default();
            PyValueError::new_err(format!("the counter index must be in [0, {}], got {shown}", NUM_COUNTERS - 1))
        })?;
    let Some(s) = current(None) else { return Ok(()) };
    let args = format!("{{\"value\":{}}}", json_value(val)?);
    let name = format!("counter_{index}");
    crate::lifecycle::detach(i.py(), move || s.add(&name, "C", Some(&args), None))?;
    Ok(())
}
