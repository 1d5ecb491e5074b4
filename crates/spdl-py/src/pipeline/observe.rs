//! The bookkeeping behind `spdl_rs.pipeline`'s observability classes: the counters and streaming
//! percentiles `TaskStatsHook` and `StatsQueue` keep, their per-interval (lap) figures, and the log lines in
//! SPDL's words that both they and the engine's own stats report.
//!
//! The Python classes stay thin shells users can subclass (`stage_hook`, `task_hook`, `get`, `put`,
//! `interval_stats_callback`); each holds one object of this module and hands it what it measured.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use pyo3::exceptions::{PyException, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Locks `m`, taking the state as it is if a holder panicked (the counters stay usable).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A streaming percentile estimate (Jain and Chlamtac's P-square algorithm): five markers, O(1) per value.
#[derive(Debug, Clone)]
struct P2 {
    /// The quantile, 0.0 to 1.0.
    p: f64,
    count: u64,
    heights: [f64; 5],
    pos: [f64; 5],
    want: [f64; 5],
    step: [f64; 5],
}

impl P2 {
    fn new(percent: f64) -> Self {
        Self { p: percent / 100.0, count: 0, heights: [0.0; 5], pos: [0.0; 5], want: [0.0; 5], step: [0.0; 5] }
    }

    fn reset(&mut self) {
        *self = Self::new(self.p * 100.0);
    }

    /// The estimate (0.0 before any value; over fewer than five values, the nearest of them).
    fn value(&self) -> f64 {
        match self.count {
            0 => 0.0,
            n @ 1..=4 => {
                let mut seen = self.heights[..n as usize].to_vec();
                seen.sort_by(f64::total_cmp);
                let i = ((n as f64 * self.p) as usize).min(n as usize - 1);
                seen.get(i).copied().unwrap_or(0.0)
            }
            _ => self.heights[2],
        }
    }

    fn update(&mut self, x: f64) {
        self.count += 1;
        if self.count <= 5 {
            self.heights[self.count as usize - 1] = x;
            if self.count == 5 {
                self.heights.sort_by(f64::total_cmp);
                let p = self.p;
                self.pos = [0.0, 1.0, 2.0, 3.0, 4.0];
                self.want = [0.0, 2.0 * p, 4.0 * p, 2.0 + 2.0 * p, 4.0];
                self.step = [0.0, p / 2.0, p, (1.0 + p) / 2.0, 1.0];
            }
            return;
        }
        let (q, n) = (&mut self.heights, &mut self.pos);
        let k = if x < q[0] {
            q[0] = x;
            0
        } else if x >= q[4] {
            q[4] = x;
            3
        } else {
            (0..4).find(|&i| q[i] <= x && x < q[i + 1]).unwrap_or(3)
        };
        for ni in n.iter_mut().skip(k + 1) {
            *ni += 1.0;
        }
        for (w, s) in self.want.iter_mut().zip(self.step) {
            *w += s;
        }
        for i in 1..4 {
            let d = self.want[i] - n[i];
            if (d >= 1.0 && n[i + 1] - n[i] > 1.0) || (d <= -1.0 && n[i - 1] - n[i] < -1.0) {
                let s = d.signum();
                let mut cand = q[i]
                    + s / (n[i + 1] - n[i - 1])
                        * ((n[i] - n[i - 1] + s) * (q[i + 1] - q[i]) / (n[i + 1] - n[i])
                            + (n[i + 1] - n[i] - s) * (q[i] - q[i - 1]) / (n[i] - n[i - 1]));
                if !(q[i - 1] < cand && cand < q[i + 1]) {
                    let j = if s > 0.0 { i + 1 } else { i - 1 };
                    cand = q[i] + s * (q[j] - q[i]) / (n[j] - n[i]);
                }
                q[i] = cand;
                n[i] += s;
            }
        }
    }
}

/// The median, 90th and 99th percentiles of a stream of durations, over the whole run and since the last
/// lap.
#[derive(Debug, Clone)]
struct Percentiles {
    whole: [P2; 3],
    lap: [P2; 3],
}

impl Percentiles {
    fn new() -> Self {
        let set = || [P2::new(50.0), P2::new(90.0), P2::new(99.0)];
        Self { whole: set(), lap: set() }
    }

    fn update(&mut self, t: f64) {
        self.whole.iter_mut().chain(self.lap.iter_mut()).for_each(|p| p.update(t));
    }

    /// `(p50, p90, p99)` over the whole run.
    fn whole(&self) -> (f64, f64, f64) {
        (self.whole[0].value(), self.whole[1].value(), self.whole[2].value())
    }

    /// `(p50, p90, p99)` since the last lap; starts the next lap.
    fn take_lap(&mut self) -> (f64, f64, f64) {
        let v = (self.lap[0].value(), self.lap[1].value(), self.lap[2].value());
        self.lap.iter_mut().for_each(P2::reset);
        v
    }
}

/// The mean of what was added since a mark, from the running means and counts at the mark and now.
fn lap_mean(mean: f64, n: u64, mark_mean: f64, mark_n: u64) -> f64 {
    let d = n.saturating_sub(mark_n);
    if d == 0 { 0.0 } else { (mean * n as f64 - mark_mean * mark_n as f64) / d as f64 }
}

#[derive(Debug)]
struct Counter {
    n: u64,
    mean: f64,
    pct: Percentiles,
}

/// Count, running mean and percentiles of durations (whole run and since the last lap): one direction of a
/// `StatsQueue` (its `_getc` and `_putc`).
#[pyclass(module = "spdl_rs._native.pipeline", name = "_StatsCounter", frozen)]
#[derive(Debug)]
pub struct StatsCounter(Mutex<Counter>);

impl StatsCounter {
    fn new() -> Self {
        Self(Mutex::new(Counter { n: 0, mean: 0.0, pct: Percentiles::new() }))
    }
}

#[pymethods]
impl StatsCounter {
    /// Values counted.
    #[getter]
    fn num_items(&self) -> u64 {
        lock(&self.0).n
    }

    /// Their mean.
    #[getter]
    fn ave_time(&self) -> f64 {
        lock(&self.0).mean
    }

    /// Their 90th percentile (estimate).
    #[getter]
    fn p90_time(&self) -> f64 {
        lock(&self.0).pct.whole().1
    }

    /// Their 99th percentile (estimate).
    #[getter]
    fn p99_time(&self) -> f64 {
        lock(&self.0).pct.whole().2
    }

    /// `(p90, p99)` of the values since the previous call.
    fn consume_lap_percentiles(&self) -> (f64, f64) {
        let (_, p90, p99) = lock(&self.0).pct.take_lap();
        (p90, p99)
    }

    /// Counts `n` values of `t` seconds each (nothing for `n <= 0`).
    #[pyo3(signature = (t, n = 1))]
    fn update(&self, t: f64, n: i64) {
        let Ok(n @ 1..) = u64::try_from(n) else { return };
        let mut c = lock(&self.0);
        c.n += n;
        c.mean += (t - c.mean) * n as f64 / c.n as f64;
        c.pct.update(t);
    }
}

#[derive(Debug)]
struct QueueState {
    /// When the stage started (the final report's elapsed time), and when the current lap started.
    t0: Instant,
    lap_t0: Instant,
    /// When the queue last became empty, and how long it was empty before that.
    empty_t0: Instant,
    dur_empty: f64,
    /// `(num_put, ave_put, num_get, ave_get, dur_empty)` at the start of the lap.
    lap_mark: (u64, f64, u64, f64, f64),
}

/// A `StatsQueue`'s measurements: the waits of `put` and `get` and the time the queue was empty.
#[pyclass(module = "spdl_rs._native.pipeline", name = "_QueueStats", frozen)]
#[derive(Debug)]
pub struct QueueStats {
    /// The waits of `get`.
    #[pyo3(get)]
    getc: Py<StatsCounter>,
    /// The waits of `put`.
    #[pyo3(get)]
    putc: Py<StatsCounter>,
    state: Mutex<QueueState>,
}

/// The `QueuePerfStats` fields, in order.
type QueueFigures = (f64, u64, f64, f64, f64, f64, f64, f64, f64, usize, usize);

#[pymethods]
impl QueueStats {
    #[new]
    fn new(py: Python<'_>) -> PyResult<Self> {
        let now = Instant::now();
        Ok(Self {
            getc: Py::new(py, StatsCounter::new())?,
            putc: Py::new(py, StatsCounter::new())?,
            state: Mutex::new(QueueState {
                t0: now,
                lap_t0: now,
                empty_t0: now,
                dur_empty: 0.0,
                lap_mark: (0, 0.0, 0, 0.0, 0.0),
            }),
        })
    }

    /// The producing stage starts: the clocks of the report, its laps and the empty queue start now.
    fn start(&self) {
        let mut s = lock(&self.state);
        let now = Instant::now();
        (s.t0, s.lap_t0, s.empty_t0) = (now, now, now);
    }

    /// A `get` waited `elapsed` seconds and left `qsize` items.
    fn got(&self, elapsed: f64, qsize: usize) {
        self.getc.get().update(elapsed, 1);
        if qsize == 0 {
            lock(&self.state).empty_t0 = Instant::now();
        }
    }

    /// A `put` starts on a queue of `qsize` items (an empty queue stops being empty).
    fn putting(&self, qsize: usize) {
        if qsize == 0 {
            let mut s = lock(&self.state);
            s.dur_empty += s.empty_t0.elapsed().as_secs_f64();
        }
    }

    /// The figures of the whole stage (`QueuePerfStats`'s fields), for a queue holding `qsize` of `capacity`.
    fn total(&self, qsize: usize, capacity: usize) -> QueueFigures {
        let s = lock(&self.state);
        let elapsed = s.t0.elapsed().as_secs_f64();
        let occupancy = if elapsed <= 0.0 { 0.0 } else { 1.0 - Self::empty_duration(&s, qsize) / elapsed };
        let (g, p) = (lock(&self.getc.get().0), lock(&self.putc.get().0));
        let ((_, pp90, pp99), (_, gp90, gp99)) = (p.pct.whole(), g.pct.whole());
        (elapsed, g.n, p.mean, g.mean, pp90, pp99, gp90, gp99, occupancy.max(0.0), qsize, capacity)
    }

    /// The figures since the previous lap (`QueuePerfStats`'s fields); starts the next lap.
    fn lap(&self, qsize: usize, capacity: usize) -> QueueFigures {
        let mut s = lock(&self.state);
        let now = Instant::now();
        let dur_empty = Self::empty_duration(&s, qsize);
        let elapsed = now.saturating_duration_since(s.lap_t0).as_secs_f64();
        let (mut g, mut p) = (lock(&self.getc.get().0), lock(&self.putc.get().0));
        let (n_put, a_put, n_get, a_get, d_empty) = s.lap_mark;
        let occupancy = if elapsed <= 0.0 { 0.0 } else { 1.0 - (dur_empty - d_empty) / elapsed };
        let ((_, pp90, pp99), (_, gp90, gp99)) = (p.pct.take_lap(), g.pct.take_lap());
        let figures = (
            elapsed,
            g.n.saturating_sub(n_get),
            lap_mean(p.mean, p.n, a_put, n_put),
            lap_mean(g.mean, g.n, a_get, n_get),
            pp90,
            pp99,
            gp90,
            gp99,
            occupancy.max(0.0),
            qsize,
            capacity,
        );
        s.lap_t0 = now;
        s.lap_mark = (p.n, p.mean, g.n, g.mean, dur_empty);
        figures
    }
}

impl QueueStats {
    /// How long the queue was empty, counting the empty period still open if it is empty now.
    fn empty_duration(s: &QueueState, qsize: usize) -> f64 {
        s.dur_empty + if qsize == 0 { s.empty_t0.elapsed().as_secs_f64() } else { 0.0 }
    }
}

#[derive(Debug)]
struct TaskState {
    num_tasks: u64,
    num_success: u64,
    mean: f64,
    pct: Percentiles,
    /// `(num_tasks, num_success, mean)` at the start of the lap.
    lap_mark: (u64, u64, f64),
}

/// The `TaskPerfStats` fields, in order: `num_tasks, num_failures, ave_time, p90_time, p99_time, p50_time`.
type TaskFigures = (u64, u64, f64, f64, f64, f64);

/// A `TaskStatsHook`'s counts: tasks, successes, and the running mean and percentiles of the successful
/// tasks' times (whole stage and since the last lap).
#[pyclass(module = "spdl_rs._native.pipeline", name = "_TaskStats", frozen)]
#[derive(Debug)]
pub struct TaskStats(Mutex<TaskState>);

#[pymethods]
impl TaskStats {
    #[new]
    fn new() -> Self {
        Self(Mutex::new(TaskState {
            num_tasks: 0,
            num_success: 0,
            mean: 0.0,
            pct: Percentiles::new(),
            lap_mark: (0, 0, 0.0),
        }))
    }

    /// Tasks completed (successful or not).
    #[getter]
    fn num_tasks(&self) -> u64 {
        lock(&self.0).num_tasks
    }

    /// Tasks that succeeded.
    #[getter]
    fn num_success(&self) -> u64 {
        lock(&self.0).num_success
    }

    /// The mean time of a successful task.
    #[getter]
    fn ave_time(&self) -> f64 {
        lock(&self.0).mean
    }

    /// A task succeeded after `elapsed` seconds.
    fn success(&self, elapsed: f64) {
        let mut s = lock(&self.0);
        s.num_tasks += 1;
        s.num_success += 1;
        s.mean += (elapsed - s.mean) / s.num_success as f64;
        s.pct.update(elapsed);
    }

    /// A task failed.
    fn failure(&self) {
        lock(&self.0).num_tasks += 1;
    }

    /// The figures of the whole stage (`TaskPerfStats`'s fields).
    fn total(&self) -> TaskFigures {
        let s = lock(&self.0);
        let (p50, p90, p99) = s.pct.whole();
        (s.num_tasks, s.num_tasks - s.num_success, s.mean, p90, p99, p50)
    }

    /// The figures since the previous lap (`TaskPerfStats`'s fields); starts the next lap.
    fn lap(&self) -> TaskFigures {
        let mut s = lock(&self.0);
        let (n_tasks, n_success, mean) = s.lap_mark;
        let d_tasks = s.num_tasks.saturating_sub(n_tasks);
        let d_success = s.num_success.saturating_sub(n_success);
        let ave = lap_mean(s.mean, s.num_success, mean, n_success).max(0.0);
        let (p50, p90, p99) = s.pct.take_lap();
        s.lap_mark = (s.num_tasks, s.num_success, s.mean);
        (d_tasks, d_tasks.saturating_sub(d_success), ave, p90, p99, p50)
    }
}

/// The values an environment flag reads as true, and as false.
const TRUES: [&str; 7] = ["1", "true", "TRUE", "on", "ON", "yes", "YES"];
const FALSES: [&str; 7] = ["0", "false", "FALSE", "off", "OFF", "no", "NO"];

/// The boolean value of environment variable `name` (`default` when it is unset): true for `1`, `true`,
/// `on`, `yes` (lower or upper case), false otherwise, with a warning to the `spdl_rs.pipeline` logger for a
/// value that is none of these nor `0`, `false`, `off`, `no`.
#[pyfunction]
#[pyo3(signature = (name, default = false))]
pub fn _get_env_bool(py: Python<'_>, name: &str, default: bool) -> PyResult<bool> {
    let Some(value) = std::env::var_os(name) else { return Ok(default) };
    let value = value.to_string_lossy().into_owned();
    if TRUES.contains(&value.as_str()) {
        return Ok(true);
    }
    if !FALSES.contains(&value.as_str()) {
        let expected: Vec<String> = TRUES.iter().chain(&FALSES).map(|v| format!("'{v}'")).collect();
        let msg = format!(
            "Unexpected environment variable value `{name}={value}`. Expected one of [{}]",
            expected.join(", ")
        );
        pipeline_logger(py)?.call_method1("warning", (msg,))?;
    }
    Ok(false)
}

/// `set_compact_log`'s setting (`None`: the environment decides).
static COMPACT_LOG: Mutex<Option<bool>> = Mutex::new(None);

/// Sets the compact logging of task failures.
///
/// In compact mode a failed task logs one line (exception type, message and where it was raised) instead of
/// the whole traceback.
///
/// Args:
///     value: ``True`` (compact), ``False`` (full tracebacks), or ``None`` to go back to the default: the
///         ``SPDL_PIPELINE_COMPACT_LOG`` environment variable, ``False`` when it is unset.
#[pyfunction]
pub fn set_compact_log(value: Option<bool>) {
    *lock(&COMPACT_LOG) = value;
}

/// Whether task failures are logged on one line (`set_compact_log`, else `SPDL_PIPELINE_COMPACT_LOG`, read
/// once).
fn compact_log(py: Python<'_>) -> PyResult<bool> {
    if let Some(v) = *lock(&COMPACT_LOG) {
        return Ok(v);
    }
    let v = _get_env_bool(py, "SPDL_PIPELINE_COMPACT_LOG", false)?;
    *lock(&COMPACT_LOG) = Some(v);
    Ok(v)
}

/// The `spdl_rs.pipeline` logger.
fn pipeline_logger(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("logging")?.call_method1("getLogger", ("spdl_rs.pipeline",))
}

/// How often each raise site `(file, line)` failed, for `create_task(..., suppress_repeated_logs=True)`.
static RAISE_SITES: Mutex<Option<HashMap<(String, i64), u64>>> = Mutex::new(None);

/// Where `exc` was raised: the file, line and function of its traceback's last frame.
fn raise_site(exc: &Bound<'_, PyAny>) -> PyResult<Option<(String, i64, String)>> {
    let mut tb = exc.getattr("__traceback__")?;
    if tb.is_none() {
        return Ok(None);
    }
    loop {
        let next = tb.getattr("tb_next")?;
        if next.is_none() {
            break;
        }
        tb = next;
    }
    let code = tb.getattr("tb_frame")?.getattr("f_code")?;
    let line = tb.getattr("tb_lineno")?.extract::<Option<i64>>()?.unwrap_or(0);
    Ok(Some((code.getattr("co_filename")?.extract()?, line, code.getattr("co_name")?.extract()?)))
}

/// Logs how the asyncio task `task` ended, to the `spdl_rs.pipeline` logger: a failure with its traceback
/// (`"Task [name] failed."`), or on one line when `compact`; a timeout as `"Task [name] timeout."`; a
/// cancellation only with `log_cancelled`. With `suppress_repeated_logs`, the failures raised at one place
/// stop being logged after `suppression_threshold` of them, but for a count every
/// `suppression_warning_interval`. A `BaseException` that is not an `Exception` is raised again. Compact
/// mode is `set_compact_log`'s.
#[pyfunction]
#[pyo3(signature = (task, *, log_cancelled, suppress_repeated_logs, suppression_threshold, suppression_warning_interval))]
pub fn _log_task_result(
    task: &Bound<'_, PyAny>,
    log_cancelled: bool,
    suppress_repeated_logs: bool,
    suppression_threshold: u64,
    suppression_warning_interval: u64,
) -> PyResult<()> {
    let py = task.py();
    let log = pipeline_logger(py)?;
    // The caller of the done callback (the event loop) is where the record says it was logged from.
    let at = |exc| log_kwargs(py, exc);
    let name = task.call_method0("get_name")?;
    if task.call_method0("cancelled")?.is_truthy()? {
        if log_cancelled {
            log.call_method("warning", ("Task [%s] was cancelled.", &name), Some(&at(None)?))?;
        }
        return Ok(());
    }
    let err = task.call_method0("exception")?;
    if err.is_none() {
        return Ok(());
    }
    let timeout = py.import("asyncio")?.getattr("TimeoutError")?;
    if err.is_instance(&py.get_type::<PyTimeoutError>())? || err.is_instance(&timeout)? {
        log.call_method("error", ("Task [%s] timeout.", &name), Some(&at(None)?))?;
        return Ok(());
    }
    if !err.is_instance(&py.get_type::<PyException>())? {
        return Err(PyErr::from_value(err));
    }
    let site = raise_site(&err)?;
    if let (true, Some((file, line, func))) = (suppress_repeated_logs, &site) {
        let count = {
            let mut sites = lock(&RAISE_SITES);
            let n = sites.get_or_insert_with(HashMap::new).entry((file.clone(), *line)).or_insert(0);
            *n += 1;
            *n
        };
        if count == suppression_threshold {
            let msg = "Errors are repeated at %s:%d:%s, holding on logging.";
            log.call_method1("warning", (msg, file, line, func))?;
            return Ok(());
        }
        if count > suppression_threshold {
            if count % suppression_warning_interval.max(1) == 0 {
                log.call_method1("warning", ("%d errors were logged at %s:%d:%s.", count, file, line, func))?;
            }
            return Ok(());
        }
    }
    if compact_log(py)? {
        let (file, line, func) = site.unwrap_or_else(|| ("<unknown>".to_owned(), 0, "<unknown>".to_owned()));
        let type_name = err.get_type().name()?;
        let args = ("Task [%s]: %s: %s (%s:%d:%s)", &name, type_name, &err, file, line, func);
        log.call_method("error", args, Some(&at(None)?))?;
    } else {
        log.call_method("error", ("Task [%s] failed.", &name), Some(&at(Some(&err))?))?;
    }
    Ok(())
}

/// The keyword arguments of a log call from a done callback: `stacklevel`, and `exc_info` if given.
fn log_kwargs<'py>(py: Python<'py>, exc: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyDict>> {
    let kw = PyDict::new(py);
    kw.set_item("stacklevel", 2)?;
    if let Some(exc) = exc {
        kw.set_item("exc_info", exc)?;
    }
    Ok(kw)
}

/// `v` as Python's `%{width}.1f` writes it (`nan` and `inf` included).
fn fixed1(v: f64, width: usize) -> String {
    let s = if v.is_nan() {
        "nan".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else {
        format!("{v:.1}")
    };
    format!("{s:>width$}")
}

/// A duration for logs: microseconds, milliseconds or seconds, fixed width (`" 12.5 [ ms]"`).
fn time_str(val: f64) -> String {
    if val < 0.0001 {
        format!("{} [ us]", fixed1(val * 1e6, 6))
    } else if val < 1.0 {
        format!("{} [ ms]", fixed1(val * 1e3, 6))
    } else {
        format!("{} [sec]", fixed1(val, 6))
    }
}

/// The line `TaskStatsHook` logs for `stats` (a `TaskPerfStats`) of the stage `info`, in SPDL's words.
#[pyfunction]
pub fn _task_stats_line(info: &Bound<'_, PyAny>, stats: &Bound<'_, PyAny>) -> PyResult<String> {
    let f = |name: &str| stats.getattr(name)?.extract::<f64>();
    let n = |name: &str| stats.getattr(name)?.extract::<i64>();
    Ok(format!(
        "[{}]\tCompleted {:5} tasks ({:3} failed). Ave task time: {}. P90: {}. P99: {}.",
        info.str()?,
        n("num_tasks")?,
        n("num_failures")?,
        time_str(f("ave_time")?),
        time_str(f("p90_time")?),
        time_str(f("p99_time")?),
    ))
}

/// The line `StatsQueue` logs for `stats` (a `QueuePerfStats`) under `name`, in SPDL's words.
#[pyfunction]
pub fn _queue_stats_line(name: &Bound<'_, PyAny>, stats: &Bound<'_, PyAny>) -> PyResult<String> {
    let f = |attr: &str| stats.getattr(attr)?.extract::<f64>();
    let t = |attr: &str| f(attr).map(time_str);
    Ok(format!(
        "[{}]\tProcessed {:5} items in {} (QPS: {}) Ave wait time: put: {}, get (by next stage): {}. \
         P90: put: {}, get: {}. P99: put: {}, get: {}. Occupancy rate: {}%",
        name.str()?,
        stats.getattr("num_items")?.extract::<i64>()?,
        t("elapsed")?,
        fixed1(f("qps")?, 6),
        t("ave_put_time")?,
        t("ave_get_time")?,
        t("p90_put_time")?,
        t("p90_get_time")?,
        t("p99_put_time")?,
        t("p99_get_time")?,
        (100.0 * f("occupancy_rate")?).trunc() as i64,
    ))
}

/// What `_stage_figures` returns: `(name, kind, concurrency, busy, task, queue, item_bytes)`.
type StageFigures = (String, String, i64, f64, TaskFigures, QueueFigures, Option<i64>);

/// The fields of a `StageStats` row (with its `TaskPerfStats` and `QueuePerfStats` as tuples) from one dict of
/// `PipelineCore.stats()`, and the next stage's (`None` for the last), which gives the occupancy of the queue
/// between them: the share of the time it was not empty, from its consumer's waits for input (its workers
/// together waited `starved` seconds of `concurrency * elapsed`). The engine times waits in total only, so the
/// queue's percentiles are 0.
#[pyfunction]
#[pyo3(signature = (raw, next_raw=None))]
pub fn _stage_figures(raw: &Bound<'_, PyAny>, next_raw: Option<&Bound<'_, PyAny>>) -> PyResult<StageFigures> {
    let f = |d: &Bound<'_, PyAny>, k: &str| d.get_item(k)?.extract::<f64>();
    let n = |k: &str| raw.get_item(k)?.extract::<u64>();
    let per_item = |total: f64, n: u64| if n == 0 { 0.0 } else { total / n as f64 };
    let occupancy = match next_raw {
        None => 0.0,
        Some(next) => {
            let elapsed = f(next, "elapsed")? * next.get_item("concurrency")?.extract::<i64>()?.max(1) as f64;
            if elapsed <= 0.0 { 0.0 } else { (1.0 - f(next, "starved")? / elapsed).clamp(0.0, 1.0) }
        }
    };
    let (calls, out) = (n("items_in")?, n("items_out")?);
    let task = (
        calls,
        n("items_failed")?,
        f(raw, "task_mean")?,
        f(raw, "task_p90")?,
        f(raw, "task_p99")?,
        f(raw, "task_p50")?,
    );
    let queue = (
        f(raw, "elapsed")?,
        out,
        per_item(f(raw, "blocked")?, out),
        per_item(f(raw, "starved")?, calls),
        0.0,
        0.0,
        0.0,
        0.0,
        occupancy,
        raw.get_item("queue_len")?.extract()?,
        raw.get_item("queue_capacity")?.extract()?,
    );
    let item_bytes = match raw.get_item("item_bytes") {
        Ok(v) => v.extract()?,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(raw.py()) => None,
        Err(e) => return Err(e),
    };
    let (name, kind) = (raw.get_item("name")?.extract()?, raw.get_item("kind")?.extract()?);
    Ok((name, kind, raw.get_item("concurrency")?.extract()?, f(raw, "busy")?, task, queue, item_bytes))
}

/// One measurement of `profile_pipeline`: a stage at one concurrency, over the window from its pipeline's
/// start to the end of its output. `concurrency`, `qps` and `occupancy_rate` are SPDL's; the rest (spdl_rs
/// only) come from the same window.
#[pyclass(module = "spdl_rs.pipeline._profile", name = "_ProfileStats", frozen, get_all)]
#[derive(Debug, PartialEq)]
pub struct ProfileStats {
    /// The stage's concurrency.
    concurrency: i64,
    /// Items the stage put out per second (the window's rate of the stage).
    qps: f64,
    /// Share of the window its output queue held an item (1 - the share the consumer waited for one).
    occupancy_rate: f64,
    /// Share of the stage's capacity (`concurrency` x the window) spent in its function.
    busy: f64,
    /// Share of the window the stage's workers waited for input.
    starved: f64,
    /// Share of the window the stage's workers waited for room in the output queue.
    blocked: f64,
    /// Mean seconds per call.
    task_mean: f64,
    /// Input items per second (items out of the source over the window; differs from `qps` for an
    /// aggregate or disaggregate).
    throughput: f64,
    /// Items the stage put out in the window.
    num_items: i64,
    /// The window's length in seconds (from the pipeline's start to the end of its output).
    duration: f64,
}

#[pymethods]
impl ProfileStats {
    #[new]
    #[pyo3(signature = (
        concurrency, qps, occupancy_rate, busy=0.0, starved=0.0, blocked=0.0, task_mean=0.0, throughput=0.0,
        num_items=0, duration=0.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        concurrency: i64,
        qps: f64,
        occupancy_rate: f64,
        busy: f64,
        starved: f64,
        blocked: f64,
        task_mean: f64,
        throughput: f64,
        num_items: i64,
        duration: f64,
    ) -> Self {
        Self { concurrency, qps, occupancy_rate, busy, starved, blocked, task_mean, throughput, num_items, duration }
    }

    /// The profiled stage's figures in `window` (a `Pipeline.stats_window()` of a source, the stage and a
    /// sink: the stage's row is the one before the sink), at `concurrency`, with `num_outputs` items out.
    #[staticmethod]
    fn from_window(window: &Bound<'_, PyAny>, concurrency: i64, num_outputs: i64) -> PyResult<Self> {
        let rows: Vec<Bound<'_, PyAny>> = window.get_item("stages")?.extract()?;
        let kind = |r: &Bound<'_, PyAny>| r.get_item("kind")?.extract::<String>();
        let (stage, sink) = match rows.as_slice() {
            [_, .., stage, sink] if kind(sink)? == "sink" => (stage, sink),
            _ => {
                let names =
                    rows.iter().map(|r| r.get_item("name")?.str()?.extract()).collect::<PyResult<Vec<String>>>()?;
                return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "[INTERNAL ERROR] a profiled pipeline has the rows {names:?}, not source, stage, sink"
                )));
            }
        };
        let f = |d: &Bound<'_, PyAny>, k: &str| d.get_item(k)?.extract::<f64>();
        let duration = f(window, "duration")?;
        let rate = f(stage, "rate")?;
        Ok(Self {
            concurrency,
            qps: if duration > 0.0 { rate } else { f64::NAN },
            occupancy_rate: (1.0 - f(sink, "starved")?).clamp(0.0, 1.0),
            busy: f(stage, "busy")?,
            starved: f(stage, "starved")?,
            blocked: f(stage, "blocked")?,
            task_mean: f(stage, "task_mean")?,
            throughput: f(window, "throughput")?,
            num_items: if duration > 0.0 { (rate * duration).round() as i64 } else { num_outputs },
            duration,
        })
    }

    /// Equal to another `_ProfileStats` with the same fields.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Self>().is_ok_and(|o| o.get() == self)
    }

    /// Pickles as the constructor's arguments.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (Bound<'py, pyo3::types::PyType>, (i64, f64, f64, f64, f64, f64, f64, f64, i64, f64)) {
        let s = slf.get();
        let args = (
            s.concurrency,
            s.qps,
            s.occupancy_rate,
            s.busy,
            s.starved,
            s.blocked,
            s.task_mean,
            s.throughput,
            s.num_items,
            s.duration,
        );
        (slf.get_type(), args)
    }

    fn __repr__(&self) -> String {
        format!(
            "_ProfileStats(concurrency={}, qps={}, occupancy_rate={}, busy={}, starved={}, blocked={}, \
             task_mean={}, throughput={}, num_items={}, duration={})",
            self.concurrency,
            py_float(self.qps),
            py_float(self.occupancy_rate),
            py_float(self.busy),
            py_float(self.starved),
            py_float(self.blocked),
            py_float(self.task_mean),
            py_float(self.throughput),
            self.num_items,
            py_float(self.duration)
        )
    }
}

/// `v` as Python's `repr` of a float writes it in the common cases (`nan`, `inf`; `1.0`, not `1`).
fn py_float(v: f64) -> String {
    match v {
        v if v.is_nan() => "nan".to_owned(),
        f64::INFINITY => "inf".to_owned(),
        f64::NEG_INFINITY => "-inf".to_owned(),
        v => format!("{v:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2_matches_the_exact_percentile_of_a_uniform_stream() {
        let mut p = P2::new(90.0);
        for i in 0..10_000 {
            p.update(f64::from((i * 7919) % 10_000));
        }
        assert!((p.value() - 9_000.0).abs() < 100.0, "{}", p.value());
    }

    #[test]
    fn p2_over_few_values_takes_the_nearest_one() {
        let mut p = P2::new(50.0);
        assert_eq!(p.value(), 0.0);
        for v in [3.0, 1.0, 2.0] {
            p.update(v);
        }
        assert_eq!(p.value(), 2.0);
        p.reset();
        assert_eq!(p.value(), 0.0);
    }

    #[test]
    fn time_str_picks_the_unit() {
        assert_eq!(time_str(0.00005), "  50.0 [ us]");
        assert_eq!(time_str(0.5), " 500.0 [ ms]");
        assert_eq!(time_str(12.0), "  12.0 [sec]");
    }

    #[test]
    fn lap_mean_is_the_mean_of_what_was_added() {
        // 2 values of mean 1.0, then 2 more of mean 3.0: the running mean is 2.0 over 4.
        assert_eq!(lap_mean(2.0, 4, 1.0, 2), 3.0);
        assert_eq!(lap_mean(2.0, 4, 2.0, 4), 0.0);
    }
}
