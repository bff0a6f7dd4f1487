//! nccl-tests' conventions, kept pure so that they can be tested: what a row's size and
//! count mean for each collective, the bus-bandwidth factors, and the table's layout.
//!
//! As in nccl-tests (`src/*.cu`, `*GetCollByteCount` and `*GetBw`):
//! - `bytes` is the larger of a rank's send and receive buffers (the whole vector that is
//!   reduced, scattered, gathered or broadcast), `count` the per-rank element count the
//!   collective is called with (the receive count of reduce-scatter, the send count of
//!   all-gather, the buffer length otherwise);
//! - algbw = `bytes / time`, busbw = algbw x the collective's factor: all-reduce
//!   `2(n-1)/n`, reduce-scatter and all-gather `(n-1)/n`, broadcast `1`; GB are 1e9 bytes.

use serde_json::{json, Value};

use crate::json::{num, opt};

/// The collectives the benchmark times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
}

impl Op {
    /// In the order the benchmark runs and prints them.
    pub const ALL: [Op; 4] = [
        Op::AllReduce,
        Op::ReduceScatter,
        Op::AllGather,
        Op::Broadcast,
    ];

    /// The snake-case name, as in `mirra_collectives::Collective::as_str`.
    pub const fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
        }
    }

    /// nccl-tests' bus-bandwidth factor at `n` ranks (all-reduce's is the scaling model's,
    /// which costs it: one definition).
    pub fn bus_factor(self, n: usize) -> f64 {
        match self {
            Op::AllReduce => mirra_scaling::schedule::bus_factor(n),
            Op::ReduceScatter | Op::AllGather => {
                let n = n.max(1) as f64;
                (n - 1.0) / n
            }
            Op::Broadcast => 1.0,
        }
    }

    /// The redop column: `sum` for the reducing collectives, `none` for the others.
    pub const fn redop(self) -> &'static str {
        match self {
            Op::AllReduce | Op::ReduceScatter => "sum",
            Op::AllGather | Op::Broadcast => "none",
        }
    }

    /// The root column: `0` for broadcast, `-1` (none) for the others.
    pub const fn root(self) -> i32 {
        match self {
            Op::Broadcast => 0,
            _ => -1,
        }
    }

    /// Whether nccl-tests would call the benchmarked form in-place (all-reduce and
    /// broadcast take one buffer here; reduce-scatter and all-gather a send and a receive).
    pub const fn in_place(self) -> bool {
        matches!(self, Op::AllReduce | Op::Broadcast)
    }

    /// `(bytes, count)` of a row asked for `bytes` of `elem` bytes per element at `n`
    /// ranks: the per-rank count is rounded down so that the vector splits evenly, as
    /// nccl-tests does (`(count / nranks) * nranks`).
    pub fn shape(self, bytes: usize, elem: usize, n: usize) -> (usize, usize) {
        let total = bytes / elem;
        match self {
            Op::AllReduce | Op::Broadcast => (total * elem, total),
            Op::ReduceScatter | Op::AllGather => {
                let per_rank = total / n.max(1);
                (per_rank * n.max(1) * elem, per_rank)
            }
        }
    }
}

/// `(algbw, busbw)` in GB/s (1e9 bytes) of moving `bytes` in `seconds` at `n` ranks.
pub fn bandwidths(op: Op, bytes: usize, seconds: f64, n: usize) -> (f64, f64) {
    let alg = bytes as f64 / seconds / 1e9;
    (alg, alg * op.bus_factor(n))
}

/// One measured line of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub backend: String,
    pub world_size: usize,
    pub op: Op,
    /// mirra's dtype name (`f32`).
    pub dtype: &'static str,
    pub bytes: usize,
    pub count: usize,
    /// The median over timed iterations of the slowest rank's time, in seconds.
    pub seconds: f64,
    /// Elements that differed from the closed-form result, summed over ranks and over
    /// every iteration (each one is checked).
    pub wrong: u64,
    /// The copy rate measured beside it (GB/s per thread, one thread per rank, each with
    /// a rank's working set; see [`memcpy`](crate::memcpy)), for all-reduce rows.
    pub copy_gbs: Option<f64>,
}

/// What a ratio of algbw to the measured copy rate above 1.0 means: not a limit passed.
pub const ABOVE_COPY: &str = "above the measured copy rate";

impl Row {
    /// `(algbw, busbw)` in GB/s.
    pub fn bandwidths(&self) -> (f64, f64) {
        bandwidths(self.op, self.bytes, self.seconds, self.world_size)
    }

    /// algbw over the copy rate measured beside it: 1.0 means the all-reduce took as long
    /// as every rank copying its buffer once, at the same time.
    pub fn over_copy(&self) -> Option<f64> {
        self.copy_gbs
            .filter(|c| *c > 0.0)
            .map(|c| self.bandwidths().0 / c)
    }

    /// The row as it lands in `collectives.json`.
    pub fn json(&self) -> Value {
        let (alg, bus) = self.bandwidths();
        let over = self.over_copy();
        json!({
            "backend": self.backend,
            "world_size": self.world_size,
            "op": self.op.name(),
            "dtype": self.dtype,
            "bytes": self.bytes,
            "count": self.count,
            "time_us": num(self.seconds * 1e6, 2),
            "algbw_gbs": num(alg, 3),
            "busbw_gbs": num(bus, 3),
            "wrong": self.wrong,
            "copy_gbs": opt(self.copy_gbs, 3),
            "algbw_over_copy": opt(over, 3),
            "vs_copy": over.map(|r| if r > 1.0 { ABOVE_COPY } else { "below the measured copy rate" }),
        })
    }

    /// The line as nccl-tests prints it.
    pub fn line(&self) -> String {
        let (alg, bus) = self.bandwidths();
        let cell = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.2}"));
        format!(
            "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7.2}  {:>7.2}  {:>6}  {:>7}  {:>7}{}",
            self.bytes,
            self.count,
            type_name(self.dtype),
            self.op.redop(),
            self.op.root(),
            time_cell(self.seconds * 1e6),
            alg,
            bus,
            self.wrong,
            cell(self.copy_gbs),
            cell(self.over_copy()),
            if self.over_copy().is_some_and(|r| r > 1.0) {
                "  (above copy)"
            } else {
                ""
            }
        )
    }
}

/// nccl-tests' name of a dtype (`float` for f32), else mirra's.
pub fn type_name(dtype: &str) -> &str {
    match dtype {
        "f32" => "float",
        "f64" => "double",
        "f16" => "half",
        "bf16" => "bfloat16",
        "i32" => "int32",
        "i64" => "int64",
        "u8" => "uint8",
        other => other,
    }
}

/// A time in microseconds: two decimals, none from 1e6 us up (as nccl-tests' `%7.2f` and
/// `%7.0f`).
fn time_cell(us: f64) -> String {
    if us >= 1e6 {
        format!("{us:.0}")
    } else {
        format!("{us:.2}")
    }
}

/// The header above a table of `op` rows for one backend and world size.
pub fn header(op: Op, backend: &str, world_size: usize) -> String {
    let form = if op.in_place() {
        "in-place"
    } else {
        "out-of-place"
    };
    format!(
        "#\n# {} ({form}), backend {backend}, {world_size} ranks\n\
         #{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}  {:>7}  {:>7}\n\
         #{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}  {:>7}  {:>7}",
        op.name(),
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "copy",
        "algbw/",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(GB/s)",
        "copy",
    )
}

/// nccl-tests' closing line: the mean busbw of `rows`.
pub fn avg_busbw_line(rows: &[Row]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let mean = rows.iter().map(|r| r.bandwidths().1).sum::<f64>() / rows.len() as f64;
    Some(format!("# Avg bus bandwidth    : {mean:.3} GB/s"))
}

/// A byte count as `4KiB`, `64MiB`, ... (exact powers of 1024), else `N B`.
pub fn size_label(bytes: usize) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// Parses a byte count: a plain integer or one with a `K`, `M`, `G` (or `KiB`, `MiB`,
/// `GiB`) suffix, powers of 1024.
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: usize = digits.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => return None,
    };
    n.checked_mul(1usize << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn bus_bandwidth_factors_are_nccl_tests() {
        assert!(close(Op::AllReduce.bus_factor(2), 1.0));
        assert!(close(Op::AllReduce.bus_factor(4), 1.5));
        assert!(close(Op::AllReduce.bus_factor(8), 1.75));
        assert!(close(Op::ReduceScatter.bus_factor(2), 0.5));
        assert!(close(Op::AllGather.bus_factor(4), 0.75));
        assert!(close(Op::AllGather.bus_factor(8), 0.875));
        for n in [1, 2, 4, 8] {
            assert!(close(Op::Broadcast.bus_factor(n), 1.0));
        }
        assert!(close(Op::AllReduce.bus_factor(1), 0.0));
    }

    #[test]
    fn bandwidths_count_gigabytes_as_1e9() {
        let (alg, bus) = bandwidths(Op::AllReduce, 1_000_000_000, 0.5, 4);
        assert!(close(alg, 2.0));
        assert!(close(bus, 3.0));
        let (alg, bus) = bandwidths(Op::ReduceScatter, 64 << 20, 0.01, 8);
        assert!(close(alg, (64 << 20) as f64 / 0.01 / 1e9));
        assert!(close(bus, alg * 0.875));
    }

    #[test]
    fn shapes_follow_nccl_tests() {
        assert_eq!(Op::AllReduce.shape(4096, 4, 4), (4096, 1024));
        assert_eq!(Op::Broadcast.shape(4096, 4, 8), (4096, 1024));
        // Reduce-scatter and all-gather: the per-rank count, the whole vector's bytes.
        assert_eq!(Op::ReduceScatter.shape(4096, 4, 4), (4096, 256));
        assert_eq!(Op::AllGather.shape(4096, 4, 8), (4096, 128));
        // Rounded down to split evenly.
        assert_eq!(Op::AllGather.shape(4096, 4, 3), (4092, 341));
    }

    fn row() -> Row {
        Row {
            backend: "ring".into(),
            world_size: 4,
            op: Op::AllReduce,
            dtype: "f32",
            bytes: 4096,
            count: 1024,
            seconds: 12.5e-6,
            wrong: 0,
            copy_gbs: None,
        }
    }

    #[test]
    fn json_row_has_the_documented_shape() {
        let v = row().json();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "algbw_gbs",
                "algbw_over_copy",
                "backend",
                "busbw_gbs",
                "bytes",
                "copy_gbs",
                "count",
                "dtype",
                "op",
                "time_us",
                "vs_copy",
                "world_size",
                "wrong"
            ]
        );
        assert_eq!(v["backend"], "ring");
        assert_eq!(v["op"], "all_reduce");
        assert_eq!(v["dtype"], "f32");
        assert_eq!(v["world_size"], 4);
        assert_eq!(v["bytes"], 4096);
        assert_eq!(v["count"], 1024);
        assert_eq!(v["time_us"], 12.5);
        assert_eq!(v["algbw_gbs"], 0.328);
        assert_eq!(v["busbw_gbs"], 0.492);
        assert_eq!(v["wrong"], 0);
        assert_eq!(v["copy_gbs"], Value::Null);
        assert_eq!(v["vs_copy"], Value::Null);
        // 0.328 GB/s algbw beside a copy rate of 0.2 GB/s: above it, and said so.
        let fast = Row {
            copy_gbs: Some(0.2),
            ..row()
        };
        let v = fast.json();
        assert_eq!(v["algbw_over_copy"], 1.638);
        assert_eq!(v["vs_copy"], ABOVE_COPY);
        assert!(fast.line().ends_with("  (above copy)"), "{}", fast.line());
        let slow = Row {
            copy_gbs: Some(0.5),
            ..row()
        };
        assert_eq!(slow.json()["vs_copy"], "below the measured copy rate");
        assert!(slow.line().ends_with("0.50     0.66"), "{}", slow.line());
    }

    #[test]
    fn table_lines_align_with_the_header() {
        let r = row();
        let line = r.line();
        assert_eq!(
            line,
            "        4096          1024     float     sum      -1      12.50     0.33     0.49       0        -        -"
        );
        let head = header(Op::AllReduce, "ring", 4);
        let lines: Vec<&str> = head.lines().collect();
        assert_eq!(lines[1], "# all_reduce (in-place), backend ring, 4 ranks");
        // Column titles end where the values end.
        for (title, value) in [("size", "4096"), ("count", "1024"), ("#wrong", "0")] {
            let t_end = lines[2].find(title).unwrap() + title.len();
            let v_end = line.rfind(value).unwrap() + value.len();
            assert_eq!(t_end, v_end, "{title}");
        }
        assert_eq!(lines[2].len(), line.len());
        assert_eq!(lines[3].len(), line.len());
        let big = Row {
            seconds: 2.0,
            op: Op::Broadcast,
            ..row()
        };
        assert!(big.line().contains(" 2000000 "));
        assert!(big.line().contains("  none       0 "));
    }

    #[test]
    fn average_bus_bandwidth() {
        assert_eq!(avg_busbw_line(&[]), None);
        let mut slow = row();
        slow.seconds *= 2.0;
        let line = avg_busbw_line(&[row(), slow]).unwrap();
        assert_eq!(line, "# Avg bus bandwidth    : 0.369 GB/s");
    }

    #[test]
    fn sizes_print_and_parse() {
        assert_eq!(size_label(4096), "4KiB");
        assert_eq!(size_label(64 << 20), "64MiB");
        assert_eq!(size_label(1 << 30), "1GiB");
        assert_eq!(size_label(1000), "1000B");
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("256MiB"), Some(256 << 20));
        assert_eq!(parse_bytes("4k"), Some(4096));
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("12Q"), None);
        assert_eq!(parse_bytes(""), None);
    }
}
