//! What a host process costs, read from `/proc` (Linux): CPU time and
//! resident memory, for benchmarks that measure the host from outside.

use std::time::Duration;

use anyhow::Context as _;

/// utime + stime of process `pid`, from `/proc/<pid>/stat`.
///
/// # Errors
/// When the file cannot be read or parsed (the process is gone).
pub fn process_cpu(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name may hold spaces: fields count from after its ')'.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("a /proc stat line without ')'")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); the state (field 3) is fields[0] here.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// Resident memory of process `pid` in kB (`VmRSS`).
pub fn process_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}
