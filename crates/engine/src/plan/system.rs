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

/// Makes glibc return every large freed block to the system at once, so that the process's
/// resident memory stays what the plan counts. By default glibc raises its mmap threshold to
/// the size of each large block freed (up to 32 MiB), and later blocks of that size come from
/// heaps that keep their pages after `free`: llama.cpp frees and reallocates its compute
/// buffers at every adapter set change, on the engine thread and on each adapter lane's
/// thread, and the pages stayed resident in every thread's heap. Measured with 4 adapter lanes
/// under 16 clients (bench/adapters_bench.py): peak PSS 599 MiB by default, 396 MiB with the
/// threshold fixed at 128 KiB (glibc's initial value), tok/s unchanged within noise. Leaves
/// the threshold alone when the user set `MALLOC_MMAP_THRESHOLD_`; only on glibc.
pub fn return_large_frees() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
                // SAFETY: mallopt only changes glibc's allocator parameters; it is thread-safe
                // (it takes the arena locks) and any value is valid for M_MMAP_THRESHOLD up to
                // HEAP_MAX/2.
                unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
            }
        });
    }
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
