//! Ctrl-C (SIGINT) during `spdl bench` and `spdl demo`: the process stops cleanly within about a second
//! and prints the figures measured so far (the stats table, or the JSON report with `interrupted: true`).

mod reliability_util;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reliability_util::watchdog;

/// The goal is one second; the assertion leaves room for a loaded 2-core CI machine.
const STOP_LIMIT: Duration = Duration::from_secs(3);

/// What an interrupted run left behind.
struct Interrupted {
    stop_time: Duration,
    success: bool,
    stdout: String,
    stderr: String,
}

/// CPU time (user + system) of process `pid`, in clock ticks (1/100 s on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name: state is the 1st, utime the 12th and stime the 13th.
            let rest = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

/// Starts `spdl ARGS DIR`, waits until its pipeline runs (the `ready` line on stderr, if given) and has
/// then decoded for two CPU-seconds, sends SIGINT and measures how long the process takes to exit.
fn interrupt(args: &[&str], dir: &Path, ready: Option<&'static str>) -> Interrupted {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .args(args)
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spdl");
    let mut stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let (ready_tx, ready_rx) = mpsc::channel();
    let err_reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if ready.is_some_and(|r| line.contains(r)) {
                let _ = ready_tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    if ready.is_some() && ready_rx.recv_timeout(Duration::from_secs(300)).is_err() {
        let _ = child.kill();
        panic!("spdl {args:?} did not start its pipeline: {}", err_reader.join().unwrap_or_default());
    }
    // Then two CPU-seconds of work (robust on a loaded machine, unlike a wall-clock sleep).
    let t0 = cpu_ticks(child.id());
    let t = Instant::now();
    while cpu_ticks(child.id()) < t0 + 200 && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.try_wait().expect("try_wait").is_none(), "spdl ended before the signal");
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits");
    let t = Instant::now();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped; no memory is involved.
    let rc = unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(rc, 0, "kill failed");
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("spdl {args:?} still running 60 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stop_time = t.elapsed();
    Interrupted {
        stop_time,
        success: status.success(),
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    }
}

fn gen_images(dir: &Path, n: usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_spdl"))
        .arg("gen-data")
        .arg(dir)
        .args(["--images", &n.to_string(), "--classes", "3"])
        .output()
        .expect("gen-data");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

// Small batches: a debug build decodes a 500x375 JPEG in tens of milliseconds, and the test wants
// finished batches in the figures before it sends the signal.
const LOADER: &[&str] = &["--threads", "2", "--batch-size", "2", "--size", "32", "--epochs", "100000", "--no-gpu"];

#[test]
fn sigint_during_bench_stops_within_a_second_and_prints_the_table() {
    watchdog(600, || {
        let dir = tempfile::tempdir().expect("tempdir");
        gen_images(dir.path(), 24);
        let mut args = vec!["bench", "--no-progress"];
        args.extend(LOADER);
        let r = interrupt(&args, dir.path(), Some("CPU batches"));
        println!("spdl bench stopped {:?} after SIGINT", r.stop_time);
        assert!(r.success, "exit status: {}", r.stderr);
        assert!(r.stop_time < STOP_LIMIT, "took {:?} to stop", r.stop_time);
        assert!(r.stdout.contains("interrupted (Ctrl-C): figures so far"), "{}", r.stdout);
        for stage in ["read", "decode"] {
            assert!(r.stdout.lines().any(|l| l.contains(stage)), "no `{stage}` row in:\n{}", r.stdout);
        }
        let summary = r.stdout.lines().find(|l| l.contains("images (")).expect("summary line");
        let images: u64 = summary.split_whitespace().next().and_then(|n| n.parse().ok()).expect("image count");
        assert!(images > 0, "{summary}");
    });
}

#[test]
fn sigint_during_bench_json_reports_interrupted() {
    watchdog(600, || {
        let dir = tempfile::tempdir().expect("tempdir");
        gen_images(dir.path(), 24);
        let mut args = vec!["bench", "--json"];
        args.extend(LOADER);
        // With --json nothing is printed before the report: wait for CPU work only.
        let r = interrupt(&args, dir.path(), None);
        println!("spdl bench --json stopped {:?} after SIGINT", r.stop_time);
        assert!(r.success, "{}", r.stderr);
        assert!(r.stop_time < STOP_LIMIT, "took {:?} to stop", r.stop_time);
        let report: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("one JSON object");
        assert_eq!(report.get("interrupted"), Some(&serde_json::Value::Bool(true)), "{report}");
        assert!(report.get("images").and_then(serde_json::Value::as_u64).is_some_and(|n| n > 0), "{report}");
    });
}

#[test]
fn sigint_during_demo_stops_within_a_second_and_prints_the_table() {
    watchdog(600, || {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = vec!["demo", "--images", "24", "--no-progress"];
        args.extend(LOADER);
        args.push("--dir");
        let r = interrupt(&args, dir.path(), Some("CPU batches"));
        println!("spdl demo stopped {:?} after SIGINT", r.stop_time);
        assert!(r.success, "{}", r.stderr);
        assert!(r.stop_time < STOP_LIMIT, "took {:?} to stop", r.stop_time);
        assert!(r.stdout.contains("interrupted (Ctrl-C): figures so far"), "{}", r.stdout);
        assert!(r.stdout.lines().any(|l| l.contains("decode")), "{}", r.stdout);
    });
}
