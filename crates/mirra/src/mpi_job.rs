//! `mirra train` under `mpirun -np N` (or `srun`): each process is one worker of a
//! multi-worker strategy (`MirroredStrategy::multi_worker`), with `--replicas` replica
//! threads of its own. Which process this is comes from the launcher's environment; the
//! strategy needs the `mpi` feature of this build.

use mirra::strategy::{MirroredStrategy, StrategyConfig};

use crate::Failure;

/// This process's place in a job of several processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    /// This process's rank, `0..size`: rank 0 alone prints and writes the run's files.
    pub rank: usize,
    /// The processes (workers) of the job.
    pub size: usize,
}

impl Job {
    /// True for the process that prints and writes the run's outputs.
    pub fn is_leader(job: Option<Job>) -> bool {
        job.is_none_or(|j| j.rank == 0)
    }
}

/// The variables launchers set: OpenMPI's `mpirun`, then PMI's (MPICH's Hydra, Slurm's
/// `srun --mpi=pmi2`).
const VARIABLES: [(&str, &str); 2] = [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
];

/// The job this process is part of, from `lookup` (the environment); `None` outside a
/// launcher or in a job of one process. A variable that is not a number, or a rank out
/// of range, is an error naming it.
pub fn detect_in(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Job>, Failure> {
    for (rank_var, size_var) in VARIABLES {
        let (Some(rank), Some(size)) = (lookup(rank_var), lookup(size_var)) else {
            continue;
        };
        let number = |var: &str, v: &str| {
            v.trim().parse::<usize>().map_err(|_| {
                Failure::Usage(format!(
                    "{var}={v:?}: the launcher's rank and size are numbers"
                ))
            })
        };
        let (rank, size) = (number(rank_var, &rank)?, number(size_var, &size)?);
        if rank >= size {
            return Err(Failure::Usage(format!(
                "{rank_var}={rank} with {size_var}={size}: a rank is below the job's size"
            )));
        }
        return Ok((size > 1).then_some(Job { rank, size }));
    }
    Ok(None)
}

/// [`detect_in`] this process's environment.
pub fn detect() -> Result<Option<Job>, Failure> {
    detect_in(|var| std::env::var(var).ok())
}

/// MPI, held for the run: dropped after the strategy (declare it first).
#[derive(Debug)]
pub struct Session {
    #[cfg(feature = "mpi")]
    _mpi: Box<mirra::collectives::Mpi>,
}

/// This process's multi-worker strategy: `config.replicas` replicas here, every worker's
/// in sync.
#[cfg(feature = "mpi")]
pub fn strategy(job: Job, config: StrategyConfig) -> Result<(Session, MirroredStrategy), Failure> {
    let mpi =
        Box::new(mirra::collectives::Mpi::init().map_err(|e| {
            Failure::Run(format!("MPI (process {} of {}): {e}", job.rank, job.size))
        })?);
    let strategy = MirroredStrategy::multi_worker(&mpi, config)
        .map_err(|e| Failure::Usage(format!("multi-worker strategy: {e}")))?;
    Ok((Session { _mpi: mpi }, strategy))
}

/// Without the `mpi` feature, a job of several processes is a usage error: each process
/// would train alone and they would overwrite each other's files.
#[cfg(not(feature = "mpi"))]
pub fn strategy(job: Job, _config: StrategyConfig) -> Result<(Session, MirroredStrategy), Failure> {
    Err(Failure::Usage(format!(
        "mirra train runs as process {} of {} of an MPI job, but this mirra was built without \
         MPI: build it with `cargo build --release -p mirra --features mpi` (ci/install-mpi.sh \
         installs OpenMPI and libclang), or run it without mpirun",
        job.rank, job.size
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_job_comes_from_the_launcher_s_variables() {
        let job = |vars| detect_in(env(vars)).map_err(|e| format!("{e:?}"));
        assert_eq!(job(&[]), Ok(None));
        assert_eq!(
            job(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "3")]),
            Ok(Some(Job { rank: 1, size: 3 }))
        );
        assert_eq!(
            job(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
            Ok(Some(Job { rank: 0, size: 2 }))
        );
        // A job of one process trains as a plain run.
        assert_eq!(job(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]), Ok(None));
        let e = job(&[("PMI_RANK", "x"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(e.contains("PMI_RANK=\\\"x\\\""), "{e}");
        let e = job(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(e.contains("a rank is below the job's size"), "{e}");
    }
}
