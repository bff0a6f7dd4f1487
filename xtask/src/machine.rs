//! Facts about the machine a benchmark ran on, recorded next to its numbers.

use serde_json::{json, Value};

/// Logical cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPU model from `/proc/cpuinfo` (`model name`), if there is one.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    field(&info, "model name").map(str::to_owned)
}

/// The SIMD extensions of the first CPU that matter to the matmul kernels.
fn simd_flags() -> Vec<&'static str> {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return vec![];
    };
    let flags: Vec<&str> = field(&info, "flags")
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    ["avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq"]
        .into_iter()
        .filter(|f| flags.contains(f))
        .collect()
}

fn field<'a>(cpuinfo: &'a str, key: &str) -> Option<&'a str> {
    cpuinfo.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Machine-wide and own CPU time at one instant, to tell how busy other processes kept
/// the CPUs while a benchmark ran (other engineers' builds, a noisy neighbour).
#[derive(Clone, Copy, Debug)]
pub struct CpuSnapshot {
    /// Busy seconds of all CPUs (user, nice, system, irq, softirq, steal) since boot.
    busy_s: f64,
    /// Busy plus idle seconds of all CPUs since boot.
    total_s: f64,
    /// CPU seconds of this process and its reaped children.
    own_s: f64,
}

impl CpuSnapshot {
    /// Now; `None` where `/proc/stat` or `getrusage` is unavailable.
    pub fn now() -> Option<CpuSnapshot> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() < 8 {
            return None;
        }
        let tick = clock_ticks()?;
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        let total = busy + v[3] + v[4];
        Some(CpuSnapshot {
            busy_s: busy / tick,
            total_s: total / tick,
            own_s: own_cpu_seconds()?,
        })
    }

    /// The share of all CPU time between `self` and `later` that went to other processes
    /// (or was stolen by the hypervisor), in `[0, 1]`. Children still running at `later`
    /// count as others.
    pub fn others_share(&self, later: &CpuSnapshot) -> Option<f64> {
        let total = later.total_s - self.total_s;
        if total <= 0.0 {
            return None;
        }
        let others = (later.busy_s - self.busy_s) - (later.own_s - self.own_s);
        Some((others / total).clamp(0.0, 1.0))
    }
}

#[cfg(unix)]
fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as f64)
}

#[cfg(not(unix))]
fn clock_ticks() -> Option<f64> {
    None
}

#[cfg(unix)]
fn own_cpu_seconds() -> Option<f64> {
    let mut total = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: rusage is a plain C struct of integers, for which all-zero is valid.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a live, writable rusage.
        if unsafe { libc::getrusage(who, &mut u) } != 0 {
            return None;
        }
        for t in [u.ru_utime, u.ru_stime] {
            total += t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        }
    }
    Some(total)
}

#[cfg(not(unix))]
fn own_cpu_seconds() -> Option<f64> {
    None
}

/// The 1-minute load average, where `/proc/loadavg` exists.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The machine facts as JSON.
pub fn facts() -> Value {
    json!({
        "cores": cores(),
        "cpu_model": cpu_model(),
        "simd": simd_flags(),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "date_utc": utc_now(),
        "load_average_1m_at_start": load_average(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
    }

    #[test]
    fn cpuinfo_fields() {
        let info = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n";
        assert_eq!(field(info, "model name"), Some("AMD EPYC"));
        assert_eq!(field(info, "flags"), Some("fpu avx2"));
    }
}
