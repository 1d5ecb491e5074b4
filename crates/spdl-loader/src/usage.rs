//! Process resource figures for the reports of `spdl demo`/`bench` and `python -m spdl_rs demo`: CPU
//! seconds and peak RSS.

/// CPU time (user + system) this process has used so far, in seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) != 0 {
            return 0.0;
        }
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Peak resident set size of this process in bytes (`VmHWM`), or 0 where /proc is missing.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    spdl_report::proc_field(&status, "VmHWM").and_then(Result::ok).unwrap_or(0)
}
