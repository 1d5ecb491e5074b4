//! Resource usage of a process group read from `/proc` (Linux): what `spdl_rs.pipeline`'s
//! `ProcessGroupStatsMonitor` reports (SPDL's `ProcessGroupResourceUsage`).
//!
//! A snapshot sums, over every process whose `/proc/<pid>/stat` names the group: CPU time (`utime + stime`),
//! RSS (`stat`), PSS and private memory (`smaps_rollup`) and storage IO (`io`). A process that exits while it is
//! read is skipped; a file of one process that cannot be parsed is skipped too, and said in the snapshot's
//! `warnings` (the monitor logs each kind once). Network bytes come from `/proc/net/dev` (host-wide, loopback
//! excluded).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The fields of one `/proc/<pid>/stat` that a snapshot uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    pgrp: i64,
    ticks: u64,
    rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name may hold spaces and parentheses: fields are counted after its
/// last `)`.
fn parse_stat(content: &str) -> Result<Stat, String> {
    let head: String = content.chars().take(80).collect();
    let end = content.rfind(')').ok_or_else(|| format!("unexpected /proc/[pid]/stat format (no ')'): {head}"))?;
    let fields: Vec<&str> = content[end + 1..].split_whitespace().collect();
    if fields.len() < 22 {
        return Err(format!(
            "unexpected /proc/[pid]/stat format: expected at least 22 fields after the command, got {}",
            fields.len()
        ));
    }
    let bad = || format!("cannot parse /proc/[pid]/stat: {head}");
    Ok(Stat {
        pgrp: fields[2].parse().map_err(|_| bad())?,
        ticks: fields[11].parse::<u64>().map_err(|_| bad())? + fields[12].parse::<u64>().map_err(|_| bad())?,
        rss_pages: fields[21].parse().map_err(|_| bad())?,
    })
}

/// The `Name: <n> [kB]` lines of `content` whose name is in `names`, in bytes ([`spdl_report::proc_field`]).
fn kb_fields(content: &str, names: &[&str], what: &str) -> Result<HashMap<String, u64>, String> {
    let mut out = HashMap::new();
    for name in names {
        match spdl_report::proc_field(content, name) {
            Some(Ok(n)) => drop(out.insert((*name).to_owned(), n)),
            Some(Err(line)) => return Err(format!("cannot parse {what}: {line}")),
            None => {}
        }
    }
    Ok(out)
}

/// Received and sent bytes over every interface but `lo`, from the text of `/proc/net/dev`.
fn parse_net_dev(content: &str) -> Result<(u64, u64), String> {
    let (mut rx, mut tx) = (0u64, 0u64);
    for line in content.lines().skip(2) {
        let Some((name, counters)) = line.split_once(':') else { continue };
        let parts: Vec<&str> = counters.split_whitespace().collect();
        if name.trim() == "lo" || parts.len() < 9 {
            continue;
        }
        let bad = || {
            let line: String = line.trim().chars().take(80).collect();
            format!("cannot parse a /proc/net/dev line: {line}")
        };
        rx = rx.saturating_add(parts[0].parse().map_err(|_| bad())?);
        tx = tx.saturating_add(parts[8].parse().map_err(|_| bad())?);
    }
    Ok((rx, tx))
}

fn sysconf(name: libc::c_int) -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).unwrap_or(0)
}

/// The counters a snapshot is compared with: `(cpu_usec, time_usec, net_rx_bytes, net_tx_bytes)` of the
/// previous one (the CPU and network ones `None` where they could not be read).
type Counters = (Option<u64>, u64, Option<u64>, Option<u64>);

/// What a snapshot returns: its fields, its counters and its warnings (see [`_process_group_sample`]).
type Sample = (Py<PyDict>, Counters, Vec<(&'static str, String)>);

/// Microseconds on a monotonic clock (since this process first asked).
fn monotonic_usec() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// One snapshot of process group `pgid`, with the deltas against the previous snapshot's counters.
///
/// Returns `(fields, counters, warnings)`: `fields`, the `ProcessGroupResourceUsage` fields read (`cpu_percent`
/// and the network deltas only when the previous counters are given); `counters`, what to pass to the next
/// call; `warnings`, `(kind, message)` for each thing that could not be read (kind: `pgrp_stats` when `/proc`
/// cannot be listed, `net_dev` for `/proc/net/dev`, `proc_stat`, `smaps_rollup` or `proc_io` for one process's
/// file, which is left out).
#[pyfunction]
#[pyo3(signature = (pgid, prev_cpu_usec=None, prev_time_usec=None, prev_net_rx_bytes=None, prev_net_tx_bytes=None))]
pub fn _process_group_sample(
    py: Python<'_>,
    pgid: i64,
    prev_cpu_usec: Option<u64>,
    prev_time_usec: Option<u64>,
    prev_net_rx_bytes: Option<u64>,
    prev_net_tx_bytes: Option<u64>,
) -> PyResult<Sample> {
    let now_usec = monotonic_usec();
    let (usage, net) = py.detach(|| {
        let net = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
        (process_group_usage(pgid), parse_net_dev(&net))
    });
    let d = PyDict::new(py);
    let mut warnings = Vec::new();
    let mut cpu_usec = None;
    match usage {
        Err(e) => warnings.push(("pgrp_stats", e)),
        Ok(mut t) => {
            let cpu = t.ticks.saturating_mul(1_000_000) / sysconf(libc::_SC_CLK_TCK).max(1);
            cpu_usec = Some(cpu);
            if let (Some(prev_cpu), Some(prev_time)) = (prev_cpu_usec, prev_time_usec)
                && now_usec > prev_time
            {
                let percent = (cpu as f64 - prev_cpu as f64) / (now_usec - prev_time) as f64 * 100.0;
                d.set_item("cpu_percent", percent)?;
            }
            d.set_item("rss_bytes", t.rss_pages.saturating_mul(sysconf(libc::_SC_PAGESIZE)))?;
            d.set_item("pss_bytes", t.has_smaps.then_some(t.pss))?;
            d.set_item("private_bytes", t.has_smaps.then_some(t.private))?;
            d.set_item("disk_read_bytes", t.read_bytes)?;
            d.set_item("disk_write_bytes", t.write_bytes)?;
            d.set_item("num_procs", t.procs)?;
            warnings.append(&mut t.warnings);
        }
    }
    let (mut rx, mut tx) = (None, None);
    match net {
        Err(e) => warnings.push(("net_dev", e)),
        Ok((r, t)) => {
            if let (Some(prev_r), Some(prev_t)) = (prev_net_rx_bytes, prev_net_tx_bytes) {
                // Wrapping: a counter that went back (an interface gone) gives a negative delta.
                d.set_item("net_rx_bytes", r.wrapping_sub(prev_r) as i64)?;
                d.set_item("net_tx_bytes", t.wrapping_sub(prev_t) as i64)?;
            }
            (rx, tx) = (Some(r), Some(t));
        }
    }
    Ok((d.unbind(), (cpu_usec, now_usec, rx, tx), warnings))
}

#[derive(Debug, Default)]
struct Totals {
    ticks: u64,
    rss_pages: u64,
    pss: u64,
    private: u64,
    has_smaps: bool,
    read_bytes: u64,
    write_bytes: u64,
    procs: u64,
    warnings: Vec<(&'static str, String)>,
}

fn process_group_usage(pgid: i64) -> Result<Totals, String> {
    let entries = std::fs::read_dir("/proc").map_err(|e| format!("cannot list /proc: {e}"))?;
    let mut t = Totals::default();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        // A process that exited meanwhile has no files any more.
        let read = |file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok();
        let Some(stat) = read("stat") else { continue };
        let stat = match parse_stat(&stat) {
            Ok(s) => s,
            Err(e) => {
                t.warnings.push(("proc_stat", e));
                continue;
            }
        };
        if stat.pgrp != pgid {
            continue;
        }
        t.procs += 1;
        t.ticks = t.ticks.saturating_add(stat.ticks);
        t.rss_pages = t.rss_pages.saturating_add(stat.rss_pages);
        if let Some(smaps) = read("smaps_rollup") {
            match kb_fields(&smaps, &["Pss", "Private_Clean", "Private_Dirty"], "/proc/[pid]/smaps_rollup") {
                Ok(f) => {
                    let get = |k: &str| f.get(k).copied().unwrap_or(0);
                    t.has_smaps = true;
                    t.pss = t.pss.saturating_add(get("Pss"));
                    t.private = t.private.saturating_add(get("Private_Clean").saturating_add(get("Private_Dirty")));
                }
                Err(e) => t.warnings.push(("smaps_rollup", e)),
            }
        }
        if let Some(io) = read("io") {
            match kb_fields(&io, &["read_bytes", "write_bytes"], "/proc/[pid]/io") {
                Ok(f) => {
                    t.read_bytes = t.read_bytes.saturating_add(f.get("read_bytes").copied().unwrap_or(0));
                    t.write_bytes = t.write_bytes.saturating_add(f.get("write_bytes").copied().unwrap_or(0));
                }
                Err(e) => t.warnings.push(("proc_io", e)),
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let fields: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
        let content = format!("123 (a (weird) name) S {}", fields.join(" "));
        // After the command: state (S), ppid (4), pgrp (5), ... utime is field 14, stime 15, rss 24.
        let s = parse_stat(&content).expect("parses");
        assert_eq!(s, Stat { pgrp: 5, ticks: 14 + 15, rss_pages: 24 });
        assert!(parse_stat("123 no parenthesis").is_err());
        assert!(parse_stat("123 (short) S 1 2").is_err());
        assert!(parse_stat(&content.replace(" 14 ", " x ")).is_err());
    }

    #[test]
    fn kb_fields_scale_kilobytes_and_name_a_bad_line() {
        let f = kb_fields("Rss: 10 kB\nPss: 4 kB\nPrivate_Dirty: 2 kB\n", &["Pss", "Private_Dirty"], "x").expect("ok");
        assert_eq!(f.get("Pss"), Some(&4096));
        assert_eq!(f.get("Private_Dirty"), Some(&2048));
        assert!(!f.contains_key("Rss"));
        let io = kb_fields("read_bytes: 7\nwrite_bytes: 9\n", &["read_bytes", "write_bytes"], "io").expect("ok");
        assert_eq!((io["read_bytes"], io["write_bytes"]), (7, 9));
        let err = kb_fields("Pss: lots kB\n", &["Pss"], "/proc/[pid]/smaps_rollup").expect_err("bad");
        assert!(err.contains("smaps_rollup") && err.contains("Pss: lots"), "{err}");
    }

    #[test]
    fn net_dev_sums_every_interface_but_loopback() {
        let text = "Inter-|   Receive\n face |bytes\n    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 5 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n  eth1: 1 1 0 0 0 0 0 0 2 1 0 0 0 0 0 0\n";
        assert_eq!(parse_net_dev(text), Ok((6, 9)));
        assert!(parse_net_dev("a\nb\n eth0: x 1 0 0 0 0 0 0 7\n").is_err());
    }

    #[test]
    fn this_process_is_in_its_own_group() {
        // SAFETY: getpgrp has no preconditions.
        let pgid = i64::from(unsafe { libc::getpgrp() });
        let t = process_group_usage(pgid).expect("reads /proc");
        assert!(t.procs >= 1);
        assert!(t.ticks > 0 || t.rss_pages > 0);
    }
}
