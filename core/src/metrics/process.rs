//! The `process_*` metrics of `client_golang`'s process collector, read
//! from `/proc` at scrape time.
//!
//! Upstream's default registry includes the process collector, so scrapes of
//! the Go binaries carry nine `process_*` families. konn reads the same
//! files the same way (`prometheus/procfs`):
//!
//! | metric | source |
//! |---|---|
//! | `process_cpu_seconds_total` | `/proc/self/stat` utime + stime, divided by 100 (procfs assumes `USER_HZ` = 100) |
//! | `process_virtual_memory_bytes` | `/proc/self/stat` vsize |
//! | `process_resident_memory_bytes` | `/proc/self/stat` rss × page size |
//! | `process_start_time_seconds` | `/proc/stat` btime + starttime / 100 |
//! | `process_open_fds` | entries of `/proc/self/fd` (from its `stat` size where the kernel gives it, Linux ≥ 6.2) |
//! | `process_max_fds` | soft "Max open files" of `/proc/self/limits` |
//! | `process_virtual_memory_max_bytes` | soft "Max address space" of `/proc/self/limits` |
//! | `process_network_receive_bytes_total` | `IpExt: InOctets` of `/proc/self/net/netstat` |
//! | `process_network_transmit_bytes_total` | `IpExt: OutOctets` of `/proc/self/net/netstat` |
//!
//! "unlimited" reads as 2^64 - 1, as in procfs. When a file cannot be read
//! the metrics it feeds are left out of the scrape, as the Go collector does
//! (it is registered without `ReportErrors`). The network counters are those
//! of the process's network namespace, not of the process alone; that is
//! what the Go collector reports too.

/// The nine process values, each `None` when its source was unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ProcessSnapshot {
    pub(crate) cpu_seconds: Option<f64>,
    pub(crate) virtual_memory: Option<f64>,
    pub(crate) resident_memory: Option<f64>,
    pub(crate) start_time: Option<f64>,
    pub(crate) open_fds: Option<f64>,
    pub(crate) max_fds: Option<f64>,
    pub(crate) virtual_memory_max: Option<f64>,
    pub(crate) network_receive: Option<f64>,
    pub(crate) network_transmit: Option<f64>,
}

/// Which process metric a registry family shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcessMetric {
    CpuSeconds,
    MaxFds,
    NetworkReceive,
    NetworkTransmit,
    OpenFds,
    ResidentMemory,
    StartTime,
    VirtualMemory,
    VirtualMemoryMax,
}

impl ProcessMetric {
    /// Name, HELP text and whether the family is a counter (else a gauge),
    /// as `client_golang` v1.23 registers them.
    pub(crate) const ALL: [(Self, &'static str, &'static str, bool); 9] = [
        (
            Self::CpuSeconds,
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            true,
        ),
        (
            Self::MaxFds,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            false,
        ),
        (
            Self::NetworkReceive,
            "process_network_receive_bytes_total",
            "Number of bytes received by the process over the network.",
            true,
        ),
        (
            Self::NetworkTransmit,
            "process_network_transmit_bytes_total",
            "Number of bytes sent by the process over the network.",
            true,
        ),
        (
            Self::OpenFds,
            "process_open_fds",
            "Number of open file descriptors.",
            false,
        ),
        (
            Self::ResidentMemory,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            false,
        ),
        (
            Self::StartTime,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            false,
        ),
        (
            Self::VirtualMemory,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            false,
        ),
        (
            Self::VirtualMemoryMax,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            false,
        ),
    ];

    pub(crate) fn value(self, snap: &ProcessSnapshot) -> Option<f64> {
        match self {
            Self::CpuSeconds => snap.cpu_seconds,
            Self::MaxFds => snap.max_fds,
            Self::NetworkReceive => snap.network_receive,
            Self::NetworkTransmit => snap.network_transmit,
            Self::OpenFds => snap.open_fds,
            Self::ResidentMemory => snap.resident_memory,
            Self::StartTime => snap.start_time,
            Self::VirtualMemory => snap.virtual_memory,
            Self::VirtualMemoryMax => snap.virtual_memory_max,
        }
    }
}

/// procfs divides tick counts by a constant 100, not by `sysconf(_SC_CLK_TCK)`.
const USER_HZ: f64 = 100.0;

/// Reads every source once.
pub(crate) fn snapshot() -> ProcessSnapshot {
    let mut snap = ProcessSnapshot::default();
    if let Some(stat) = read("/proc/self/stat").as_deref().and_then(parse_stat) {
        snap.cpu_seconds = Some((stat.utime + stat.stime) as f64 / USER_HZ);
        snap.virtual_memory = Some(stat.vsize as f64);
        snap.resident_memory = Some(stat.rss as f64 * page_size() as f64);
        snap.start_time = read("/proc/stat")
            .as_deref()
            .and_then(parse_boot_time)
            .map(|btime| btime as f64 + stat.starttime as f64 / USER_HZ);
    }
    snap.open_fds = open_fds().map(|n| n as f64);
    if let Some(limits) = read("/proc/self/limits") {
        snap.max_fds = parse_limit(&limits, "Max open files").map(|v| v as f64);
        snap.virtual_memory_max = parse_limit(&limits, "Max address space").map(|v| v as f64);
    }
    if let Some((rx, tx)) = read("/proc/self/net/netstat")
        .as_deref()
        .and_then(parse_netstat)
    {
        snap.network_receive = Some(rx);
        snap.network_transmit = Some(tx);
    }
    snap
}

/// Open file descriptors, counted as procfs readers (Go's included) count
/// them: the entries of `/proc/self/fd` while it is open for reading.
///
/// Since Linux 6.2 `stat` of that directory gives the count as its size
/// (from the descriptor table's bitmap); listing it instead instantiates an
/// inode per descriptor: about 5 % of the server's CPU in S9's reconnect
/// storm at 5000 agent tunnels (the benchmark polls `/metrics` every
/// 20 ms), roughly 1.4 ms per scrape. Older kernels report size 0
/// there: then the directory is listed.
fn open_fds() -> Option<u64> {
    const DIR: &str = "/proc/self/fd";
    match std::fs::metadata(DIR) {
        // The listing's own descriptor, which a reader would have counted.
        Ok(m) if m.len() > 0 => Some(m.len() + 1),
        _ => std::fs::read_dir(DIR).ok().map(|d| d.count() as u64),
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The page size, for turning the rss page count into bytes.
#[allow(unsafe_code)]
fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value; it has no memory
    // arguments and no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// The fields of `/proc/<pid>/stat` the collector uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) utime: u64,
    pub(crate) stime: u64,
    pub(crate) starttime: u64,
    pub(crate) vsize: u64,
    pub(crate) rss: i64,
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may
/// itself contain spaces and parentheses, so fields are counted from the
/// last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<Stat> {
    let after = text.get(text.rfind(')')? + 1..)?;
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        utime: field(14)?.parse().ok()?,
        stime: field(15)?.parse().ok()?,
        starttime: field(22)?.parse().ok()?,
        vsize: field(23)?.parse().ok()?,
        rss: field(24)?.parse().ok()?,
    })
}

/// The `btime` line of `/proc/stat` (boot time, seconds since the epoch).
pub(crate) fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of the `/proc/<pid>/limits` row named `name`.
pub(crate) fn parse_limit(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with("  "))
    })?;
    let soft = line.get(name.len()..)?.split_whitespace().next()?;
    if soft == "unlimited" {
        Some(u64::MAX)
    } else {
        soft.parse().ok()
    }
}

/// `InOctets` and `OutOctets` of the `IpExt` section of
/// `/proc/<pid>/net/netstat` (a header line of names, then a line of values).
/// A missing field counts as 0, like procfs's nil pointers.
pub(crate) fn parse_netstat(text: &str) -> Option<(f64, f64)> {
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        let Some(names) = names.strip_prefix("IpExt:") else {
            continue;
        };
        let values = values.strip_prefix("IpExt:")?;
        let mut rx = 0.0;
        let mut tx = 0.0;
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            match name {
                "InOctets" => rx = value.parse().ok()?,
                "OutOctets" => tx = value.parse().ok()?,
                _ => {}
            }
        }
        return Some((rx, tx));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_awkward_command_name() {
        let line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 130 0 0 20 0 9 0 987654 1793384448 8287 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = parse_stat(line).unwrap();
        assert_eq!(
            stat,
            Stat {
                utime: 250,
                stime: 130,
                starttime: 987654,
                vsize: 1_793_384_448,
                rss: 8287,
            }
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn boot_time_limits_and_netstat() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1795300000\nprocesses 9\n"),
            Some(1_795_300_000)
        );
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max open files            20000                1048576              files     \n\
Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(parse_limit(limits, "Max open files"), Some(20000));
        assert_eq!(parse_limit(limits, "Max address space"), Some(u64::MAX));
        assert_eq!(parse_limit(limits, "Max processes"), None);
        let netstat = "TcpExt: SyncookiesSent ListenOverflows\nTcpExt: 0 3\n\
IpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1047201150 743285881\n";
        assert_eq!(
            parse_netstat(netstat),
            Some((1_047_201_150.0, 743_285_881.0))
        );
        assert_eq!(parse_netstat("TcpExt: a\nTcpExt: 1\n"), None);
    }

    #[test]
    fn open_fds_counts_as_a_listing_does() {
        // Other tests of this binary open and close descriptors meanwhile:
        // hence the slack, small against the thousand opened here.
        const N: u64 = 1000;
        const SLACK: u64 = 50;
        let listed = || std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        let before = open_fds().unwrap();
        let files: Vec<_> = (0..N)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let (counted, by_listing) = (open_fds().unwrap(), listed());
        assert!(
            counted.abs_diff(by_listing) <= SLACK,
            "{counted} vs {by_listing}"
        );
        assert!(
            counted.abs_diff(before + N) <= SLACK,
            "{before} + {N} vs {counted}"
        );
        drop(files);
    }

    #[test]
    fn live_snapshot_has_every_value() {
        let snap = snapshot();
        assert!(snap.cpu_seconds.is_some());
        assert!(snap.resident_memory.unwrap() > 0.0);
        assert!(snap.virtual_memory.unwrap() > 0.0);
        assert!(snap.open_fds.unwrap() >= 3.0);
        assert!(snap.max_fds.unwrap() >= snap.open_fds.unwrap());
        assert!(snap.virtual_memory_max.is_some());
        // Started after 2020 and not in the future (by a day of slack).
        let start = snap.start_time.unwrap();
        assert!(start > 1_577_836_800.0, "{start}");
    }
}
