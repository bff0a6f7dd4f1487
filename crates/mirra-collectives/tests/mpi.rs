//! The `mpi` backend under `mpirun` (cargo feature `mpi`): each test below launches this
//! test binary again under `mpirun --oversubscribe -np N`, where the `rank_*` bodies (ignored
//! in a plain `cargo test`) run one rank each; a rank that fails a check panics, so its
//! process exits non-zero and so does `mpirun`.
//!
//! What the bodies reject: a wrong result of any collective, dtype, operator, root or
//! length (closed forms, exact in every dtype); a mismatch that is not the same error on
//! every rank or that leaves the group unusable; a rank that stops answering and is not
//! named within the deadline, or a job that hangs instead of ending.
#![cfg(feature = "mpi")]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mirra_collectives::{
    Collective, CollectiveError, Communicator, Config, Mpi, ReduceOp, SUPPORTED_DTYPES,
};
use mirra_device::{Buffer, DType, Device, Element};

/// Set in the ranks' environment by the launching test.
const CHILD: &str = "MIRRA_MPI_CHILD";

/// Runs the ignored test `body` on `n` ranks under mpirun.
fn mpirun(n: usize, body: &str) -> Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpirun");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        cmd.arg("--allow-run-as-root");
    }
    cmd.args(["--oversubscribe", "-np", &n.to_string()])
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            body,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1");
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run mpirun ({e}): install OpenMPI (ci/install-mpi.sh)"))
}

fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_collective_dtype_and_operator_on_2_3_and_4_ranks() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    for n in [2, 3, 4] {
        let out = mpirun(n, "rank_checks");
        assert!(out.status.success(), "{n} ranks: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.matches("rank checks passed").count(),
            n,
            "{n} ranks: {}",
            text(&out)
        );
    }
}

#[test]
fn a_rank_that_stops_answering_ends_the_job_naming_it() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let t = Instant::now();
    let out = mpirun(2, "rank_silent");
    let seconds = t.elapsed().as_secs_f64();
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("all_reduce: rank 0 timed out after 1s waiting for rank(s) [1]"),
        "{}",
        text(&out)
    );
    // Rank 1 sleeps 60 s: the job ended at rank 0's deadline, not when rank 1 woke.
    assert!(seconds < 30.0, "took {seconds:.1} s: {}", text(&out));
}

/// Rank `r`'s element `i`: 0, 1 or 2, so sums over 8 ranks and products over 4 are exact
/// in every dtype (u8 and bf16 included).
fn value(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3 + 1) % 3) as i64
}

fn buffer(dtype: DType, vals: impl Iterator<Item = i64>) -> Buffer {
    let vals: Vec<f64> = vals.map(|v| v as f64).collect();
    let mut b = Buffer::alloc(dtype, vals.len(), Device::Cpu).unwrap();
    fill(&mut b, &vals);
    b
}

fn fill(b: &mut Buffer, vals: &[f64]) {
    macro_rules! put {
        ($t:ty) => {
            for (d, v) in b.as_mut_slice::<$t>().unwrap().iter_mut().zip(vals) {
                *d = <$t as Element>::from_f64(*v);
            }
        };
    }
    match b.dtype() {
        DType::F32 => put!(f32),
        DType::F64 => put!(f64),
        DType::F16 => put!(half::f16),
        DType::BF16 => put!(half::bf16),
        DType::I32 => put!(i32),
        DType::I64 => put!(i64),
        DType::U8 => put!(u8),
    }
}

fn read(b: &Buffer) -> Vec<f64> {
    macro_rules! get {
        ($t:ty) => {
            b.as_slice::<$t>()
                .unwrap()
                .iter()
                .map(|x| Element::to_f64(*x))
                .collect()
        };
    }
    match b.dtype() {
        DType::F32 => get!(f32),
        DType::F64 => get!(f64),
        DType::F16 => get!(half::f16),
        DType::BF16 => get!(half::bf16),
        DType::I32 => get!(i32),
        DType::I64 => get!(i64),
        DType::U8 => get!(u8),
    }
}

/// The reduction of every rank's element `i` (Mean: the sum over n, truncated for
/// integers; n of 2 and 4 divides exactly in binary, 3 is checked against the rounded
/// quotient).
fn reduced(op: ReduceOp, dtype: DType, n: usize, i: usize) -> f64 {
    let vals = (0..n).map(|r| value(r, i) as f64);
    let float = !matches!(dtype, DType::I32 | DType::I64 | DType::U8);
    let exact = match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Mean if float => vals.sum::<f64>() / n as f64,
        ReduceOp::Mean => (vals.sum::<f64>() / n as f64).trunc(),
        ReduceOp::Max => vals.fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.fold(f64::MAX, f64::min),
        ReduceOp::Product => vals.product(),
    };
    // Rounded to the dtype, as the result is.
    let mut b = Buffer::alloc(dtype, 1, Device::Cpu).unwrap();
    fill(&mut b, &[exact]);
    read(&b)[0]
}

fn check(what: &str, got: &Buffer, want: &[f64]) {
    assert_eq!(read(got), want, "{what}");
}

#[test]
#[ignore = "one rank of an mpirun job: run by every_collective_dtype_and_operator_on_2_3_and_4_ranks"]
fn rank_checks() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mpi = Mpi::init().unwrap();
    let comm = mpi.world(Config::default().with_timeout(Duration::from_secs(60)));
    assert_eq!(comm.backend(), "mpi");
    checks(&*comm);
    // An aborted handle fails this rank's later calls (its peers are not waiting: every
    // rank aborts its own).
    comm.barrier().unwrap();
    comm.abort_handle().abort();
    assert!(matches!(
        comm.barrier(),
        Err(CollectiveError::Aborted { .. })
    ));
    println!("rank {}: rank checks passed", comm.rank());
    drop(comm);
    drop(mpi);
}

#[test]
fn every_collective_on_hierarchical_groups_of_2_and_3_workers() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    for n in [2, 3] {
        let out = mpirun(n, "rank_hierarchical");
        assert!(out.status.success(), "{n} workers: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        for rank in 0..2 * n {
            let line = format!("rank {rank} of {}: hierarchical checks passed", 2 * n);
            assert!(
                stdout.contains(&line),
                "{n} workers, no `{line}`: {}",
                text(&out)
            );
        }
    }
}

/// Each process a worker of two replica threads (`direct` between them), their leaders
/// over MPI: the same checks as `rank_checks`, with global ranks.
#[test]
#[ignore = "one rank of an mpirun job: run by every_collective_on_hierarchical_groups_of_2_and_3_workers"]
fn rank_hierarchical() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mpi = Mpi::init().unwrap();
    let config = Config::default().with_timeout(Duration::from_secs(60));
    let comms = mpi
        .hierarchical(&mpi.world_raw(), "direct", 2, config)
        .unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                assert_eq!(comm.backend(), "hierarchical");
                checks(&*comm);
                comm.barrier().unwrap();
                println!(
                    "rank {} of {}: hierarchical checks passed",
                    comm.rank(),
                    comm.world_size()
                );
            });
        }
    });
    drop(mpi);
}

#[test]
fn a_silent_replica_of_a_worker_ends_the_job_naming_it() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let t = Instant::now();
    let out = mpirun(2, "rank_silent_replica");
    let seconds = t.elapsed().as_secs_f64();
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Global rank 3 is worker 1's second replica: its leader, rank 2, names it (at the
    // local deadline, before the other worker's leader would blame rank 2 at the cross
    // one).
    assert!(
        stderr.contains("all_reduce: rank 2 timed out after 1s waiting for rank(s) [3]"),
        "{}",
        text(&out)
    );
    assert!(seconds < 30.0, "took {seconds:.1} s: {}", text(&out));
}

/// Two workers of two replicas; global rank 3 stops answering after one all-reduce.
#[test]
#[ignore = "one rank of an mpirun job: run by a_silent_replica_of_a_worker_ends_the_job_naming_it"]
fn rank_silent_replica() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mpi = Mpi::init().unwrap();
    let config = Config::default().with_timeout(Duration::from_secs(1));
    let comms = mpi
        .hierarchical(&mpi.world_raw(), "direct", 2, config)
        .unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                let mut b = buffer(DType::F32, 0..4);
                comm.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                // Worker 1 comes 300 ms late, so worker 0's ranks have waited longest:
                // with every stage's deadline equal, they would blame rank 2 first.
                if comm.rank() >= 2 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                if comm.rank() == 3 {
                    // Alive but silent, as a hung replica would be.
                    std::thread::sleep(Duration::from_secs(60));
                }
                let _ = comm.all_reduce(&mut b, ReduceOp::Sum);
                // The job ends at the first failure: no rank gets here within a minute.
                std::thread::sleep(Duration::from_secs(60));
            });
        }
    });
    panic!("the job should have ended at the deadline");
}

#[test]
fn workers_of_different_sizes_are_an_error_on_every_process() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let out = mpirun(2, "rank_uneven");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout
            .matches(
                "worker 1 has 2 local ranks, but worker 0 has 1: every worker of a \
                 hierarchical group needs the same number"
            )
            .count(),
        2,
        "{}",
        text(&out)
    );
}

#[test]
#[ignore = "one rank of an mpirun job: run by workers_of_different_sizes_are_an_error_on_every_process"]
fn rank_uneven() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mpi = Mpi::init().unwrap();
    let world = mpi.world_raw();
    let per_worker = 1 + mpirun_rank(&mpi);
    let e = mpi
        .hierarchical(&world, "direct", per_worker, Config::default())
        .expect_err("uneven workers are an error");
    println!("{e}");
    drop(mpi);
}

/// This process's rank of MPI's world.
fn mpirun_rank(mpi: &Mpi) -> usize {
    use mirra_collectives::rsmpi::topology::Communicator as _;
    mpi.world_raw().rank() as usize
}

/// Every collective, dtype, operator, root and length against closed forms; rounding
/// floats bitwise equal on every rank; a submitted all-reduce; mismatches (the same error
/// on every rank, naming global ranks, and the group goes on); a root out of range.
fn checks(comm: &dyn Communicator) {
    let (r, n) = (comm.rank(), comm.world_size());
    for dtype in SUPPORTED_DTYPES {
        for len in [0usize, 1, 3, 1000] {
            let mine = || buffer(dtype, (0..len).map(|i| value(r, i)));
            for op in ReduceOp::ALL {
                let what = format!("{dtype} x {len}, {op}");
                let mut b = mine();
                comm.all_reduce(&mut b, op).unwrap();
                let want: Vec<f64> = (0..len).map(|i| reduced(op, dtype, n, i)).collect();
                check(&format!("all_reduce {what}"), &b, &want);

                let send = buffer(dtype, (0..n * len).map(|i| value(r, i)));
                let mut recv = Buffer::alloc(dtype, len, Device::Cpu).unwrap();
                comm.reduce_scatter(&send, &mut recv, op).unwrap();
                let want: Vec<f64> = (0..len)
                    .map(|i| reduced(op, dtype, n, r * len + i))
                    .collect();
                check(&format!("reduce_scatter {what}"), &recv, &want);

                for root in 0..n {
                    let mut b = mine();
                    comm.reduce(&mut b, op, root).unwrap();
                    let want: Vec<f64> = if r == root {
                        (0..len).map(|i| reduced(op, dtype, n, i)).collect()
                    } else {
                        read(&mine())
                    };
                    check(&format!("reduce to {root}, {what}"), &b, &want);
                }
            }
            let mut all = Buffer::alloc(dtype, n * len, Device::Cpu).unwrap();
            comm.all_gather(&mine(), &mut all).unwrap();
            let want: Vec<f64> = (0..n)
                .flat_map(|p| (0..len).map(move |i| value(p, i) as f64))
                .collect();
            check(&format!("all_gather {dtype} x {len}"), &all, &want);
            for root in 0..n {
                let mut b = mine();
                comm.broadcast(&mut b, root).unwrap();
                let want: Vec<f64> = (0..len).map(|i| value(root, i) as f64).collect();
                check(
                    &format!("broadcast from {root}, {dtype} x {len}"),
                    &b,
                    &want,
                );
            }
        }
    }
    comm.barrier().unwrap();

    // Floats that round: every rank's all-reduced bits are the same (compared through an
    // all-gather of the results).
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let len = 257;
        let vals: Vec<f64> = (0..len)
            .map(|i| ((r * 7919 + i * 104_729) % 1000) as f64 / 7.0 - 70.0)
            .collect();
        let mut b = Buffer::alloc(dtype, len, Device::Cpu).unwrap();
        fill(&mut b, &vals);
        comm.all_reduce(&mut b, ReduceOp::Mean).unwrap();
        let mut all = Buffer::alloc(dtype, n * len, Device::Cpu).unwrap();
        comm.all_gather(&b, &mut all).unwrap();
        let bytes = all.as_bytes().unwrap();
        let each = bytes.len() / n;
        for p in 1..n {
            assert!(
                bytes[..each] == bytes[p * each..(p + 1) * each],
                "{dtype}: rank {p}'s all-reduced bits differ from rank 0's"
            );
        }
    }

    // A submitted all-reduce hands its buffer back with the result.
    let b = buffer(DType::F32, (0..10).map(|i| value(r, i)));
    let b = comm
        .submit_all_reduce(b, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    let want: Vec<f64> = (0..10)
        .map(|i| reduced(ReduceOp::Sum, DType::F32, n, i))
        .collect();
    check("submitted all_reduce", &b, &want);

    // Mismatches: the same error on every rank, and the group goes on.
    let dtype = if r == n - 1 { DType::F64 } else { DType::F32 };
    let mut b = buffer(dtype, 0..4);
    match comm.all_reduce(&mut b, ReduceOp::Sum) {
        Err(CollectiveError::DTypeMismatch { rank, ref_rank, .. }) => {
            assert_eq!((rank, ref_rank), (n - 1, 0));
        }
        other => panic!("rank {r}: a dtype mismatch gave {other:?}"),
    }
    let mut b = buffer(DType::I32, 0..(if r == 0 && n > 2 { 5 } else { 4 }));
    let got = comm.all_reduce(&mut b, ReduceOp::Sum);
    if n > 2 {
        // Rank 0 alone differs from the others: it is the one named.
        match got {
            Err(CollectiveError::LengthMismatch {
                rank: 0, len: 5, ..
            }) => {}
            other => panic!("rank {r}: a length mismatch gave {other:?}"),
        }
    } else {
        got.unwrap();
    }
    let mut b = buffer(DType::I64, 0..2);
    let started = if r == 0 {
        comm.broadcast(&mut b, 0)
    } else {
        comm.all_reduce(&mut b, ReduceOp::Sum)
    };
    match started {
        Err(CollectiveError::CollectiveMismatch {
            rank: 0,
            started: Collective::Broadcast,
            ref_started: Collective::AllReduce,
            ..
        }) if n > 2 => {}
        Err(CollectiveError::CollectiveMismatch { .. }) if n == 2 => {}
        other => panic!("rank {r}: a collective mismatch gave {other:?}"),
    }
    let mut b = buffer(DType::I32, std::iter::once(1));
    comm.all_reduce(&mut b, ReduceOp::Sum).unwrap();
    check("after the mismatches", &b, &[n as f64]);

    // A root out of range is an argument error on every rank.
    let mut b = buffer(DType::F32, 0..2);
    assert!(matches!(
        comm.broadcast(&mut b, n),
        Err(CollectiveError::RootOutOfRange { .. })
    ));
}

#[test]
#[ignore = "one rank of an mpirun job: run by a_rank_that_stops_answering_ends_the_job_naming_it"]
fn rank_silent() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mpi = Mpi::init().unwrap();
    let comm = mpi.world(Config::default().with_timeout(Duration::from_secs(1)));
    let mut b = buffer(DType::F32, 0..4);
    comm.all_reduce(&mut b, ReduceOp::Sum).unwrap();
    if comm.rank() == 1 {
        // Alive but silent, as a stopped process or a hung device would be.
        std::thread::sleep(Duration::from_secs(60));
    }
    let _ = comm.all_reduce(&mut b, ReduceOp::Sum);
    panic!(
        "rank {}: the job should have ended at the deadline",
        comm.rank()
    );
}

/// `nccl-mpi` on a machine without a GPU (this one): every rank gets one error naming
/// every rank that cannot use its GPU, and why this one cannot; the job ends, no rank waits
/// in NCCL. (With GPUs it has never run.)
#[test]
fn nccl_over_mpi_without_a_gpu_is_an_error_on_every_rank() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let out = mpirun(2, "rank_nccl");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("NCCL over MPI"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", text(&out));
    for l in lines {
        assert!(
            l.contains(
                "needs a GPU and NCCL on every process; rank(s) [0, 1] of 2 cannot use cuda:0"
            ),
            "{l}"
        );
    }
}

#[test]
#[ignore = "one rank of an mpirun job: run by nccl_over_mpi_without_a_gpu_is_an_error_on_every_rank"]
fn rank_nccl() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let mpi = Mpi::init().unwrap();
    let e = mpi
        .nccl(&mpi.world_raw(), 0, Config::default())
        .expect_err("no GPU here");
    println!("rank {}: {e}", mpirun_rank(&mpi));
    drop(mpi);
}
