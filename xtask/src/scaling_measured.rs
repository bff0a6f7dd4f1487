//! `cargo xtask scaling` without `--topology`: scaling measured on the devices at hand.
//!
//! For 1, 2, 4 and 8 CPU replicas (threads sharing this machine's cores) and every
//! collective backend, the mirrored training step of the MNIST MLP at 64 samples per
//! replica (weak scaling, as data-parallel scaling is reported): step time, samples/s,
//! scaling efficiency `samples/s(N) / (N x samples/s(1))` and the exposed communication
//! per step; the collective benchmark (a quick `bench-collectives` sweep); and the MLP's
//! per-layer backward timings on this machine, the profile the scaling model uses for
//! "the model at hand". Everything lands in `target/bench/scaling-measured.json`.
//!
//! [`measure_host`] measures what the host model of `mirra-scaling` takes (cores, copy rates
//! per thread count, the one-replica step per kernel-thread count, small all-reduces) and
//! the scaling it predicts, for `cargo xtask scaling --validate`.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mirra::autograd::Tape;
use mirra::collectives::{Config, BACKENDS, NOOP};
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::nn::{Loss, Reduction};
use mirra::strategy::{MirroredStrategy, StrategyConfig, DEFAULT_BUCKET_BYTES};
use mirra::tensor::{num_threads, set_num_threads};
use mirra_scaling::checks::HostRun;
use mirra_scaling::host::{HostMeasurements, SyncSample};
use mirra_scaling::profile::LayerProfile;
use mirra_scaling::ModelProfile;
use serde_json::{json, Value};

use crate::json::{num, save};
use crate::nccl::Op;
use crate::paths::{bench_file, target_dir, workspace_root};
use crate::ranks::{Group, Job};
use crate::timing::{measure, median, Plan};
use crate::{bench_collectives, machine, mnist_train, Failure};

/// Samples per replica of the measured rows.
pub const PER_REPLICA_BATCH: usize = 64;
/// Replica counts measured by default (8 threads on this 2-core machine: oversubscribed,
/// which is the point of measuring it).
pub const REPLICAS: [usize; 4] = [1, 2, 4, 8];

/// The replica counts the host model is checked at (issue 13: "at 2 and 4 ranks").
pub const HOST_REPLICAS: [usize; 2] = [2, 4];

/// The collective the host model models and its check measures: the strategy's default.
pub const HOST_COLLECTIVE: &str = "ring";

/// The message of the small all-reduces that give the host model its synchronisation cost.
pub const SYNC_BYTES: usize = 4 << 10;

/// The MLP's profile on this machine: forward time and each layer's backward time (from
/// the moments backward hands out each gradient), medians over `reps` steps.
pub fn mlp_profile(batch: usize, reps: usize) -> Result<ModelProfile, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut net = mirra::models::mlp();
    net.build(&[28, 28], 42).map_err(|e| err(&e))?;
    let names: Vec<String> = net
        .param_names()
        .iter()
        .map(|n| n.split('/').next().unwrap_or(n).to_string())
        .collect();
    let mut layers: Vec<String> = names.clone();
    layers.dedup();
    let params: Vec<usize> = layers
        .iter()
        .map(|l| {
            names
                .iter()
                .zip(net.params())
                .filter(|(n, _)| *n == l)
                .map(|(_, p)| p.elem_count())
                .sum()
        })
        .collect();
    let data = mnist_train::synthetic_batches(batch)?;
    let (x, y) = &data[0];
    let loss_fn = SparseCategoricalCrossentropy::default();
    let tape = Tape::new();
    let mut forward = vec![];
    let mut backward: Vec<Vec<f64>> = vec![vec![]; layers.len()];
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let out = net
            .forward(&tape, x.clone(), true, mirra::nn::Examples::default())
            .map_err(|e| err(&e))?;
        let loss = loss_fn
            .compute(&out, y, Reduction::SumOverBatchSize)
            .map_err(|e| err(&e))?;
        let t1 = Instant::now();
        let mut ready = vec![];
        tape.backward_with(&loss, |key, _| {
            ready.push((key, Instant::now()));
            Ok(())
        })
        .map_err(|e| err(&e))?;
        drop((out, loss));
        tape.clear();
        forward.push((t1 - t0).as_secs_f64());
        let mut per_layer = vec![0.0; layers.len()];
        let mut last = t1;
        for (key, at) in ready {
            let layer = layers.iter().position(|l| *l == names[key]).unwrap_or(0);
            per_layer[layer] += (at - last).as_secs_f64();
            last = at;
        }
        for (acc, t) in backward.iter_mut().zip(per_layer) {
            acc.push(t);
        }
    }
    let layer_profiles = layers
        .iter()
        .zip(&params)
        .zip(&backward)
        .map(|((name, &params), times)| LayerProfile {
            name: name.clone(),
            params,
            backward_s: median(times),
        })
        .collect();
    ModelProfile::from_measured(
        "mnist-mlp",
        batch,
        median(&forward),
        layer_profiles,
        4,
        format!(
            "measured here: {} ({} threads), median of {reps} steps",
            machine::cpu_model().unwrap_or_else(|| "this CPU".into()),
            num_threads()
        ),
    )
    .map_err(|e| e.to_string())
}

/// What the measured mode measures and where it writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Fewer, shorter repeats and a small collectives sweep.
    pub quick: bool,
    /// Replica counts (1 is always measured: the efficiencies divide by it).
    pub replicas: Vec<usize>,
    /// Where to write the JSON (default: `target/bench/scaling-measured.json`).
    pub out: Option<PathBuf>,
}

impl Options {
    /// The options of `cargo xtask scaling [--quick]`.
    pub fn new(quick: bool, replicas: Option<Vec<usize>>, out: Option<PathBuf>) -> Options {
        let mut replicas = replicas.unwrap_or_else(|| REPLICAS.to_vec());
        if !replicas.contains(&1) {
            replicas.insert(0, 1);
        }
        Options {
            quick,
            replicas,
            out,
        }
    }
}

/// Timing plan of the training measurements.
fn plan(quick: bool) -> Plan {
    if quick {
        Plan {
            warm_up: Duration::from_millis(100),
            repeats: 3,
            min_repeat: Duration::from_millis(100),
        }
    } else {
        Plan {
            warm_up: Duration::from_millis(500),
            repeats: 7,
            min_repeat: Duration::from_millis(400),
        }
    }
}

/// Samples/s of back-to-back training steps at `global_batch` on a few synthetic batches,
/// and where the distributed steps' time went (zero without a strategy). Step times of a
/// few seconds, compared between replica counts measured the same way: the model does not
/// converge in that time, so cycling a few batches changes nothing here, unlike in
/// `bench` and `bench-mirrored`, which time whole epochs of real data.
fn throughput(
    strategy: Option<Arc<MirroredStrategy>>,
    global_batch: usize,
    plan: Plan,
) -> Result<(f64, mirra::train::CommStats), String> {
    let mut model = mnist_train::compile(strategy)?;
    let data = mnist_train::synthetic_batches(global_batch)?;
    let mut i = 0usize;
    let mut step = || -> Result<(), String> {
        let (x, y) = &data[i % data.len()];
        i += 1;
        model.train_step(x.clone(), y).map_err(|e| e.to_string())?;
        Ok(())
    };
    let samples = measure(plan, &mut step)?;
    let stats = model.comm_stats().unwrap_or_default();
    Ok((global_batch as f64 / samples.median(), stats))
}

/// The measured mode.
pub fn run(o: &Options) -> Result<(), Failure> {
    let started = Instant::now();
    let root = workspace_root();
    let target = target_dir(&root);
    let out_path = bench_file(o.out.as_deref(), "scaling-measured.json");
    let cores = machine::cores();
    let plan = plan(o.quick);
    set_num_threads(cores);
    let profile =
        mlp_profile(PER_REPLICA_BATCH, if o.quick { 10 } else { 50 }).map_err(Failure::run)?;
    println!(
        "# measured scaling: MNIST MLP, {PER_REPLICA_BATCH} samples per replica, {cores} cores shared by the replicas"
    );
    println!(
        "# profile ({}): forward {:.1} us, backward {}",
        profile.source,
        profile.forward_s * 1e6,
        profile
            .layers
            .iter()
            .map(|l| format!("{} {:.1} us", l.name, l.backward_s * 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "# {:>8} {:>14} {:>10} {:>12} {:>10} {:>12} {:>9}",
        "replicas", "collective", "step (ms)", "samples/s", "efficiency", "exposed (ms)", "exposed"
    );
    let mut rows = vec![];
    let mut single: Option<f64> = None;
    for &replicas in &o.replicas {
        // One replica: the collective is never used; measure it once.
        let backends: Vec<&str> = if replicas == 1 {
            vec![BACKENDS[0]]
        } else {
            BACKENDS.to_vec()
        };
        for backend in backends {
            let config = StrategyConfig::cpu(replicas).with_collective(backend);
            let (sps, stats) = training(config, plan)?;
            let batch = PER_REPLICA_BATCH * replicas;
            let exposed = stats.exposed_fraction();
            let base = *single.get_or_insert(sps);
            let step_s = batch as f64 / sps;
            let efficiency = sps / (replicas as f64 * base);
            println!(
                "  {replicas:>8} {backend:>14} {:>10.3} {sps:>12.0} {efficiency:>10.3} {:>12.3} {:>8.1}%",
                step_s * 1e3,
                exposed * step_s * 1e3,
                100.0 * exposed
            );
            rows.push(json!({
                "replicas": replicas,
                "collective": if replicas == 1 { "none" } else { backend },
                "global_batch": batch,
                "step_ms": num(step_s * 1e3, 4),
                "samples_per_sec": num(sps, 1),
                "efficiency": num(efficiency, 4),
                "exposed_comm_ms": num(exposed * step_s * 1e3, 4),
                "exposed_comm_fraction": num(exposed, 4),
                "imbalance_fraction": num(stats.imbalance_fraction(), 4),
            }));
        }
    }
    // The collective benchmark, small: the report's bandwidth ratios come from it.
    let collectives_path = target.join("bench").join("collectives.json");
    // Without OpenMPI and gloo: the report compares mirra with itself over time.
    let mut bench_args: Vec<String> = vec![
        "--max-bytes".into(),
        "16M".into(),
        "--peers".into(),
        "none".into(),
    ];
    if o.quick {
        bench_args.push("--quick".into());
    }
    bench_args.extend(["--out".into(), collectives_path.display().to_string()]);
    println!(
        "#\n# collective benchmark: cargo xtask bench-collectives {}",
        bench_args.join(" ")
    );
    bench_collectives::run(&bench_args)?;

    let report = json!({
        "machine": machine::facts(),
        "quick": o.quick,
        "model": "mnist-mlp",
        "per_replica_batch": PER_REPLICA_BATCH,
        "rows": rows,
        "profile": profile_json(&profile),
        "collectives": collectives_path.display().to_string(),
    });
    save(&out_path, &report, Some(started))?;
    Ok(())
}

/// Samples/s of the mirrored MLP at 64 per replica under `config`, and where its
/// distributed steps' time went.
fn training(config: StrategyConfig, plan: Plan) -> Result<(f64, mirra::train::CommStats), Failure> {
    let batch = PER_REPLICA_BATCH * config.replicas;
    let strategy = Arc::new(
        MirroredStrategy::new(config).map_err(|e| Failure::run(format!("xtask scaling: {e}")))?,
    );
    throughput(Some(strategy), batch, plan).map_err(Failure::run)
}

/// Bytes each thread copies per measurement of [`copy_rate`]: enough repeats of a small
/// buffer to outlast the thread starts by far.
const COPY_VOLUME: usize = 64 << 20;

/// GB/s (bytes counted once, summed over threads) of `threads` threads at once, each
/// copying its own `bytes`-long buffer into another over and over, as the ranks of a
/// collective work on their own buffers (in cache when they fit): the threads start
/// together after a barrier, and the slowest one's time counts.
fn copy_rate(bytes: usize, threads: usize) -> f64 {
    let bytes = bytes.max(4096);
    let rounds = (COPY_VOLUME / bytes).max(4);
    let barrier = Barrier::new(threads);
    let slowest = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let src = vec![1u8; bytes];
                    let mut dst = vec![0u8; bytes];
                    dst.copy_from_slice(&src);
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..rounds {
                        dst.copy_from_slice(black_box(&src));
                        black_box(&mut dst);
                    }
                    t0.elapsed().as_secs_f64()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or(f64::NAN))
            .fold(0.0, f64::max)
    });
    (threads * bytes * rounds) as f64 / slowest / 1e9
}

/// One round of the host measurements.
struct HostRound {
    /// The cores usable at once.
    parallel: f64,
    /// Samples/s at 1 and at each of [`HOST_REPLICAS`].
    training: Vec<(usize, f64)>,
    /// One-replica steps by kernel threads, seconds.
    steps: Vec<f64>,
    /// Per-layer profiles by kernel threads.
    profiles: Vec<ModelProfile>,
    copy_gbs: Vec<f64>,
    sync_s: Vec<(usize, f64)>,
}

/// How many of `cores` cores the replicas' own work gets at once: `cores` replicas of the
/// MLP step with one kernel thread each, communicating nothing (the no-op group), against
/// one replica alone, `samples/s(cores) / samples/s(1)` at 64 per replica, between 1 and
/// `cores`. Unlike threads of pure arithmetic, it sees what the steps' threads
/// share: caches, memory bandwidth, a physical core's vector units (two vCPUs that are one
/// core's hyperthreads double integer arithmetic but not FMAs), the replica threads'
/// hand-offs. The model of shared cores (`mirra_scaling::host`) then stretches time by it.
fn workload_parallel_cores(cores: usize, plan: Plan) -> Result<f64, Failure> {
    let alone = |replicas: usize| {
        StrategyConfig::cpu(replicas)
            .with_collective(NOOP)
            .with_threads_per_replica(1)
    };
    let one = training(alone(1), plan)?.0;
    let all = training(alone(cores), plan)?.0;
    Ok((all / one).clamp(1.0, cores as f64))
}

fn host_round(cores: usize, bucket_bytes: usize, quick: bool) -> Result<HostRound, Failure> {
    let plan = plan(quick);
    let parallel = workload_parallel_cores(cores, plan)?;
    let mut training_rates = vec![];
    for replicas in std::iter::once(1).chain(HOST_REPLICAS) {
        let config = StrategyConfig::cpu(replicas).with_collective(HOST_COLLECTIVE);
        training_rates.push((replicas, training(config, plan)?.0));
    }
    let mut steps = vec![];
    let mut profiles = vec![];
    for k in 1..=cores {
        let one = StrategyConfig::cpu(1)
            .with_collective(HOST_COLLECTIVE)
            .with_threads_per_replica(k);
        let (sps, _) = training(one, plan)?;
        steps.push(PER_REPLICA_BATCH as f64 / sps);
        set_num_threads(k);
        profiles.push(
            mlp_profile(PER_REPLICA_BATCH, if quick { 10 } else { 30 }).map_err(Failure::run)?,
        );
    }
    set_num_threads(cores);
    // The bucket the ring reduces: all of the MLP's gradients, or the strategy's cap.
    let bucket = profiles[0].gradient_bytes().min(bucket_bytes);
    let repeats = if quick { 5 } else { 9 };
    let copy_gbs = (1..=cores)
        .map(|t| {
            median(
                &(0..repeats)
                    .map(|_| copy_rate(bucket, t))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let mut sync_s = vec![];
    for ranks in HOST_REPLICAS {
        let group =
            Group::spawn(HOST_COLLECTIVE, ranks, Config::default()).map_err(Failure::run)?;
        let job = Job {
            op: Op::AllReduce,
            count: SYNC_BYTES / 4,
            warmup: 20,
            iters: if quick { 200 } else { 1000 },
        };
        let outcome = group.run(job).map_err(Failure::run)?;
        sync_s.push((ranks, median(&outcome.seconds)));
    }
    // Measured before and after the rest of the round, which takes a few seconds: the cores
    // other work leaves free move.
    Ok(HostRound {
        parallel: 0.5 * (parallel + workload_parallel_cores(cores, plan)?),
        training: training_rates,
        steps,
        profiles,
        copy_gbs,
        sync_s,
    })
}

/// Measures, in `rounds` interleaved rounds (medians over them), what the host model takes
/// and the scaling it predicts: the mirrored MLP at 64 samples per replica on the `ring`.
pub fn measure_host(quick: bool) -> Result<HostRun, Failure> {
    let cores = machine::cores();
    let bucket_bytes = DEFAULT_BUCKET_BYTES;
    let rounds = if quick { 5 } else { 7 };
    let started = Instant::now();
    let all: Vec<HostRound> = (0..rounds)
        .map(|_| host_round(cores, bucket_bytes, quick))
        .collect::<Result<_, _>>()?;
    let med = |f: &dyn Fn(&HostRound) -> f64| median(&all.iter().map(f).collect::<Vec<_>>());
    let rate = |n: usize| {
        med(&|r| {
            r.training
                .iter()
                .find(|t| t.0 == n)
                .map_or(f64::NAN, |t| t.1)
        })
    };
    let one = rate(1);
    let efficiency = HOST_REPLICAS
        .iter()
        .map(|&n| (n, rate(n) / (n as f64 * one)))
        .collect();
    let mut steps = vec![];
    for k in 0..cores {
        // The round whose step time is the median, with its per-layer profile.
        let mut by_step: Vec<&HostRound> = all.iter().collect();
        by_step.sort_by(|a, b| a.steps[k].total_cmp(&b.steps[k]));
        let r = by_step[by_step.len() / 2];
        let p = r.profiles[k].clone();
        let update = (r.steps[k] - p.forward_s - p.backward_s()).max(0.0);
        steps.push(
            p.with_update(update)
                .map_err(|e| Failure::run(e.to_string()))?,
        );
    }
    let copy_gbs = (0..cores).map(|t| med(&|r| r.copy_gbs[t])).collect();
    let sync = HOST_REPLICAS
        .iter()
        .enumerate()
        .map(|(i, &ranks)| SyncSample {
            ranks,
            bytes: SYNC_BYTES,
            seconds: med(&|r| r.sync_s[i].1),
        })
        .collect();
    Ok(HostRun {
        measurements: HostMeasurements {
            cores,
            parallel_cores: med(&|r| r.parallel),
            bucket_bytes,
            copy_gbs,
            steps,
            sync,
        },
        efficiency,
        source: format!(
            "measured now: {} ({cores} cores), {HOST_COLLECTIVE}, {PER_REPLICA_BATCH} per \
             replica, medians of {rounds} rounds ({:.0} s)",
            machine::cpu_model().unwrap_or_else(|| "this CPU".into()),
            started.elapsed().as_secs_f64()
        ),
    })
}

/// A profile as JSON.
pub fn profile_json(p: &ModelProfile) -> Value {
    json!({
        "name": p.name,
        "batch": p.batch,
        "forward_s": p.forward_s,
        "bytes_per_param": p.bytes_per_param,
        "source": p.source,
        "layers": p.layers.iter().map(|l| json!({
            "name": l.name, "params": l.params, "backward_s": l.backward_s,
        })).collect::<Vec<Value>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_replica_is_always_measured() {
        let o = Options::new(true, Some(vec![2, 4]), None);
        assert_eq!(o.replicas, [1, 2, 4]);
        assert_eq!(Options::new(false, None, None).replicas, REPLICAS);
        assert_eq!(Options::new(false, Some(vec![1, 8]), None).replicas, [1, 8]);
    }

    #[test]
    fn copy_rates_count_every_thread_s_bytes() {
        for threads in [1, 2, 3] {
            let gbs = copy_rate(64 << 10, threads);
            assert!(
                gbs.is_finite() && gbs > 0.05,
                "{threads} threads: {gbs} GB/s"
            );
        }
        // A buffer below a page is copied as a page.
        assert!(copy_rate(1, 1).is_finite());
    }
}
