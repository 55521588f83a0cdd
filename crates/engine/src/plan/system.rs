//! This machine's and this process's memory, as Linux reports it (`/proc`, cgroups).

/// A `Key:   123 kB` line of a /proc file, in bytes.
fn proc_kb(path: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    })
}

/// Memory this process may use on a CPU: the smaller of the cgroup limit and MemAvailable.
pub fn available_memory() -> u64 {
    let mem_available = proc_kb("/proc/meminfo", "MemAvailable:").unwrap_or(u64::MAX);
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse::<u64>().ok())
    .unwrap_or(u64::MAX);
    mem_available.min(cgroup)
}

/// Resident set size of this process, from /proc/self/statm.
pub fn current_rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// Peak resident set size of this process (VmHWM).
pub fn peak_rss() -> u64 {
    proc_kb("/proc/self/status", "VmHWM:").unwrap_or(0)
}
