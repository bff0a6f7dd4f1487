//! [`MirroredStrategy`]: the replicas, their scope, `run` and `reduce`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mirra_autograd::LinearMap;
use mirra_collectives::{
    cpu_group, device_group, noop_group, Communicator, Config, ReduceOp, BACKENDS, DEVICE_BACKENDS,
    NOOP,
};
use mirra_device::{DType, Device};
use mirra_nn::Network;
use mirra_tensor::Tensor;

use crate::cross_replica::CrossReplicaSum;
use crate::micro_batch_sums::MicroBatchSums;
use crate::pool::{ReplicaContext, ReplicaPool};
use crate::reducer::DEFAULT_BUCKET_BYTES;
use crate::{Result, StrategyError};

/// How to build a [`MirroredStrategy`].
#[derive(Clone, Debug)]
pub struct StrategyConfig {
    /// Replicas in sync (each a thread; on CUDA devices, a thread driving its device).
    pub replicas: usize,
    /// Each replica's device, in replica order; empty: every replica on the host. CUDA
    /// replicas may share a device (several ranks of `cuda-ring` on one GPU: how a
    /// one-GPU machine tests them).
    pub devices: Vec<Device>,
    /// The collective backend, by name: on the host `ring`, `tree`, `reduce-to-one`,
    /// `direct` (or [`NOOP`](mirra_collectives::NOOP), the ablation that communicates
    /// nothing, for measuring what communication costs: replicas then drift apart); on
    /// CUDA devices `cuda-ring`, `nccl-ring` or `nccl-tree`.
    pub collective: String,
    /// Gradient bucket size in bytes (DDP's `bucket_cap_mb`).
    pub bucket_bytes: usize,
    /// The dtype float gradients are all-reduced in (`None`: their own); bf16 or f16
    /// moves half the bytes of f32
    /// ([`GradientReducer::with_wire_dtype`](crate::GradientReducer::with_wire_dtype)).
    pub gradient_dtype: Option<DType>,
    /// Kernel threads per replica (default: the machine's cores divided among the
    /// replicas, at least one each).
    pub threads_per_replica: Option<usize>,
    /// Deadlines and tuning of the collectives.
    pub collectives: Config,
    /// Deterministic mode's micro-batch size (`None`: the default mode). Each step's
    /// global batch is cut into micro-batches of this many examples, each run on its own,
    /// their gradients summed in one fixed pairwise tree over their index
    /// ([`MicroBatches`](crate::MicroBatches)): any number of host replicas then ends every
    /// step with the bits of one (weights, optimizer state, loss, metrics).
    pub deterministic: Option<usize>,
}

impl StrategyConfig {
    /// `replicas` CPU replicas with the `ring` backend and 25 MiB buckets.
    pub fn cpu(replicas: usize) -> StrategyConfig {
        StrategyConfig {
            replicas,
            devices: Vec::new(),
            collective: "ring".into(),
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            gradient_dtype: None,
            threads_per_replica: None,
            collectives: Config::default(),
            deterministic: None,
        }
    }

    /// One replica per entry of `devices` (TensorFlow's `MirroredStrategy(devices=...)`):
    /// every entry `Device::Cpu` (host replicas, the `ring` backend), or every entry a
    /// CUDA device (the `cuda-ring` backend; a device may appear more than once). A mix is
    /// an error that names both kinds.
    pub fn devices(devices: &[Device]) -> Result<StrategyConfig> {
        let cuda = devices.iter().filter(|d| !d.is_cpu()).count();
        if cuda > 0 && cuda < devices.len() {
            let listed: Vec<String> = devices.iter().map(Device::to_string).collect();
            return Err(StrategyError::Invalid(format!(
                "replicas on {}: a mirrored strategy's replicas are all on the host or all on \
                 CUDA devices",
                listed.join(", ")
            )));
        }
        let mut config = StrategyConfig::cpu(devices.len());
        config.devices = devices.to_vec();
        if cuda > 0 {
            config.collective = "cuda-ring".into();
        }
        Ok(config)
    }

    /// Replica `r`'s device.
    pub fn device(&self, r: usize) -> Device {
        self.devices.get(r).copied().unwrap_or(Device::Cpu)
    }

    /// True when the replicas are on CUDA devices.
    pub fn on_cuda(&self) -> bool {
        self.devices.iter().any(|d| !d.is_cpu())
    }

    /// This config with another collective backend.
    pub fn with_collective(mut self, name: &str) -> StrategyConfig {
        self.collective = name.to_string();
        self
    }

    /// This config with another bucket size.
    pub fn with_bucket_bytes(mut self, bytes: usize) -> StrategyConfig {
        self.bucket_bytes = bytes;
        self
    }

    /// All-reduce float gradients in `dtype` (bf16 or f16: half the bytes of f32; f32 or
    /// f64: as they are). Checked by [`MirroredStrategy::new`].
    pub fn with_gradient_dtype(mut self, dtype: DType) -> StrategyConfig {
        self.gradient_dtype = Some(dtype);
        self
    }

    /// This config in deterministic mode with micro-batches of `micro` examples (see
    /// [`StrategyConfig::deterministic`]). Checked by [`MirroredStrategy::new`]: host
    /// replicas, gradients all-reduced in their own dtype.
    pub fn with_deterministic(mut self, micro: usize) -> StrategyConfig {
        self.deterministic = Some(micro);
        self
    }

    /// This config with a fixed number of kernel threads per replica.
    pub fn with_threads_per_replica(mut self, threads: usize) -> StrategyConfig {
        self.threads_per_replica = Some(threads);
        self
    }
}

/// Deterministic mode's scope (issue 19): host replicas, gradients summed in their own
/// dtype, a micro-batch of at least one example.
fn check_deterministic(config: &StrategyConfig) -> Result<()> {
    let Some(micro) = config.deterministic else {
        return Ok(());
    };
    if micro == 0 {
        return Err(StrategyError::Invalid(
            "deterministic mode needs micro-batches of at least 1 example".into(),
        ));
    }
    if config.on_cuda() {
        return Err(StrategyError::Invalid(
            "deterministic mode runs on host replicas only: on CUDA devices cuBLAS picks its \
             kernels by shape, so a sum's order is not fixed"
                .into(),
        ));
    }
    if let Some(d) = config.gradient_dtype.filter(|d| d.size_in_bytes() < 4) {
        return Err(StrategyError::Invalid(format!(
            "deterministic mode sums gradients in their own dtype, not in {d}"
        )));
    }
    if config.collective == NOOP {
        return Err(StrategyError::Invalid(format!(
            "deterministic mode sums gradients across replicas; the `{NOOP}` ablation \
             communicates nothing"
        )));
    }
    Ok(())
}

/// Values that exist once per replica, in replica order (TensorFlow's `PerReplica`).
#[derive(Clone, Debug, PartialEq)]
pub struct PerReplica<T>(pub Vec<T>);

impl<T> PerReplica<T> {
    /// The values, in replica order.
    pub fn values(&self) -> &[T] {
        &self.0
    }

    /// The values, in replica order.
    pub fn into_values(self) -> Vec<T> {
        self.0
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Synchronous data parallelism over replicas of one model (TensorFlow's
/// `tf.distribute.MirroredStrategy`). On CPU each replica is a long-lived thread with its
/// own communicator of the chosen collective backend.
///
/// ```
/// use mirra_strategy::{MirroredStrategy, ReduceOp};
///
/// let strategy = MirroredStrategy::cpu(2).unwrap();
/// let ids = strategy.run(|ctx| ctx.replica_id as f64).unwrap();
/// assert_eq!(strategy.reduce_scalars(ReduceOp::Sum, &ids), 1.0);
/// ```
pub struct MirroredStrategy {
    id: u64,
    pool: ReplicaPool,
    /// The replicas in sync, in every process (this process's alone, unless the group
    /// spans workers).
    world: usize,
    /// The id in the whole group of this process's first replica.
    first: usize,
    /// Per replica, the sum across replicas that layers use inside a step.
    sums: Vec<Arc<dyn LinearMap>>,
    /// The same sums in deterministic mode, over every micro-batch (else empty).
    micro_sums: Vec<Arc<MicroBatchSums>>,
    config: StrategyConfig,
    threads_per_replica: usize,
}

impl std::fmt::Debug for MirroredStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirroredStrategy")
            .field("replicas", &self.pool.len())
            .field("collective", &self.config.collective)
            .field("bucket_bytes", &self.config.bucket_bytes)
            .finish()
    }
}

impl MirroredStrategy {
    /// `replicas` CPU replicas with the default configuration ([`StrategyConfig::cpu`]).
    pub fn cpu(replicas: usize) -> Result<MirroredStrategy> {
        MirroredStrategy::new(StrategyConfig::cpu(replicas))
    }

    /// A strategy as configured. An unknown collective name or zero replicas is an error.
    pub fn new(config: StrategyConfig) -> Result<MirroredStrategy> {
        if config.replicas == 0 {
            return Err(StrategyError::NoReplicas(0));
        }
        if !config.devices.is_empty() && config.devices.len() != config.replicas {
            return Err(StrategyError::Invalid(format!(
                "{} replicas but {} devices: one device per replica",
                config.replicas,
                config.devices.len()
            )));
        }
        // A second group for the sums that synchronised batch norm makes inside forward
        // and backward passes: its own sequence, so they never queue behind (or ahead of)
        // the gradient buckets in flight on the first.
        let (gradients, sums) = (group(&config)?, group(&config)?);
        MirroredStrategy::with_communicators(config, gradients, sums)
    }

    /// A strategy whose replicas (this process's: `config.replicas` of them) are ranks of
    /// groups made elsewhere: `gradients` for the gradient buckets, `sums` for the sums
    /// inside a step (synchronised batch norm), one communicator per replica in each, in
    /// replica order. Their ranks must be consecutive; a group larger than this process's
    /// replicas spans other workers, each with a strategy over its own ranks
    /// ([`multi_worker`](MirroredStrategy::multi_worker) makes them under MPI). The
    /// configuration's collective name is then only reported, not used.
    pub fn with_communicators(
        config: StrategyConfig,
        gradients: Vec<Box<dyn Communicator>>,
        sums: Vec<Box<dyn Communicator>>,
    ) -> Result<MirroredStrategy> {
        if config.replicas == 0 {
            return Err(StrategyError::NoReplicas(0));
        }
        let first = gradients.first().map_or(0, |c| c.rank());
        let world = gradients.first().map_or(0, |c| c.world_size());
        for (what, group) in [("gradient", &gradients), ("sums", &sums)] {
            let ranks: Vec<usize> = group.iter().map(|c| c.rank()).collect();
            let consecutive = (first..first + config.replicas).collect::<Vec<_>>();
            if ranks != consecutive || group.iter().any(|c| c.world_size() != world) {
                return Err(StrategyError::Invalid(format!(
                    "the {what} group's communicators hold ranks {ranks:?} of groups of {:?}: \
                     a strategy of {} replicas needs ranks {consecutive:?} of one group",
                    group.iter().map(|c| c.world_size()).collect::<Vec<_>>(),
                    config.replicas
                )));
            }
        }
        // In deterministic mode, synchronised batch norm sums over micro-batches.
        let (sums, micro_sums): (Vec<Arc<dyn LinearMap>>, _) = match config.deterministic {
            Some(_) => {
                let micro: Vec<_> = sums
                    .into_iter()
                    .map(|c| Arc::new(MicroBatchSums::new(c)))
                    .collect();
                let maps = micro.iter().map(|m| m.clone() as Arc<dyn LinearMap>);
                (maps.collect(), micro)
            }
            None => {
                let maps = sums
                    .into_iter()
                    .map(|c| Arc::new(CrossReplicaSum::new(c)) as Arc<dyn LinearMap>);
                (maps.collect(), Vec::new())
            }
        };
        if config.bucket_bytes == 0 {
            return Err(StrategyError::Invalid(
                "the gradient bucket size must be at least 1 byte".into(),
            ));
        }
        if let Some(d) = config.gradient_dtype.filter(|d| !d.is_float()) {
            return Err(StrategyError::Invalid(format!(
                "gradients are all-reduced in a float dtype (bf16, f16, f32, f64), not {d}"
            )));
        }
        check_deterministic(&config)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads_per_replica = config
            .threads_per_replica
            .unwrap_or((cores / config.replicas).max(1));
        let devices = (0..config.replicas).map(|r| config.device(r)).collect();
        let pool = ReplicaPool::spawn(gradients, devices, threads_per_replica)?;
        Ok(MirroredStrategy {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pool,
            world,
            first,
            sums,
            micro_sums,
            config,
            threads_per_replica,
        })
    }

    /// The number of replicas that train in sync, in every worker (TensorFlow's
    /// `num_replicas_in_sync`).
    pub fn num_replicas_in_sync(&self) -> usize {
        self.world
    }

    /// The replicas this process runs (all of them, unless the group spans workers).
    pub fn local_replicas(&self) -> usize {
        self.pool.len()
    }

    /// The id in the whole group of this process's replica `r`
    /// ([`ReplicaContext::global_replica_id`]).
    pub fn global_replica_id(&self, r: usize) -> usize {
        self.first + r
    }

    /// True when the replicas in sync span several workers (processes).
    pub fn is_multi_worker(&self) -> bool {
        self.world > self.pool.len()
    }

    /// Replica `r`'s device.
    pub fn device(&self, r: usize) -> Device {
        self.config.device(r)
    }

    /// The collective backend's name.
    pub fn collective(&self) -> &str {
        &self.config.collective
    }

    /// The gradient bucket size in bytes.
    pub fn bucket_bytes(&self) -> usize {
        self.config.bucket_bytes
    }

    /// The dtype float gradients are all-reduced in, if not their own.
    pub fn gradient_dtype(&self) -> Option<DType> {
        self.config.gradient_dtype
    }

    /// Deterministic mode's micro-batch size (`None`: the default mode).
    pub fn deterministic(&self) -> Option<usize> {
        self.config.deterministic
    }

    /// Replica `r`'s sums over every micro-batch of a deterministic step (synchronised
    /// batch norm's, [`cross_replica_sum`](MirroredStrategy::cross_replica_sum) in
    /// deterministic mode); `None` in the default mode.
    pub fn micro_batch_sums(&self, r: usize) -> Option<&Arc<MicroBatchSums>> {
        self.micro_sums.get(r)
    }

    /// Kernel threads each replica computes with.
    pub fn threads_per_replica(&self) -> usize {
        self.threads_per_replica
    }

    /// Replica `r`'s sum across all replicas, for layers that synchronise statistics in a
    /// step (synchronised batch norm); [`MirroredStrategy::mirror`] gives it to each copy.
    pub fn cross_replica_sum(&self, r: usize) -> Arc<dyn LinearMap> {
        self.sums[r].clone()
    }

    /// Run `f` with this strategy's variable scope entered: models built inside are
    /// mirrored (TensorFlow's `with strategy.scope():`).
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        mirra_nn::scope::enter(self.id, f)
    }

    /// An error unless `net`'s variables were created inside this strategy's scope.
    pub fn check_scope(&self, net: &Network) -> Result<()> {
        if net.variable_scope() == Some(self.id) {
            return Ok(());
        }
        let names = net.param_names();
        let mut listed = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
        if names.len() > 3 {
            listed.push_str(", ...");
        }
        Err(StrategyError::OutsideScope {
            names: listed,
            where_: if net.variable_scope().is_some() {
                "in another strategy's scope"
            } else {
                "outside the strategy's scope"
            },
        })
    }

    /// One copy of `net` per replica of this process, each on its replica's device and with its
    /// replica's [`cross_replica_sum`](MirroredStrategy::cross_replica_sum): replica 0's
    /// is `net` itself (moved to replica 0's device) and every other replica's variables
    /// (weights and state) are received from it by broadcast, so all start bitwise
    /// identical. `net` must have been built inside [`scope`](MirroredStrategy::scope).
    pub fn mirror(&self, mut net: Network) -> Result<Vec<Network>> {
        self.check_scope(&net)?;
        let n = self.local_replicas();
        let invalid = |e: mirra_nn::NnError| StrategyError::Invalid(e.to_string());
        net.to_device(self.device(0)).map_err(invalid)?;
        let mut copies = Vec::with_capacity(n);
        for r in 1..n {
            let mut c = net.clone();
            c.to_device(self.device(r)).map_err(invalid)?;
            let fresh: std::result::Result<Vec<Tensor>, _> =
                c.weights().iter().map(Tensor::zeros_like).collect();
            c.set_weights(fresh?).map_err(invalid)?;
            copies.push(c);
        }
        copies.insert(0, net);
        for (r, c) in copies.iter_mut().enumerate() {
            c.set_cross_replica(Some(self.cross_replica_sum(r)));
        }
        let slots: Vec<std::sync::Mutex<&mut Network>> =
            copies.iter_mut().map(std::sync::Mutex::new).collect();
        let results = self.run(|ctx| -> Result<()> {
            let mut net = slots[ctx.replica_id]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for p in net.weights_mut() {
                let mut buf = p
                    .copy()?
                    .into_buffer()
                    .map_err(|_| StrategyError::Invalid("a fresh copy is unshared".into()))?;
                ctx.comm.broadcast(&mut buf, 0)?;
                *p = Tensor::from_buffer(buf, p.dims())?;
            }
            Ok(())
        })?;
        drop(slots);
        results
            .into_values()
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        Ok(copies)
    }

    /// Run `step` on every replica of this process in parallel and return each one's result
    /// (TensorFlow's `strategy.run`). A panicking step is an error naming the replica
    /// (after every other replica has finished its step).
    pub fn run<R: Send>(
        &self,
        step: impl Fn(&ReplicaContext<'_>) -> R + Sync,
    ) -> Result<PerReplica<R>> {
        let n = self.local_replicas();
        let slots: Vec<std::sync::Mutex<Option<R>>> =
            (0..n).map(|_| std::sync::Mutex::new(None)).collect();
        self.pool.run(&|ctx: &ReplicaContext<'_>| {
            let r = step(ctx);
            *slots[ctx.replica_id]
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(r);
        })?;
        Ok(PerReplica(
            slots
                .into_iter()
                .map(|s| {
                    s.into_inner()
                        .unwrap_or_else(|e| e.into_inner())
                        .expect("every replica ran the step")
                })
                .collect(),
        ))
    }

    /// Reduce per-replica scalars across this process's replicas (`Sum` or `Mean`; `Max`, `Min` and
    /// `Product` too), on the calling thread.
    pub fn reduce_scalars(&self, op: ReduceOp, values: &PerReplica<f64>) -> f64 {
        let v = values.values();
        match op {
            ReduceOp::Sum => v.iter().sum(),
            ReduceOp::Mean => v.iter().sum::<f64>() / v.len().max(1) as f64,
            ReduceOp::Max => v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => v.iter().copied().fold(f64::INFINITY, f64::min),
            ReduceOp::Product => v.iter().product(),
        }
    }

    /// Reduce per-replica tensors of one shape across this process's replicas with `Sum` or `Mean`
    /// (TensorFlow's `strategy.reduce`), on the calling thread.
    pub fn reduce(&self, op: ReduceOp, values: &PerReplica<Tensor>) -> Result<Tensor> {
        let v = values.values();
        let Some(first) = v.first() else {
            return Err(StrategyError::Invalid("reduce: no values".into()));
        };
        let mut acc = first.clone();
        for t in &v[1..] {
            acc = acc.add(t)?;
        }
        match op {
            ReduceOp::Sum => Ok(acc),
            ReduceOp::Mean => Ok(acc.affine(1.0 / v.len() as f64, 0.0)?),
            other => Err(StrategyError::Invalid(format!(
                "reduce: tensors are reduced with Sum or Mean, not {other:?}"
            ))),
        }
    }
}

#[cfg(feature = "mpi")]
impl MirroredStrategy {
    /// TensorFlow's `MultiWorkerMirroredStrategy` on MPI: this process is one worker of the
    /// job (`mpirun -np W`), with `config.replicas` replica threads; the replicas in sync
    /// are every worker's, `W x replicas`, worker `w`'s being `w x replicas ..`. Gradients
    /// are reduced hierarchically (`mirra_collectives::Mpi::hierarchical`): within the
    /// worker by `config.collective` (a CPU backend), across workers by MPI over one
    /// buffer per worker, then shared locally. Every worker must ask for the same number
    /// of replicas. Host replicas, or GPU workers:
    /// one replica per process on a CUDA device (`StrategyConfig::devices`
    /// with one device), reduced by NCCL across every process (`Mpi::nccl`: the unique id
    /// broadcast over MPI), never run (no machine with GPUs and MPI has been lent).
    pub fn multi_worker(
        mpi: &mirra_collectives::Mpi,
        config: StrategyConfig,
    ) -> Result<MirroredStrategy> {
        if config.on_cuda() {
            let ordinal = match (config.replicas, config.device(0).cuda_ordinal()) {
                (1, Some(o)) => o,
                _ => {
                    return Err(StrategyError::Invalid(format!(
                        "a multi-worker strategy's GPU workers hold one replica each (one \
                         device per process), not {}",
                        config.replicas
                    )))
                }
            };
            let world = mpi.world_raw();
            let make = || -> Result<Vec<Box<dyn Communicator>>> {
                let comm = mpi
                    .nccl(&world, ordinal, config.collectives.clone())
                    .map_err(StrategyError::Invalid)?;
                Ok(vec![comm])
            };
            let (gradients, sums) = (make()?, make()?);
            return MirroredStrategy::with_communicators(config, gradients, sums);
        }
        let local = config.collective.as_str();
        if !BACKENDS.contains(&local) {
            return Err(StrategyError::Invalid(format!(
                "collective `{local}` cannot reduce within a worker; a multi-worker \
                 strategy's replicas use one of {}",
                BACKENDS.join(", ")
            )));
        }
        mpi.check_threading_multiple()
            .map_err(StrategyError::Invalid)?;
        let world = mpi.world_raw();
        let make = || mpi.hierarchical(&world, local, config.replicas, config.collectives.clone());
        let (gradients, sums) = (make()?, make()?);
        MirroredStrategy::with_communicators(config, gradients, sums)
    }
}

/// One communicator per replica, of the configured backend.
fn group(config: &StrategyConfig) -> Result<Vec<Box<dyn Communicator>>> {
    let name = config.collective.as_str();
    Ok(if config.on_cuda() {
        if BACKENDS.contains(&name) || name == NOOP {
            return Err(StrategyError::Invalid(format!(
                "collective `{name}` moves host buffers; replicas on CUDA devices need one \
                 of {}",
                DEVICE_BACKENDS.join(", ")
            )));
        }
        device_group(name, &config.devices, config.collectives.clone())?
    } else if name == NOOP {
        noop_group(config.replicas)
    } else {
        if DEVICE_BACKENDS.contains(&name) {
            return Err(StrategyError::Invalid(format!(
                "collective `{name}` moves CUDA device buffers; replicas on the host need \
                 one of {}",
                BACKENDS.join(", ")
            )));
        }
        // An unknown name: the collectives crate names the known backends.
        cpu_group(name, config.replicas, config.collectives.clone())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_nn::{Activation, Dense, Flatten};

    fn net() -> Network {
        let mut n = Network::new(vec![
            Box::new(Flatten),
            Box::new(Dense::new(5, Activation::Relu)),
            Box::new(Dense::new(2, Activation::Linear)),
        ]);
        n.build(&[3], 9).unwrap();
        n
    }

    #[test]
    fn run_reduce_and_replica_panics() {
        let s = MirroredStrategy::new(StrategyConfig::cpu(3).with_collective("tree")).unwrap();
        assert_eq!(s.num_replicas_in_sync(), 3);
        assert_eq!(s.collective(), "tree");
        let v = s.run(|ctx| (ctx.replica_id + 1) as f64).unwrap();
        assert_eq!(v.values(), &[1.0, 2.0, 3.0]);
        assert_eq!(s.reduce_scalars(ReduceOp::Sum, &v), 6.0);
        assert_eq!(s.reduce_scalars(ReduceOp::Mean, &v), 2.0);
        let t = s
            .run(|ctx| {
                Tensor::full(
                    &[2],
                    ctx.replica_id as f64,
                    mirra_tensor::DType::F32,
                    mirra_tensor::Device::Cpu,
                )
                .unwrap()
            })
            .unwrap();
        assert_eq!(
            s.reduce(ReduceOp::Mean, &t)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![1.0, 1.0]
        );
        let e = s
            .run(|ctx| {
                if ctx.replica_id == 1 {
                    panic!("bad step");
                }
            })
            .unwrap_err();
        assert_eq!(e.to_string(), "replica 1 panicked: bad step");
        // The replicas survive a panicking step.
        assert_eq!(s.run(|ctx| ctx.num_replicas).unwrap().values(), &[3, 3, 3]);
        // A replica that panics while the others wait for it in a collective fails them
        // at once, not at the deadline (the group is aborted: collectives are over).
        let t = std::time::Instant::now();
        let e = s
            .run(|ctx| {
                if ctx.replica_id == 2 {
                    panic!("mid-step");
                }
                ctx.comm.barrier()
            })
            .unwrap_err();
        assert_eq!(e.to_string(), "replica 2 panicked: mid-step");
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn runs_from_two_threads_take_turns() {
        // Each run all-reduces a value tagged with its caller and its round; if the jobs of
        // two runs interleaved in the replicas' queues, replicas would pair collectives of
        // different runs and the sums would mix the tags (or wait for each other forever).
        let s = MirroredStrategy::new(StrategyConfig::cpu(3).with_collective("ring")).unwrap();
        std::thread::scope(|scope| {
            for caller in 0..2u32 {
                let s = &s;
                scope.spawn(move || {
                    for round in 0..50u32 {
                        let tag = (caller * 1000 + round) as f32;
                        let sums = s
                            .run(|ctx| {
                                let mut b = mirra_device::Buffer::from_slice(
                                    &[tag, ctx.replica_id as f32],
                                    Device::Cpu,
                                )
                                .unwrap();
                                ctx.comm.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                                b.as_slice::<f32>().unwrap().to_vec()
                            })
                            .unwrap();
                        for sum in sums.values() {
                            assert_eq!(sum, &[3.0 * tag, 3.0], "caller {caller} round {round}");
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn a_second_run_starts_after_the_first_has_ended_on_every_replica() {
        // Run A keeps replica 0 busy for 100 ms; the others finish A at once. Run B, called
        // from another thread meanwhile, must not start on any replica before A has ended
        // on all of them (each replica's queue alone would let replica 1 start B early, and
        // B's collectives would then pair with A's on replica 0).
        use std::sync::mpsc::channel;
        use std::time::{Duration, Instant};
        let s = MirroredStrategy::new(StrategyConfig::cpu(3)).unwrap();
        let (started_tx, started_rx) = channel();
        let started_tx = std::sync::Mutex::new(started_tx);
        std::thread::scope(|scope| {
            let a = scope.spawn(|| {
                s.run(|ctx| {
                    if ctx.replica_id == 0 {
                        started_tx.lock().unwrap().send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Instant::now()
                })
                .unwrap()
            });
            started_rx.recv().unwrap();
            let b = s.run(|_| Instant::now()).unwrap();
            let a_end = a.join().unwrap().values().iter().copied().max().unwrap();
            for (replica, b_start) in b.values().iter().enumerate() {
                assert!(
                    *b_start >= a_end,
                    "run B started on replica {replica} during run A"
                );
            }
        });
    }

    #[test]
    fn a_nested_run_is_an_error_not_a_deadlock() {
        let s = MirroredStrategy::new(StrategyConfig::cpu(2)).unwrap();
        let t = std::time::Instant::now();
        let inner = s.run(|_| s.run(|_| ()).map(|_| ())).unwrap();
        for (replica, r) in inner.values().iter().enumerate() {
            let e = r.as_ref().unwrap_err();
            assert!(matches!(e, StrategyError::NestedRun { replica: r } if *r == replica));
            assert!(e.to_string().contains("inside a step"), "{e}");
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        // The strategy still runs.
        assert_eq!(s.run(|ctx| ctx.replica_id).unwrap().values(), &[0, 1]);
    }

    #[test]
    fn replicas_from_a_device_list() {
        let c = StrategyConfig::devices(&[Device::Cpu, Device::Cpu, Device::Cpu]).unwrap();
        assert_eq!(MirroredStrategy::new(c).unwrap().num_replicas_in_sync(), 3);
        // A CUDA device exists only where the driver reports one; host and CUDA replicas
        // do not mix.
        match Device::cuda(0) {
            Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
            Ok(gpu) => {
                let e = StrategyConfig::devices(&[Device::Cpu, gpu])
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("cuda:0"), "{e}");
            }
        }
        assert!(MirroredStrategy::new(StrategyConfig::devices(&[]).unwrap()).is_err());
    }

    #[test]
    fn bad_configurations_are_errors() {
        assert_eq!(
            MirroredStrategy::cpu(0).unwrap_err().to_string(),
            "a mirrored strategy needs at least 1 replica, got 0"
        );
        let e = MirroredStrategy::new(StrategyConfig::cpu(2).with_collective("nccl-ring"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("collective `nccl-ring` moves CUDA device buffers; replicas on the host need one of ring, tree"),
            "{e}"
        );
        let e = MirroredStrategy::new(StrategyConfig::cpu(2).with_collective("rign"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown collectives backend `rign`"), "{e}");
        let mut c = StrategyConfig::cpu(3);
        c.devices = vec![Device::Cpu; 2];
        let e = MirroredStrategy::new(c).unwrap_err().to_string();
        assert!(e.contains("3 replicas but 2 devices"), "{e}");
    }

    #[test]
    fn mirrored_variables_start_identical_and_need_the_scope() {
        let s = MirroredStrategy::cpu(4).unwrap();
        let e = s.mirror(net()).unwrap_err().to_string();
        assert!(
            e.starts_with("the model's variables (dense/kernel, dense/bias, dense_1/kernel, ...) were created outside the strategy's scope"),
            "{e}"
        );
        let other = MirroredStrategy::cpu(2).unwrap();
        let e = s.mirror(other.scope(net)).unwrap_err().to_string();
        assert!(e.contains("in another strategy's scope"), "{e}");

        let original = s.scope(net);
        let want: Vec<Vec<f32>> = original
            .params()
            .iter()
            .map(|p| p.to_vec().unwrap())
            .collect();
        let copies = s.mirror(original).unwrap();
        assert_eq!(copies.len(), 4);
        for c in &copies {
            let got: Vec<Vec<f32>> = c.params().iter().map(|p| p.to_vec().unwrap()).collect();
            assert_eq!(got, want);
        }
        // Independent buffers, not shared ones.
        assert!(!copies[0].params()[0].same_buffer(&copies[1].params()[0]));
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn mirrored_variables_on_a_gpu_start_identical_on_every_replica() {
        let gpu = Device::cuda(0).unwrap();
        let s = MirroredStrategy::new(StrategyConfig::devices(&[gpu; 3]).unwrap()).unwrap();
        assert_eq!(s.collective(), "cuda-ring");
        let original = s.scope(net);
        let want: Vec<Vec<f32>> = original
            .params()
            .iter()
            .map(|p| p.to_vec().unwrap())
            .collect();
        let copies = s.mirror(original).unwrap();
        for c in &copies {
            assert_eq!(c.device(), gpu);
            let got: Vec<Vec<f32>> = c.params().iter().map(|p| p.to_vec().unwrap()).collect();
            assert_eq!(got, want);
        }
        let devices = s.run(|ctx| ctx.device).unwrap();
        assert_eq!(devices.values(), &[gpu; 3]);
        // A host backend cannot move device buffers.
        let e = MirroredStrategy::new(
            StrategyConfig::devices(&[gpu; 2])
                .unwrap()
                .with_collective("ring"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("collective `ring` moves host buffers"), "{e}");
    }
}
