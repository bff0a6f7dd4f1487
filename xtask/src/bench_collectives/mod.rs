//! `cargo xtask bench-collectives`: nccl-tests' table for mirra's CPU collectives, with the
//! machine's copy curve and mirra's peers measured in the same run.
//!
//! For each backend and world size, one group of rank threads times all-reduce over the
//! full size sweep (4 KiB to 256 MiB of f32, doubling) and reduce-scatter, all-gather and
//! broadcast over a coarse one (4 KiB, 1 MiB, 64 MiB); see [`ranks`](crate::ranks) for
//! how an iteration is timed and checked (every iteration), and [`nccl`](crate::nccl) for
//! the columns.
//!
//! Beside each all-reduce size the table prints the copy curve measured in the same run
//! the way the collective runs ([`memcpy`](crate::memcpy): one thread per rank, each with
//! a rank's working set), and algbw over it. The copy rate is a yardstick, not a limit: on
//! this kind of machine it moves with the working set, and a ratio above 1.0 is reported
//! as "above the measured copy rate", never as a target met.
//!
//! The targets are against peers measured in the same run ([`peers`]): OpenMPI's own
//! `MPI_Allreduce` between processes (when `mpirun` and `mpicc` are installed;
//! `ci/install-mpi.sh`) and gloo through `torch.distributed` (when `torch` imports).
//! Where a peer is missing its rows say so and the targets against it are not met, not
//! missed ([`targets`]).
//!
//! Everything lands in `target/bench/collectives.json` (written atomically). A group that
//! fails (a collective returns an error) is reported and skipped; the command then ends
//! with exit status 1, as it does when any of mirra's results is wrong.

mod gpu;
mod peers;
mod targets;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use mirra_collectives::{Config, BACKENDS, DEVICE_BACKENDS, MAX_WORLD_SIZE};
use serde_json::{json, Value};

use self::peers::{Peer, PeerRun, SizePlan};
use crate::exchange;
use crate::json::{num, opt, save};
use crate::machine::{self, CpuSnapshot};
use crate::memcpy::{self, CopyPlan, CopyPoint, Kernel};
use crate::nccl::{self, size_label, Op, Row};
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::ranks::{Group, Job};
use crate::timing::median;
use crate::{cli, Failure};

/// The smallest message.
pub const MIN_BYTES: usize = 4 << 10;
/// The largest message of the default sweep.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;
/// The sweep of reduce-scatter, all-gather and broadcast.
pub const COARSE_BYTES: [usize; 3] = [4 << 10, 1 << 20, 64 << 20];
/// The default world sizes.
pub const WORLD_SIZES: [usize; 3] = [2, 4, 8];
/// The most timed iterations of a peer at one size.
pub const PEER_MAX_ITERS: usize = 50;

/// `cargo xtask bench-collectives` flags.
#[derive(Debug, Parser)]
#[command(
    name = "xtask bench-collectives",
    about = "nccl-tests tables of mirra's CPU collectives, the copy curve and OpenMPI and gloo \
             beside them -> target/bench/collectives.json"
)]
struct Args {
    /// A smoke subset: 2 and 4 ranks, up to 1 MiB, few iterations.
    #[arg(long)]
    quick: bool,
    /// Backends to run, comma-separated (default: all of the in-process ones); `mpi` adds
    /// mirra's MPI backend, a rank per process under mpirun, beside OpenMPI (needs OpenMPI
    /// and libclang: ci/install-mpi.sh).
    #[arg(long, value_delimiter = ',', value_parser = backend_name)]
    backends: Option<Vec<String>>,
    /// World sizes, comma-separated (default: 2,4,8; --quick: 2,4).
    #[arg(long, value_delimiter = ',', value_parser = world_size)]
    world_sizes: Option<Vec<usize>>,
    /// Largest message, e.g. 64M (default: 256M; --quick: 1M).
    #[arg(long, value_parser = max_bytes)]
    max_bytes: Option<usize>,
    /// Peers measured beside mirra: openmpi, gloo, or none (default: openmpi,gloo).
    #[arg(long, value_parser = peer_list)]
    peers: Option<PeerList>,
    /// Where to write the JSON (default: target/bench/collectives.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Rounds of mirra's sweep then the peers' (default 1): each row's time is the median
    /// over the rounds, so that a ratio to a peer is not one stretch's luck (4 ranks on 2
    /// cores: OpenMPI's time moved by 30% between two runs minutes apart).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=9))]
    rounds: u64,
    /// `cuda`: the GPU backends' table instead (cuda-ring with every rank on cuda:0, NCCL one
    /// rank per GPU), beside the device copy -> target/bench/collectives-gpu.json.
    #[arg(long, value_parser = device_kind)]
    device: Option<DeviceKind>,
}

/// Which table `--device` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceKind {
    Cpu,
    Cuda,
}

fn device_kind(s: &str) -> Result<DeviceKind, String> {
    match s.trim() {
        "cpu" => Ok(DeviceKind::Cpu),
        "cuda" | "cuda:0" => Ok(DeviceKind::Cuda),
        other => Err(format!("`cpu` or `cuda`, got `{other}`")),
    }
}

/// The peers of `--peers`.
#[derive(Clone, Debug)]
struct PeerList(Vec<Peer>);

fn peer_list(s: &str) -> Result<PeerList, String> {
    peers::parse_peers(s).map(PeerList)
}

/// The backend that runs a rank per process (`--backends mpi`).
const MPI_BACKEND: &str = "mpi";

fn backend_name(s: &str) -> Result<String, String> {
    let s = s.trim();
    if BACKENDS.contains(&s) || DEVICE_BACKENDS.contains(&s) || s == MPI_BACKEND {
        Ok(s.to_string())
    } else {
        Err(format!(
            "unknown backend `{s}` (known: {}, {}, {MPI_BACKEND})",
            BACKENDS.join(", "),
            DEVICE_BACKENDS.join(", ")
        ))
    }
}

fn world_size(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_WORLD_SIZE).contains(n))
        .ok_or_else(|| format!("a world size is 1 to {MAX_WORLD_SIZE}, got `{s}`"))
}

fn max_bytes(s: &str) -> Result<usize, String> {
    nccl::parse_bytes(s)
        .filter(|&n| n >= MIN_BYTES)
        .ok_or_else(|| {
            format!("a size of at least {MIN_BYTES} bytes (as 4096, 64K, 256M), got `{s}`")
        })
}

/// The flags, with the defaults filled in.
#[derive(Debug)]
struct Options {
    quick: bool,
    backends: Vec<String>,
    world_sizes: Vec<usize>,
    max_bytes: usize,
    peers: Vec<Peer>,
    out: Option<PathBuf>,
    rounds: usize,
    device: DeviceKind,
}

/// The options of `args`; `Ok(None)` after `--help`.
fn parse(args: &[String]) -> Result<Option<Options>, Failure> {
    let Some(a) = cli::parse::<Args>("xtask bench-collectives", args)? else {
        return Ok(None);
    };
    let mut world_sizes = Vec::new();
    for n in a.world_sizes.unwrap_or_else(|| {
        if a.quick {
            vec![2, 4]
        } else {
            WORLD_SIZES.to_vec()
        }
    }) {
        if !world_sizes.contains(&n) {
            world_sizes.push(n);
        }
    }
    let device = a.device.unwrap_or(DeviceKind::Cpu);
    let mut backends = Vec::new();
    for b in a.backends.unwrap_or_else(|| match device {
        DeviceKind::Cpu => BACKENDS.iter().map(|s| s.to_string()).collect(),
        DeviceKind::Cuda => gpu::default_backends(std::env::var("NCCL_ALGO").ok().as_deref()),
    }) {
        if !backends.contains(&b) {
            backends.push(b);
        }
    }
    // mpi runs its ranks as processes, as the peers do, first among them.
    let mut peers = a.peers.map_or_else(|| Peer::ALL.to_vec(), |p| p.0);
    if let Some(i) = backends.iter().position(|b| b == MPI_BACKEND) {
        backends.remove(i);
        peers.insert(0, Peer::MirraMpi);
    }
    Ok(Some(Options {
        quick: a.quick,
        backends,
        world_sizes,
        max_bytes: a
            .max_bytes
            .unwrap_or(if a.quick { 1 << 20 } else { DEFAULT_MAX_BYTES }),
        peers,
        out: a.out,
        rounds: a.rounds as usize,
        device,
    }))
}

/// The message sizes of `op`: all-reduce doubles from 4 KiB (quadruples with `quick`) up
/// to `max`; the others take [`COARSE_BYTES`] (with `quick`, those up to 1 MiB) up to `max`.
fn sizes(op: Op, max: usize, quick: bool) -> Vec<usize> {
    if op == Op::AllReduce {
        let step = if quick { 4 } else { 2 };
        std::iter::successors(Some(MIN_BYTES), |&b| b.checked_mul(step))
            .take_while(|&b| b <= max)
            .collect()
    } else {
        let cap = if quick { max.min(1 << 20) } else { max };
        COARSE_BYTES.into_iter().filter(|&b| b <= cap).collect()
    }
}

/// Warm-up and timed iterations of a `bytes` message: about 512 MiB of messages and
/// 0.75 s of timed iterations (predicted from the previous size, when there is one),
/// between 3 and 200 timed iterations.
fn iterations(bytes: usize, predicted_s: Option<f64>, quick: bool) -> (usize, usize) {
    let (budget_bytes, budget_s, min, max) = if quick {
        (64usize << 20, 0.1, 3, 20)
    } else {
        (512usize << 20, 0.75, 3, 200)
    };
    let mut iters = budget_bytes / bytes.max(1);
    if let Some(t) = predicted_s.filter(|t| *t > 0.0) {
        iters = iters.min((budget_s / t) as usize);
    }
    let iters = iters.clamp(min, max);
    let warmup = if quick { 1 } else { (iters / 10).clamp(1, 10) };
    (warmup, iters)
}

/// How much of the copy curve to measure at each point.
fn copy_plan(quick: bool) -> CopyPlan {
    CopyPlan {
        repeats: if quick { 3 } else { 5 },
        bytes_per_repeat: if quick { 8 << 20 } else { 64 << 20 },
    }
}

/// A copy-curve point as it lands in `collectives.json`.
fn copy_json(p: &CopyPoint) -> Value {
    let (best, kernel) = p.best();
    let mut v = json!({
        "threads": p.threads,
        "bytes": p.bytes,
        "best_gbs": num(best, 3),
        "best_kernel": kernel.name(),
    });
    for (k, rates) in Kernel::ALL.iter().zip(&p.gbs) {
        v[format!("{}_gbs", k.name())] =
            json!(rates.iter().map(|x| num(*x, 3)).collect::<Vec<_>>());
        v[format!("{}_gbs_median", k.name())] = num(median(rates), 3);
    }
    v
}

/// Runs the benchmark, prints the tables and writes the report.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    let started = Instant::now();
    if o.device == DeviceKind::Cuda {
        return gpu::run(&o, args, started);
    }
    if let Some(b) = o
        .backends
        .iter()
        .find(|b| DEVICE_BACKENDS.contains(&b.as_str()))
    {
        return Err(Failure::usage(format!(
            "xtask bench-collectives: `{b}` is a GPU backend: add --device cuda"
        )));
    }
    let out_path = bench_file(o.out.as_deref(), "collectives.json");
    let facts = machine::facts();
    let config = Config::default();
    let ar_sizes = sizes(Op::AllReduce, o.max_bytes, o.quick);
    println!(
        "# mirra collectives benchmark: backends {}, world sizes {:?}, all_reduce {} to {}, \
         peers {}",
        o.backends.join(","),
        o.world_sizes,
        size_label(MIN_BYTES),
        size_label(*ar_sizes.last().unwrap_or(&0)),
        if o.peers.is_empty() {
            "none".to_string()
        } else {
            o.peers
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(",")
        },
    );
    println!(
        "# {} ({} cores), {}; slice {} B, spin {} us, park after {} us, timeout {} s",
        facts["cpu_model"].as_str().unwrap_or("unknown CPU"),
        facts["cores"],
        facts["date_utc"].as_str().unwrap_or(""),
        config.slice_bytes,
        config.spin.as_micros(),
        config.park_after.as_micros(),
        config.timeout.as_secs_f64(),
    );
    if cfg!(debug_assertions) {
        println!("# warning: xtask was built without optimisations; use `cargo xtask`");
    }
    let cpu_start = CpuSnapshot::now();

    // The copy curve, at every world size and all-reduce size of the sweep.
    println!("# measuring the copy curve (one thread per rank, a rank's working set each)");
    let mut curve: BTreeMap<(usize, usize), CopyPoint> = BTreeMap::new();
    for &n in &o.world_sizes {
        for &bytes in &ar_sizes {
            curve.insert((n, bytes), memcpy::measure(bytes, n, copy_plan(o.quick)));
        }
    }
    let copy = |n: usize, bytes: usize| curve.get(&(n, bytes)).map(|p| p.best().0);
    // The data movement of the 2-rank latency target alone, beside it.
    let exchange = o.world_sizes.contains(&2).then(|| {
        let us = exchange::exchange_us(
            targets::SMALL_BYTES,
            if o.quick { 2_000 } else { 20_000 },
            5,
        );
        println!(
            "# {} exchanged between 2 threads (each writes its own, then reads the other's): \
             {us:.2} us an iteration",
            size_label(targets::SMALL_BYTES)
        );
        us
    });

    let mut errors: Vec<Value> = Vec::new();
    let mut mirra_rounds: Vec<Vec<Row>> = Vec::new();
    let mut peer_rounds: Vec<Vec<PeerRun>> = Vec::new();
    for round in 1..=o.rounds {
        if o.rounds > 1 {
            println!("#\n# round {round} of {}", o.rounds);
        }
        mirra_rounds.push(measure_mirra(&o, &config, &copy, &mut errors));
        peer_rounds.push(measure_peers(&o, &ar_sizes, &copy));
    }
    let rows = merge_rounds(&mirra_rounds);
    let peer_runs = merge_peer_rounds(peer_rounds);
    if o.rounds > 1 {
        println!("#\n# medians over {} rounds", o.rounds);
        for r in rows.iter().filter(|r| r.op == Op::AllReduce) {
            println!("{}", r.line());
        }
    }

    let others_share = cpu_start
        .zip(CpuSnapshot::now())
        .and_then(|(a, b)| a.others_share(&b));
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let report = report_json(
        &o,
        args,
        &facts,
        &config,
        &curve,
        &rows,
        &peer_runs,
        &errors,
        &ar_sizes,
        others_share,
        wrong,
        exchange,
        started,
    );
    for line in targets::summary(&report) {
        println!("{line}");
    }
    save(&out_path, &report, Some(started))?;
    if !errors.is_empty() || wrong > 0 {
        return Err(Failure::run(format!(
            "xtask bench-collectives: {} failed group(s), {wrong} wrong element(s)",
            errors.len()
        )));
    }
    Ok(())
}

/// Rows of several rounds as one: each row of the first round with its time the median
/// over the rounds that measured the same (backend, world size, op, size), and its wrong
/// elements summed over them.
fn merge_rounds(rounds: &[Vec<Row>]) -> Vec<Row> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|r| {
            let same = |o: &&Row| {
                (o.backend.as_str(), o.world_size, o.op, o.bytes)
                    == (r.backend.as_str(), r.world_size, r.op, r.bytes)
            };
            let matching: Vec<&Row> = rounds
                .iter()
                .filter_map(|rs| rs.iter().find(same))
                .collect();
            let times: Vec<f64> = matching.iter().map(|o| o.seconds).collect();
            Row {
                seconds: median(&times),
                wrong: matching.iter().map(|o| o.wrong).sum(),
                ..r.clone()
            }
        })
        .collect()
}

/// Each peer's runs over the rounds as one (see [`merge_rounds`]); a world size that failed
/// in any round is reported failed.
fn merge_peer_rounds(rounds: Vec<Vec<PeerRun>>) -> Vec<PeerRun> {
    let mut rounds = rounds.into_iter();
    let Some(first) = rounds.next() else {
        return Vec::new();
    };
    let rest: Vec<Vec<PeerRun>> = rounds.collect();
    first
        .into_iter()
        .enumerate()
        .map(|(i, mut run)| {
            let mut per_round = vec![run.rows.clone()];
            for later in rest.iter().filter_map(|r| r.get(i)) {
                per_round.push(later.rows.clone());
                for f in &later.failures {
                    if !run.failures.iter().any(|(n, _)| *n == f.0) {
                        run.failures.push(f.clone());
                    }
                }
            }
            run.rows = merge_rounds(&per_round);
            run
        })
        .collect()
}

/// One round of mirra's backends over every world size, op and size.
fn measure_mirra(
    o: &Options,
    config: &Config,
    copy: &dyn Fn(usize, usize) -> Option<f64>,
    errors: &mut Vec<Value>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for backend in &o.backends {
        for &n in &o.world_sizes {
            let group = match Group::spawn(backend, n, config.clone()) {
                Ok(g) => g,
                Err(e) => {
                    println!("# error: backend {backend}, {n} ranks: {e}");
                    errors.push(json!({"backend": backend, "world_size": n, "error": e}));
                    continue;
                }
            };
            sweep(&group, backend, n, o, copy, &mut rows, errors, &mut |_| {});
        }
    }
    rows
}

/// Every op and size of the sweep on one group of `n` ranks of `backend`: each row printed
/// and pushed to `rows` as it is measured (then shown to `after_row`); a failure is
/// recorded in `errors` and ends the group (it is aborted).
#[allow(clippy::too_many_arguments)]
fn sweep(
    group: &Group,
    backend: &str,
    n: usize,
    o: &Options,
    copy: &dyn Fn(usize, usize) -> Option<f64>,
    rows: &mut Vec<Row>,
    errors: &mut Vec<Value>,
    after_row: &mut dyn FnMut(&Row),
) {
    for op in Op::ALL {
        println!("{}", nccl::header(op, backend, n));
        let first = rows.len();
        let mut previous: Option<(usize, f64)> = None;
        for bytes in sizes(op, o.max_bytes, o.quick) {
            let (bytes, count) = op.shape(bytes, 4, n);
            let predicted = previous.map(|(b, t)| t * bytes as f64 / b as f64);
            let (warmup, iters) = iterations(bytes, predicted, o.quick);
            let job = Job {
                op,
                count,
                warmup,
                iters,
            };
            match group.run(job) {
                Ok(outcome) => {
                    let row = Row {
                        backend: backend.to_string(),
                        world_size: n,
                        op,
                        dtype: "f32",
                        bytes,
                        count,
                        seconds: median(&outcome.seconds),
                        wrong: outcome.wrong,
                        copy_gbs: (op == Op::AllReduce).then(|| copy(n, bytes)).flatten(),
                    };
                    println!("{}", row.line());
                    previous = Some((bytes, row.seconds));
                    after_row(&row);
                    rows.push(row);
                }
                Err(e) => {
                    println!("# error: {} {} bytes: {e}", op.name(), bytes);
                    errors.push(json!({
                        "backend": backend,
                        "world_size": n,
                        "op": op.name(),
                        "bytes": bytes,
                        "error": e,
                    }));
                    // The group is aborted: skip its remaining sizes and ops.
                    return;
                }
            }
        }
        if let Some(line) = nccl::avg_busbw_line(&rows[first..]) {
            println!("{line}");
        }
    }
}

/// One round of the peers over the all-reduce sweep, timed and checked the same way.
fn measure_peers(
    o: &Options,
    ar_sizes: &[usize],
    copy: &dyn Fn(usize, usize) -> Option<f64>,
) -> Vec<PeerRun> {
    let plans: Vec<SizePlan> = ar_sizes
        .iter()
        .map(|&bytes| {
            // The peers' programs cannot predict a size's time from the previous one: the
            // byte budget alone, and at most PEER_MAX_ITERS (gloo takes milliseconds per
            // small all-reduce on shared cores).
            let (warmup, iters) = iterations(bytes, None, o.quick);
            SizePlan {
                bytes,
                warmup: warmup.min(PEER_MAX_ITERS / 10),
                iters: iters.min(PEER_MAX_ITERS),
            }
        })
        .collect();
    let root = workspace_root();
    let target = target_dir(&root);
    let mut peer_runs: Vec<PeerRun> = Vec::new();
    for &peer in &o.peers {
        println!("#\n# {}: {}", peer.name(), peer.what());
        let run = peers::run(peer, &o.world_sizes, &plans, &root, &target, copy);
        match &run.found {
            Err(why) => println!("# {} MISSING: {why}", peer.name()),
            Ok(version) => {
                println!("# {version}: {}", run.command);
                for &n in &o.world_sizes {
                    println!("{}", nccl::header(Op::AllReduce, peer.name(), n));
                    for r in run.rows.iter().filter(|r| r.world_size == n) {
                        println!("{}", r.line());
                    }
                    if let Some((_, why)) = run.failures.iter().find(|(m, _)| *m == n) {
                        println!("# {} failed at {n} ranks: {why}", peer.name());
                    }
                }
            }
        }
        peer_runs.push(run);
    }
    peer_runs
}

/// `collectives.json`.
#[allow(clippy::too_many_arguments)]
fn report_json(
    o: &Options,
    args: &[String],
    facts: &Value,
    config: &Config,
    curve: &BTreeMap<(usize, usize), CopyPoint>,
    rows: &[Row],
    peer_runs: &[PeerRun],
    errors: &[Value],
    ar_sizes: &[usize],
    others_share: Option<f64>,
    wrong: u64,
    exchange: Option<f64>,
    started: Instant,
) -> Value {
    json!({
        "schema": "mirra-bench-collectives/2",
        "command": format!("cargo xtask bench-collectives {}", args.join(" ")).trim_end(),
        "machine": facts,
        "quick": o.quick,
        "rounds": o.rounds,
        "config": {
            "timeout_ms": config.timeout.as_millis() as u64,
            "slice_bytes": config.slice_bytes,
            "spin_us": config.spin.as_micros() as u64,
            "park_after_us": config.park_after.as_micros() as u64,
        },
        "backends": o.backends,
        "world_sizes": o.world_sizes,
        "copy_curve": curve.values().map(copy_json).collect::<Vec<_>>(),
        "exchange": exchange.map(|us| json!({
            "bytes": targets::SMALL_BYTES,
            "threads": 2,
            "us": num(us, 3),
        })),
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "peers": peer_runs.iter().map(PeerRun::json).collect::<Vec<_>>(),
        "beside_peers": targets::beside_peers(rows, peer_runs, &o.world_sizes, ar_sizes),
        "targets": targets::targets(rows, peer_runs),
        "wrong": wrong,
        "errors": errors,
        "others_cpu_share": opt(others_share, 3),
        "plan": {
            "timing": "per iteration: inputs written afresh, the group's barrier, then the \
                       collective, timed on every rank; the slowest rank's time; median over \
                       the timed iterations. The peers' programs (benches/peers/) do the same",
            "rounds": "with --rounds R: mirra's sweep then the peers', R times; each row's \
                       time is the median over the rounds, its #wrong the sum",
            "iterations": "about 512 MiB of messages and 0.75 s of timed iterations per size \
                           (from the previous size's time; the peers: 512 MiB and at most 50), \
                           3 to 200, after 1 to 10 warm-up iterations",
            "check": "inputs are small integers (exact sums in any order); before every \
                      iteration inputs are rewritten and outputs set to NaN; after every \
                      iteration, warm-up included, #wrong counts the elements of every rank \
                      that differ from the closed form",
            "copy_curve": "per world size n and all-reduce size B: n threads at once, each \
                           copying the first half of its own B-byte buffer into the second \
                           half (re-used every call), memcpy and a vector loop; GB/s per \
                           thread (bytes one thread copies, counted once, over the span from \
                           the first thread's start to the last one's end), median \
                           of the repeats, the better kernel. algbw / copy above 1.0 is \
                           reported as above the measured copy rate, not as a target",
            "exchange": "2 threads, a buffer of the latency target's size each; per \
                         iteration each writes its buffer afresh, publishes, waits for the \
                         other and reads the other's buffer: the data a 2-rank all-reduce \
                         brings into each core, alone (plus the fresh write); slower \
                         thread, median of 5 runs. A yardstick beside the 2-rank latency \
                         target, not a limit",
            "bytes_and_count": "as nccl-tests: bytes of the whole vector, per-rank count",
            "all_reduce_bytes": ar_sizes,
            "other_ops_bytes": sizes(Op::Broadcast, o.max_bytes, o.quick),
        },
        "elapsed_s": num(started.elapsed().as_secs_f64(), 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cli::args;

    fn options(a: &[&str]) -> Options {
        parse(&args(a)).unwrap().unwrap()
    }

    fn row(backend: &str, n: usize, bytes: usize, seconds: f64, wrong: u64) -> Row {
        Row {
            backend: backend.into(),
            world_size: n,
            op: Op::AllReduce,
            dtype: "f32",
            bytes,
            count: bytes / 4,
            seconds,
            wrong,
            copy_gbs: None,
        }
    }

    #[test]
    fn rounds_merge_to_each_rows_median_time_and_summed_wrong() {
        let rounds = vec![
            vec![row("ring", 2, 4096, 3.0, 0), row("ring", 4, 4096, 10.0, 0)],
            vec![row("ring", 4, 4096, 30.0, 1), row("ring", 2, 4096, 1.0, 0)],
            vec![row("ring", 2, 4096, 2.0, 0)], // a round that lost its 4-rank group
        ];
        let merged = merge_rounds(&rounds);
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].world_size, merged[0].seconds), (2, 2.0));
        assert_eq!((merged[1].seconds, merged[1].wrong), (20.0, 1));
        assert!(merge_rounds(&[]).is_empty());
        assert_eq!(options(&["--rounds", "3"]).rounds, 3);
        assert_eq!(options(&[]).rounds, 1);
        assert!(parse(&args(&["--rounds", "0"])).is_err());
    }

    #[test]
    fn flags_parse_and_bad_ones_are_usage_errors() {
        let o = options(&[]);
        assert_eq!(o.backends, BACKENDS);
        assert_eq!(o.world_sizes, [2, 4, 8]);
        assert_eq!(o.max_bytes, 256 << 20);
        assert_eq!(o.peers, Peer::ALL);
        let o = options(&[
            "--backends",
            "tree,ring",
            "--world-sizes",
            "4,2,4",
            "--max-bytes",
            "64M",
            "--peers",
            "none",
        ]);
        assert_eq!(o.backends, ["tree", "ring"]);
        assert_eq!(o.world_sizes, [4, 2]);
        assert_eq!(o.max_bytes, 64 << 20);
        assert!(o.peers.is_empty());
        let m = options(&["--backends", "direct,mpi", "--peers", "openmpi"]);
        assert_eq!(m.backends, ["direct"]);
        assert_eq!(m.peers, [Peer::MirraMpi, Peer::OpenMpi]);
        let q = options(&["--quick", "--peers", "gloo"]);
        assert_eq!((q.world_sizes, q.max_bytes), (vec![2, 4], 1 << 20));
        assert_eq!(q.peers, [Peer::Gloo]);
        for bad in [
            &["--backends", "nccl"][..],
            &["--backends", ""],
            &["--world-sizes", "0"],
            &["--world-sizes", "65"],
            &["--world-sizes", "two"],
            &["--max-bytes", "100"],
            &["--max-bytes"],
            &["--peers", "mpich"],
            &["--bogus"],
            &["extra"],
        ] {
            let e = parse(&args(bad)).unwrap_err();
            assert_eq!(e.code, 2, "{bad:?}");
        }
        let e = parse(&args(&["--world-sizes", "65"])).unwrap_err();
        assert!(
            e.message.contains("a world size is 1 to 64, got `65`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn sweeps_span_4kib_to_the_maximum() {
        let ar = sizes(Op::AllReduce, DEFAULT_MAX_BYTES, false);
        assert_eq!(ar.len(), 17);
        assert_eq!((ar[0], ar[16]), (4096, 256 << 20));
        assert!(ar.contains(&targets::TARGET_BYTES) && ar.contains(&targets::SMALL_BYTES));
        assert_eq!(
            sizes(Op::ReduceScatter, DEFAULT_MAX_BYTES, false),
            COARSE_BYTES
        );
        assert_eq!(sizes(Op::AllGather, 1 << 20, false), [4096, 1 << 20]);
        assert_eq!(
            sizes(Op::AllReduce, 1 << 20, true),
            [4096, 16384, 65536, 262144, 1 << 20]
        );
        assert_eq!(sizes(Op::Broadcast, 256 << 20, true), [4096, 1 << 20]);
    }

    #[test]
    fn big_messages_get_fewer_iterations() {
        assert_eq!(iterations(4096, None, false), (10, 200));
        assert_eq!(iterations(64 << 20, None, false), (1, 8));
        assert_eq!(iterations(256 << 20, None, false), (1, 3));
        // A slow backend: the time budget wins.
        assert_eq!(iterations(64 << 20, Some(0.25), false), (1, 3));
        assert_eq!(iterations(1 << 20, Some(0.01), false), (7, 75));
        assert_eq!(iterations(4096, None, true), (1, 20));
    }

    #[test]
    fn copy_points_keep_every_repeat_and_the_better_kernel() {
        let p = CopyPoint {
            threads: 2,
            bytes: 4096,
            gbs: [vec![10.0, 12.0, 11.0], vec![13.0, 9.0, 14.0]],
        };
        let v = copy_json(&p);
        assert_eq!(v["best_gbs"], 13.0);
        assert_eq!(v["best_kernel"], "vector_loop");
        assert_eq!(v["memcpy_gbs"], json!([10.0, 12.0, 11.0]));
        assert_eq!(v["memcpy_gbs_median"], 11.0);
        assert_eq!(v["vector_loop_gbs_median"], 13.0);
    }
}
