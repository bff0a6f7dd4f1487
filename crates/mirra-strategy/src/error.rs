use mirra_collectives::CollectiveError;
use mirra_tensor::TensorError;

/// Everything that can go wrong in the mirrored strategy.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// A strategy needs at least one replica.
    #[error("a mirrored strategy needs at least 1 replica, got {0}")]
    NoReplicas(usize),
    /// A collective failed (or the backend name is unknown).
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The model's variables were created outside this strategy's scope.
    #[error(
        "the model's variables ({names}) were created {where_}; build the model inside \
         `strategy.scope(|| ...)` so that they are mirrored on every replica"
    )]
    OutsideScope {
        /// The first few variable names.
        names: String,
        /// "outside any strategy's scope" or "in another strategy's scope".
        where_: &'static str,
    },
    /// A replica's step panicked; the others finished their step first.
    #[error("replica {replica} panicked: {message}")]
    ReplicaPanicked {
        /// The replica.
        replica: usize,
        /// The panic message.
        message: String,
    },
    /// `run` was called from inside a step of the same strategy.
    #[error(
        "MirroredStrategy::run called from inside a step of the same strategy (on replica \
         {replica}): the nested run would wait for the replica that runs it; use the step's \
         ReplicaContext for collectives instead"
    )]
    NestedRun {
        /// The replica whose step called `run`.
        replica: usize,
    },
    /// A replica thread could not be started.
    #[error("could not start replica thread {replica}: {reason}")]
    Spawn {
        /// The replica.
        replica: usize,
        /// The operating system's reason.
        reason: String,
    },
    /// Inputs that do not fit together.
    #[error("{0}")]
    Invalid(String),
}
