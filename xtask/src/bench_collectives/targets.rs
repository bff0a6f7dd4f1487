//! The benchmark's targets, checked from the rows of one run: mirra's lead over OpenMPI
//! measured beside it (algbw at 64 MiB, time at 4 KiB, at 2 and 4 ranks), `tree` against
//! `ring` below 64 KiB, and the 4 KiB all-reduce at 4 ranks; and the lines printed after
//! the tables, read back from the report's JSON so that a saved report prints the same.
//!
//! The copy rate printed beside each all-reduce is a yardstick, not a target: a ratio
//! above 1.0 is reported as above the measured copy rate, never as a target met.

use serde_json::{json, Map, Value};

use super::peers::{Peer, PeerRun};
use crate::json::{num, opt};
use crate::nccl::{size_label, Op, Row};
use crate::table::mark;

/// The size of the bandwidth target.
pub const TARGET_BYTES: usize = 64 << 20;
/// The size of the latency targets.
pub const SMALL_BYTES: usize = 4 << 10;
/// The world sizes of the targets against OpenMPI.
pub const TARGET_RANKS: [usize; 2] = [2, 4];
/// mirra's best algbw at [`TARGET_BYTES`] over OpenMPI's, at least.
pub const MIN_ALGBW_VS_OPENMPI: f64 = 4.0;
/// mirra's best time at [`SMALL_BYTES`] over OpenMPI's, at most.
pub const MAX_TIME_VS_OPENMPI: f64 = 0.4;
/// `tree` beats `ring` below this many bytes.
pub const TREE_BELOW_BYTES: usize = 64 << 10;
/// ... at this many ranks and more: the tree's `2 ceil(log2 n)` dependent steps are fewer
/// than the ring's `2 (n - 1)` only from 4 ranks on (2 ranks: 2 and 2; 3: 4 and 4), so
/// below it which one wins is noise (tree/ring 0.96 to 1.06 at 2 ranks on the Intel Xeon).
pub const TREE_MIN_RANKS: usize = 4;
/// A 4 KiB all-reduce at 4 ranks in less than this many microseconds.
pub const TARGET_SMALL_US: f64 = 50.0;
pub const TARGET_SMALL_RANKS: usize = 4;

/// The row of `backend`'s all-reduce at `n` ranks of `bytes`.
fn find<'a>(rows: &'a [Row], backend: &str, n: usize, bytes: usize) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.backend == backend && r.world_size == n && r.op == Op::AllReduce && r.bytes == bytes
    })
}

/// mirra's fastest correct all-reduce at `n` ranks of `bytes` (the best algbw too).
pub fn best(rows: &[Row], n: usize, bytes: usize) -> Option<&Row> {
    rows.iter()
        .filter(|r| r.op == Op::AllReduce && r.world_size == n && r.bytes == bytes)
        .filter(|r| r.wrong == 0)
        .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
}

/// mirra's best row and the peer's at `n` ranks of `bytes`, or why one is missing.
fn pair<'a>(
    rows: &'a [Row],
    peers: &'a [PeerRun],
    peer: Peer,
    n: usize,
    bytes: usize,
) -> Result<(&'a Row, &'a Row), String> {
    let ours = best(rows, n, bytes).ok_or_else(|| {
        format!(
            "mirra has no correct all_reduce at {n} ranks of {} in this run",
            size_label(bytes)
        )
    })?;
    let run = peers
        .iter()
        .find(|p| p.peer == peer)
        .ok_or_else(|| format!("{} was not measured (--peers)", peer.name()))?;
    if let Some(why) = run.missing(n, bytes) {
        return Err(why);
    }
    let theirs = run.row(n, bytes).ok_or("no peer row")?;
    Ok((ours, theirs))
}

/// The two targets against OpenMPI at `n` ranks.
fn vs_openmpi(rows: &[Row], peers: &[PeerRun], n: usize) -> [(String, Value); 2] {
    let bw = pair(rows, peers, Peer::OpenMpi, n, TARGET_BYTES);
    let ratio = bw.as_ref().ok().map(|(o, t)| t.seconds / o.seconds);
    let bandwidth = json!({
        "min_ratio": MIN_ALGBW_VS_OPENMPI,
        "measured": opt(ratio, 3),
        "mirra_backend": bw.as_ref().ok().map(|(o, _)| o.backend.clone()),
        "mirra_algbw_gbs": opt(bw.as_ref().ok().map(|(o, _)| o.bandwidths().0), 3),
        "openmpi_algbw_gbs": opt(bw.as_ref().ok().map(|(_, t)| t.bandwidths().0), 3),
        "met": ratio.map(|r| r >= MIN_ALGBW_VS_OPENMPI),
        "missing": bw.as_ref().err(),
    });
    let lat = pair(rows, peers, Peer::OpenMpi, n, SMALL_BYTES);
    let ratio = lat.as_ref().ok().map(|(o, t)| o.seconds / t.seconds);
    let latency = json!({
        "max_ratio": MAX_TIME_VS_OPENMPI,
        "measured": opt(ratio, 3),
        "mirra_backend": lat.as_ref().ok().map(|(o, _)| o.backend.clone()),
        "mirra_us": opt(lat.as_ref().ok().map(|(o, _)| o.seconds * 1e6), 2),
        "openmpi_us": opt(lat.as_ref().ok().map(|(_, t)| t.seconds * 1e6), 2),
        "met": ratio.map(|r| r <= MAX_TIME_VS_OPENMPI),
        "missing": lat.as_ref().err(),
    });
    [(bandwidth_key(n), bandwidth), (latency_key(n), latency)]
}

fn bandwidth_key(n: usize) -> String {
    format!("all_reduce_64MiB_algbw_vs_openmpi_{n}_ranks")
}

fn latency_key(n: usize) -> String {
    format!("all_reduce_4KiB_time_vs_openmpi_{n}_ranks")
}

/// Every target, from mirra's rows and the peers measured in the same run.
pub fn targets(rows: &[Row], peers: &[PeerRun]) -> Value {
    let mut t = Map::new();
    for n in TARGET_RANKS {
        t.extend(vs_openmpi(rows, peers, n));
    }

    let mut cases = Vec::new();
    let mut beaten = 0;
    for tree in rows.iter().filter(|r| {
        r.backend == "tree"
            && r.op == Op::AllReduce
            && r.bytes < TREE_BELOW_BYTES
            && r.world_size >= TREE_MIN_RANKS
    }) {
        if let Some(ring) = find(rows, "ring", tree.world_size, tree.bytes) {
            let wins = tree.seconds < ring.seconds;
            beaten += usize::from(wins);
            cases.push(json!({
                "world_size": tree.world_size,
                "bytes": tree.bytes,
                "tree_us": num(tree.seconds * 1e6, 2),
                "ring_us": num(ring.seconds * 1e6, 2),
                "tree_over_ring": num(tree.seconds / ring.seconds, 3),
                "met": wins,
            }));
        }
    }
    let of = cases.len();
    t.insert(
        "tree_beats_ring_below_64KiB".into(),
        json!({
            "sizes_met": beaten,
            "sizes": of,
            "cases": cases,
            "met": (of > 0).then_some(beaten == of),
        }),
    );

    let small: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.op == Op::AllReduce && r.world_size == TARGET_SMALL_RANKS && r.bytes == SMALL_BYTES
        })
        .collect();
    let fastest = best(rows, TARGET_SMALL_RANKS, SMALL_BYTES);
    let by_backend: Map<String, Value> = small
        .iter()
        .map(|r| (r.backend.clone(), num(r.seconds * 1e6, 2)))
        .collect();
    t.insert(
        "all_reduce_4KiB_4_ranks_us".into(),
        json!({
            "max_exclusive": TARGET_SMALL_US,
            "measured": opt(fastest.map(|r| r.seconds * 1e6), 2),
            "best_backend": fastest.map(|r| r.backend.clone()),
            "by_backend": by_backend,
            "met": fastest.map(|r| r.seconds * 1e6 < TARGET_SMALL_US),
        }),
    );
    Value::Object(t)
}

/// mirra's best all-reduce beside each peer's, per world size and size of the sweep.
pub fn beside_peers(
    rows: &[Row],
    peers: &[PeerRun],
    world_sizes: &[usize],
    sizes: &[usize],
) -> Vec<Value> {
    let cell = |r: &Row| {
        json!({
            "backend": r.backend,
            "time_us": num(r.seconds * 1e6, 2),
            "algbw_gbs": num(r.bandwidths().0, 3),
        })
    };
    let mut out = Vec::new();
    for &n in world_sizes {
        for &bytes in sizes {
            let ours = best(rows, n, bytes);
            let mut line = json!({
                "world_size": n,
                "bytes": bytes,
                "mirra": ours.map(cell),
            });
            for run in peers {
                let v = match run.missing(n, bytes) {
                    Some(why) => json!({ "missing": why }),
                    None => {
                        let theirs = run.row(n, bytes).map(cell).unwrap_or(Value::Null);
                        let ratio = ours
                            .zip(run.row(n, bytes))
                            .map(|(o, t)| t.seconds / o.seconds);
                        let mut v = theirs;
                        v["mirra_speedup"] = opt(ratio, 3);
                        v
                    }
                };
                line[run.peer.name()] = v;
            }
            out.push(line);
        }
    }
    out
}

fn cell(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// The copy curve as a table: sizes down, world sizes across.
fn copy_curve_lines(report: &Value) -> Vec<String> {
    let points = report["copy_curve"].as_array().cloned().unwrap_or_default();
    let mut threads: Vec<u64> = points
        .iter()
        .filter_map(|p| p["threads"].as_u64())
        .collect();
    threads.sort_unstable();
    threads.dedup();
    let mut sizes: Vec<u64> = points.iter().filter_map(|p| p["bytes"].as_u64()).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut l = vec![
        "#".to_string(),
        "# copy curve: GB/s per thread, n threads at once, each copying half of its own \
         buffer of the message's size"
            .to_string(),
        "#   into the other half (a rank's working set, re-used), best of memcpy and a vector \
         loop; a yardstick, not a limit"
            .to_string(),
    ];
    let mut head = format!("#   {:>8}", "size");
    for t in &threads {
        head.push_str(&format!(" {:>11}", format!("{t} threads")));
    }
    l.push(head);
    for b in &sizes {
        let mut line = format!("#   {:>8}", size_label(*b as usize));
        for t in &threads {
            let p = points
                .iter()
                .find(|p| p["threads"].as_u64() == Some(*t) && p["bytes"].as_u64() == Some(*b));
            line.push_str(&format!(
                " {:>11}",
                p.map_or_else(|| "-".into(), |p| cell(&p["best_gbs"], 2))
            ));
        }
        l.push(line);
    }
    l
}

/// The lines after the tables: the copy curve, mirra beside its peers, the targets.
pub fn summary(report: &Value) -> Vec<String> {
    let mut l = copy_curve_lines(report);
    l.push("#".into());
    l.push(
        "# all_reduce f32 sum: mirra's best backend beside its peers, time (us) and algbw (GB/s)"
            .into(),
    );
    let peers: Vec<&Value> = report["peers"].as_array().into_iter().flatten().collect();
    for p in &peers {
        l.push(format!(
            "#   {}: {}",
            p["peer"].as_str().unwrap_or("?"),
            match p["version"].as_str() {
                Some(v) => format!("{v}; {}", p["what"].as_str().unwrap_or("")),
                None => format!("MISSING: {}", p["missing"].as_str().unwrap_or("?")),
            }
        ));
    }
    let mut head = format!("#   {:>5} {:>8}  {:>28}", "ranks", "size", "mirra");
    for p in &peers {
        head.push_str(&format!("  {:>28}", p["peer"].as_str().unwrap_or("?")));
    }
    l.push(head);
    let available = |name: &str| {
        peers
            .iter()
            .any(|p| p["peer"] == name && p["available"] == true)
    };
    let mut reasons: Vec<String> = Vec::new();
    for line in report["beside_peers"].as_array().into_iter().flatten() {
        let m = &line["mirra"];
        let mut text = format!(
            "#   {:>5} {:>8}  {:>28}",
            line["world_size"].as_u64().unwrap_or(0),
            size_label(line["bytes"].as_u64().unwrap_or(0) as usize),
            if m.is_null() {
                "-".to_string()
            } else {
                format!(
                    "{} us {} GB/s ({})",
                    cell(&m["time_us"], 2),
                    cell(&m["algbw_gbs"], 2),
                    m["backend"].as_str().unwrap_or("?")
                )
            }
        );
        for p in &peers {
            let name = p["peer"].as_str().unwrap_or("?");
            let v = &line[name];
            let shown = match v["missing"].as_str() {
                Some(why) => {
                    // A peer missing altogether is said once, above; other reasons below.
                    if available(name) && !reasons.iter().any(|r| r == why) {
                        reasons.push(why.to_string());
                    }
                    "missing".to_string()
                }
                None => format!(
                    "{} us {} GB/s x{}",
                    cell(&v["time_us"], 2),
                    cell(&v["algbw_gbs"], 2),
                    cell(&v["mirra_speedup"], 1)
                ),
            };
            text.push_str(&format!("  {shown:>28}"));
        }
        l.push(text);
    }
    for why in reasons {
        l.push(format!("#   missing: {why}"));
    }
    l.push("#   (xN: the peer's time over mirra's: how many times faster mirra is)".into());

    let t = &report["targets"];
    l.push("#".into());
    l.push("# targets".into());
    for n in TARGET_RANKS {
        let x = &t[bandwidth_key(n)];
        l.push(format!(
            "#   64 MiB all-reduce at {n} ranks, algbw >= {MIN_ALGBW_VS_OPENMPI:.1}x OpenMPI's: \
             {}x ({} {} GB/s, openmpi {} GB/s)  {}{}",
            cell(&x["measured"], 2),
            x["mirra_backend"].as_str().unwrap_or("-"),
            cell(&x["mirra_algbw_gbs"], 2),
            cell(&x["openmpi_algbw_gbs"], 2),
            mark(&x["met"]),
            x["missing"]
                .as_str()
                .map_or_else(String::new, |w| format!(" ({w})")),
        ));
        let x = &t[latency_key(n)];
        l.push(format!(
            "#   4 KiB all-reduce at {n} ranks, time <= {MAX_TIME_VS_OPENMPI:.1}x OpenMPI's: \
             {}x ({} {} us, openmpi {} us)  {}{}",
            cell(&x["measured"], 2),
            x["mirra_backend"].as_str().unwrap_or("-"),
            cell(&x["mirra_us"], 2),
            cell(&x["openmpi_us"], 2),
            mark(&x["met"]),
            x["missing"]
                .as_str()
                .map_or_else(String::new, |w| format!(" ({w})")),
        ));
        if let Some(us) = report["exchange"]["us"].as_f64().filter(|_| n == 2) {
            l.push(format!(
                "#     yardstick: 4 KiB exchanged between 2 threads in {us:.2} us an iteration \
                 (the data a 2-rank all-reduce moves, alone); {MAX_TIME_VS_OPENMPI:.1}x \
                 OpenMPI's is {} us",
                x["openmpi_us"].as_f64().map_or_else(
                    || "-".to_string(),
                    |o| format!("{:.2}", o * MAX_TIME_VS_OPENMPI)
                ),
            ));
        }
    }
    let x = &t["tree_beats_ring_below_64KiB"];
    l.push(format!(
        "#   tree faster than ring below 64 KiB at 4+ ranks: {} of {} sizes  {}",
        x["sizes_met"],
        x["sizes"],
        mark(&x["met"]),
    ));
    for c in x["cases"].as_array().into_iter().flatten() {
        l.push(format!(
            "#     {} ranks {:>6}: tree {:>9} us, ring {:>9} us, tree/ring {}",
            c["world_size"],
            size_label(c["bytes"].as_u64().unwrap_or(0) as usize),
            cell(&c["tree_us"], 2),
            cell(&c["ring_us"], 2),
            cell(&c["tree_over_ring"], 3),
        ));
    }
    let x = &t["all_reduce_4KiB_4_ranks_us"];
    let others: Vec<String> = x["by_backend"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(b, us)| format!("{b} {}", cell(us, 2)))
                .collect()
        })
        .unwrap_or_default();
    l.push(format!(
        "#   4 KiB all-reduce at 4 ranks < {TARGET_SMALL_US:.0} us: {} us ({})  {}{}",
        cell(&x["measured"], 2),
        x["best_backend"].as_str().unwrap_or("not measured"),
        mark(&x["met"]),
        if others.is_empty() {
            String::new()
        } else {
            format!("  [{}]", others.join(", "))
        }
    ));
    let above = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["vs_copy"] == crate::nccl::ABOVE_COPY)
        .count();
    if above > 0 {
        l.push(format!(
            "#   {above} all-reduce row(s) ran above the measured copy rate (caches at work): \
             reported, not a target"
        ));
    }
    if let Some(share) = report["others_cpu_share"].as_f64() {
        l.push(format!(
            "#   other processes used {:.0}% of the CPUs meanwhile",
            share * 100.0
        ));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backend: &str, n: usize, bytes: usize, us: f64) -> Row {
        Row {
            backend: backend.into(),
            world_size: n,
            op: Op::AllReduce,
            dtype: "f32",
            bytes,
            count: bytes / 4,
            seconds: us * 1e-6,
            wrong: 0,
            copy_gbs: Some(10.0),
        }
    }

    fn openmpi(rows: Vec<Row>) -> PeerRun {
        PeerRun {
            peer: Peer::OpenMpi,
            found: Ok("Open MPI 4.1.4".into()),
            command: "mpirun".into(),
            rows,
            failures: vec![],
        }
    }

    #[test]
    fn targets_against_openmpi() {
        let big = TARGET_BYTES;
        let rows = vec![
            // 2 ranks: direct 5 ms, ring 20 ms at 64 MiB; 1 us at 4 KiB.
            row("direct", 2, big, 5_000.0),
            row("ring", 2, big, 20_000.0),
            row("direct", 2, SMALL_BYTES, 1.0),
            // 4 ranks: 4 KiB only, and a wrong fast row that must not count.
            row("direct", 4, SMALL_BYTES, 10.0),
            Row {
                wrong: 5,
                ..row("tree", 4, SMALL_BYTES, 0.1)
            },
        ];
        let mpi = openmpi(vec![
            row("openmpi", 2, big, 25_000.0),
            row("openmpi", 2, SMALL_BYTES, 3.0),
            row("openmpi", 4, SMALL_BYTES, 20.0),
        ]);
        let t = targets(&rows, std::slice::from_ref(&mpi));
        let bw2 = &t["all_reduce_64MiB_algbw_vs_openmpi_2_ranks"];
        assert_eq!(bw2["measured"], 5.0);
        assert_eq!(bw2["mirra_backend"], "direct");
        assert_eq!(bw2["met"], true);
        let lat2 = &t["all_reduce_4KiB_time_vs_openmpi_2_ranks"];
        assert_eq!(lat2["measured"], 0.333);
        assert_eq!(lat2["met"], true);
        // 4 ranks: 10 us against 20 us is 0.5 > 0.4, missed (the wrong tree row ignored).
        let lat4 = &t["all_reduce_4KiB_time_vs_openmpi_4_ranks"];
        assert_eq!(
            (lat4["measured"].as_f64(), lat4["met"].as_bool()),
            (Some(0.5), Some(false))
        );
        assert_eq!(lat4["mirra_backend"], "direct");
        // No 64 MiB row at 4 ranks: not met, not missed, and says why.
        let bw4 = &t["all_reduce_64MiB_algbw_vs_openmpi_4_ranks"];
        assert_eq!(bw4["met"], Value::Null);
        assert!(bw4["missing"]
            .as_str()
            .unwrap()
            .contains("mirra has no correct all_reduce"));

        // At 3.9x OpenMPI's algbw the 4x target is missed.
        let slower = vec![row("direct", 2, big, 25_000.0 / 3.9)];
        let t = targets(&slower, std::slice::from_ref(&mpi));
        assert_eq!(t["all_reduce_64MiB_algbw_vs_openmpi_2_ranks"]["met"], false);

        // Without OpenMPI every target against it is n/a, and the reason is the peer's.
        let gone = PeerRun {
            found: Err("mpirun does not run".into()),
            ..openmpi(vec![])
        };
        let t = targets(&rows, &[gone]);
        let x = &t["all_reduce_4KiB_time_vs_openmpi_2_ranks"];
        assert_eq!(x["met"], Value::Null);
        assert_eq!(x["missing"], "openmpi missing: mpirun does not run");
        let t = targets(&rows, &[]);
        assert!(t["all_reduce_4KiB_time_vs_openmpi_2_ranks"]["missing"]
            .as_str()
            .unwrap()
            .contains("not measured"));
    }

    #[test]
    fn tree_and_small_message_targets() {
        let rows = vec![
            row("ring", 4, 4096, 40.0),
            row("tree", 4, 4096, 30.0),
            row("ring", 4, 8192, 40.0),
            row("tree", 4, 8192, 45.0),
            // 2 ranks: the same two steps either way, not counted.
            row("ring", 2, 4096, 5.0),
            row("tree", 2, 4096, 6.0),
            // 64 KiB and above: not counted.
            row("tree", 4, 65536, 90.0),
            row("ring", 4, 65536, 80.0),
        ];
        let t = targets(&rows, &[]);
        let tree = &t["tree_beats_ring_below_64KiB"];
        assert_eq!(
            (tree["sizes_met"].as_u64(), tree["sizes"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(tree["met"], false);
        // The 4-rank 8 KiB loss is what fails it: without it the target is met.
        let t = targets(&rows[..2], &[]);
        assert_eq!(t["tree_beats_ring_below_64KiB"]["met"], true);
        let small = &t["all_reduce_4KiB_4_ranks_us"];
        assert_eq!(small["best_backend"], "tree");
        assert_eq!(small["measured"], 30.0);
        assert_eq!(small["met"], true);
        assert_eq!(small["by_backend"]["ring"], 40.0);
        let none = targets(&[], &[]);
        assert_eq!(none["tree_beats_ring_below_64KiB"]["met"], Value::Null);
        assert_eq!(none["all_reduce_4KiB_4_ranks_us"]["met"], Value::Null);
    }

    #[test]
    fn the_summary_prints_peers_targets_and_the_copy_curve() {
        let rows = vec![
            row("direct", 2, SMALL_BYTES, 1.0),
            Row {
                copy_gbs: Some(1.0),
                ..row("direct", 2, TARGET_BYTES, 5_000.0)
            },
        ];
        let mpi = openmpi(vec![row("openmpi", 2, SMALL_BYTES, 3.0)]);
        let gloo = PeerRun {
            peer: Peer::Gloo,
            found: Err("torch does not import: ModuleNotFoundError".into()),
            command: String::new(),
            rows: vec![],
            failures: vec![],
        };
        let peers = vec![mpi, gloo];
        let report = json!({
            "copy_curve": [
                {"threads": 2, "bytes": 4096, "best_gbs": 20.0},
                {"threads": 2, "bytes": TARGET_BYTES, "best_gbs": 1.0},
            ],
            "peers": peers.iter().map(PeerRun::json).collect::<Vec<_>>(),
            "beside_peers": beside_peers(&rows, &peers, &[2], &[SMALL_BYTES, TARGET_BYTES]),
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            "targets": targets(&rows, &peers),
            "exchange": {"bytes": SMALL_BYTES, "threads": 2, "us": 0.5},
        });
        let text = summary(&report).join("\n");
        assert!(
            text.contains("yardstick: 4 KiB exchanged between 2 threads in 0.50 us an iteration"),
            "{text}"
        );
        assert!(text.contains("0.4x OpenMPI's is 1.20 us"), "{text}");
        assert!(text.contains("#       4KiB       20.00"), "{text}");
        assert!(
            text.contains("gloo: MISSING: torch does not import"),
            "{text}"
        );
        assert!(text.contains("1.00 us 4.10 GB/s (direct)"), "{text}");
        assert!(text.contains("3.00 us 1.36 GB/s x3.0"), "{text}");
        assert!(text.contains("#       2     4KiB"), "{text}");
        assert!(
            text.contains("#   missing: openmpi has no all_reduce at 2 ranks of 64MiB"),
            "{text}"
        );
        assert!(
            text.contains("4 KiB all-reduce at 2 ranks, time <= 0.4x OpenMPI's: 0.33x"),
            "{text}"
        );
        assert!(text.contains("algbw >= 4.0x OpenMPI's: -x"), "{text}");
        assert!(
            text.contains("openmpi has no all_reduce at 2 ranks of 64MiB"),
            "{text}"
        );
        // 13.4 GB/s beside a copy rate of 1 GB/s: above it, said so, and no target.
        assert!(
            text.contains("1 all-reduce row(s) ran above the measured copy rate"),
            "{text}"
        );
    }
}
