//! What `demo` and `bench` print: a table for people, one JSON object for CI.

use serde::Serialize;
use spdl_exec::autotune::{AutotuneReport, Knob};
use spdl_exec::{PipelineStats, StageStats};

/// One run's figures (`--json` prints exactly this).
#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: String,
    pub path: String,
    /// Images delivered in batches (failed images excluded).
    pub images: u64,
    /// Images that could not be read or decoded (each logged with its path and cause).
    pub failed: u64,
    /// Whole batches lost to a stage failure (should be 0: decode failures are per image).
    pub failed_batches: u64,
    pub batches: u64,
    pub seconds: f64,
    /// Seconds from starting the pipeline to the first batch (`None` if none came).
    pub first_batch_seconds: Option<f64>,
    pub images_per_sec: f64,
    pub cpu_seconds: f64,
    pub images_per_cpu_second: f64,
    pub peak_rss_bytes: u64,
    pub threads: usize,
    pub batch_size: usize,
    pub size: u32,
    pub epochs: usize,
    /// True when Ctrl-C stopped the run early.
    pub interrupted: bool,
    /// True when batches went to a GPU (pinned memory, `h2d` stage).
    pub gpu: bool,
    /// Host-to-device bandwidth of the copies (copy-engine time), GPU runs only.
    pub h2d_gbps: Option<f64>,
    /// Bytes copied to the GPU.
    pub h2d_bytes: Option<u64>,
    /// Share of pinned batch allocations served from the pool's cache.
    pub pinned_hit_rate: Option<f64>,
    /// Share of batch allocations (pinned or heap) served from the recycling pool.
    pub batch_pool_hit_rate: f64,
    pub bottleneck: Option<String>,
    pub stages: Vec<StageReport>,
    /// What the auto-tuner did (`--autotune` only).
    pub autotune: Option<AutotuneSummary>,
}

/// One change of the auto-tuner.
#[derive(Debug, Serialize)]
pub struct TuneChange {
    pub at_s: f64,
    pub stage: String,
    /// `concurrency`, `queue_capacity` (of the queue after the stage) or `threads` (`pool`).
    pub knob: &'static str,
    pub from: usize,
    pub to: usize,
    pub reason: String,
}

/// The auto-tuner's trajectory and where it ended.
#[derive(Debug, Serialize)]
pub struct AutotuneSummary {
    /// Seconds from the start to the first time it settled.
    pub settled_at_s: Option<f64>,
    pub rounds: u32,
    pub threads: usize,
    pub max_memory_bytes: Option<u64>,
    /// Each tuned stage's concurrency at its start (before the first change) and at the end.
    pub start: Vec<(String, usize)>,
    pub end: Vec<(String, usize)>,
    pub changes: Vec<TuneChange>,
}

impl AutotuneSummary {
    pub fn new(r: &AutotuneReport, stats: &PipelineStats) -> Self {
        let tuned = stats.stages.iter().filter(|s| s.concurrency_bounds.is_some());
        let end: Vec<(String, usize)> = tuned.map(|s| (s.name.clone(), s.concurrency)).collect();
        let start = end
            .iter()
            .map(|(name, c)| {
                let first =
                    r.decisions.iter().find(|d| &d.stage == name && d.knob == Knob::Concurrency).map_or(*c, |d| d.from);
                (name.clone(), first)
            })
            .collect();
        Self {
            settled_at_s: r.settled_at.map(|d| d.as_secs_f64()),
            rounds: r.rounds,
            threads: r.threads,
            max_memory_bytes: r.max_memory_bytes,
            start,
            end,
            changes: r
                .decisions
                .iter()
                .map(|d| TuneChange {
                    at_s: d.at.as_secs_f64(),
                    stage: d.stage.clone(),
                    knob: d.knob.as_str(),
                    from: d.from,
                    to: d.to,
                    reason: d.reason.clone(),
                })
                .collect(),
        }
    }
}

/// One stage's row.
#[derive(Debug, Serialize)]
pub struct StageReport {
    pub name: String,
    pub concurrency: usize,
    pub items_in: u64,
    pub items_out: u64,
    pub items_failed: u64,
    pub task_mean_us: f64,
    pub task_p50_us: f64,
    pub task_p90_us: f64,
    pub task_p99_us: f64,
    pub starved_s: f64,
    pub blocked_s: f64,
    pub busy: f64,
    pub queue_len: usize,
    pub queue_capacity: usize,
    /// The auto-tuner's bounds for this stage (`None`: not tuned) and why it last changed it.
    pub concurrency_bounds: Option<(usize, usize)>,
    pub tune_reason: Option<String>,
}

impl From<&StageStats> for StageReport {
    fn from(s: &StageStats) -> Self {
        let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
        StageReport {
            name: s.name.clone(),
            concurrency: s.concurrency,
            items_in: s.items_in,
            items_out: s.items_out,
            items_failed: s.items_failed,
            task_mean_us: us(s.task_mean),
            task_p50_us: us(s.task_p50),
            task_p90_us: us(s.task_p90),
            task_p99_us: us(s.task_p99),
            starved_s: s.starved.as_secs_f64(),
            blocked_s: s.blocked.as_secs_f64(),
            busy: s.busy,
            queue_len: s.queue_len,
            queue_capacity: s.queue_capacity,
            concurrency_bounds: s.concurrency_bounds,
            tune_reason: s.tune_reason.clone(),
        }
    }
}

impl Report {
    /// The human summary under the stats table.
    pub fn print_summary(&self) {
        let mib = self.peak_rss_bytes as f64 / (1024.0 * 1024.0);
        if self.interrupted {
            println!("interrupted (Ctrl-C): figures so far");
        }
        println!(
            "{} images ({} failed) in {:.2} s: {:.0} images/s, {:.0} images per CPU-second ({:.2} CPU s), peak RSS {:.0} MiB",
            self.images,
            self.failed,
            self.seconds,
            self.images_per_sec,
            self.images_per_cpu_second,
            self.cpu_seconds,
            mib
        );
        println!(
            "{} threads, batch {}, {}x{}{}",
            self.threads,
            self.batch_size,
            self.size,
            self.size,
            match &self.bottleneck {
                Some(b) => format!(", bottleneck: {b}"),
                None => String::new(),
            }
        );
        if let Some(t) = &self.autotune {
            let moves: Vec<String> =
                t.start.iter().zip(&t.end).map(|((name, a), (_, b))| format!("{name} {a} -> {b}")).collect();
            println!(
                "autotune: {} changes, {}; {}; pool {} threads",
                t.changes.len(),
                t.settled_at_s.map_or("not settled".to_string(), |s| format!("settled at {s:.1} s")),
                moves.join(", "),
                t.threads
            );
        }
        if self.gpu {
            println!(
                "GPU: {:.1} GiB copied, H2D {}, pinned pool hit rate {}",
                self.h2d_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64,
                self.h2d_gbps.map_or("n/a".to_string(), |g| format!("{g:.1} GB/s")),
                self.pinned_hit_rate.map_or("n/a".to_string(), |h| format!("{:.1}%", h * 100.0)),
            );
        }
    }
}
