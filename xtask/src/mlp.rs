//! Training throughput of the MNIST MLP (`mirra::models::mlp`: Flatten -> Dense(128,
//! relu) -> Dense(64, relu) -> Dense(10, softmax), Adam 1e-3, sparse categorical
//! cross-entropy) on synthetic batches, and the buffer allocations of a warmed-up step.

use std::collections::BTreeMap;
use std::sync::Arc;

use mirra::device::pool_stats;
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::nn::{Accuracy, Metric};
use mirra::optim::Adam;
use mirra::strategy::MirroredStrategy;
use mirra::tensor::init::{rng, Initializer};
use mirra::tensor::{set_num_threads, DType, Device, Tensor};
use mirra::train::Model;

use crate::timing::{measure as time, Plan};

/// Seed of the weights and the synthetic data.
const SEED: u64 = 42;
/// Distinct synthetic batches, cycled (a dataset's worth of variety is not needed to
/// measure throughput; a few keep the step from seeing one batch only).
const DISTINCT_BATCHES: usize = 4;
/// Steps over which pool misses are counted after warm-up.
const COUNTED_STEPS: u64 = 20;

/// Throughput at one batch size.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    /// Training samples per second (median over the repeats).
    pub samples_per_sec: f64,
    /// Buffer-pool misses (allocations) per step after warm-up.
    pub allocations_per_step: f64,
    /// Buffer requests per step (pool hits and misses): shows that the counter counts.
    pub buffer_requests_per_step: f64,
}

/// Samples/s and buffer allocations per step at each batch size, with `threads` kernel
/// threads.
pub fn measure(
    batches: &[usize],
    threads: usize,
    plan: Plan,
) -> Result<BTreeMap<usize, Throughput>, String> {
    set_num_threads(threads);
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut out = BTreeMap::new();
    for &batch in batches {
        let mut model = compile(None)?;
        let data = synthetic_batches(batch)?;
        let mut i = 0usize;
        let mut step = || -> Result<(), String> {
            let (x, y) = &data[i % data.len()];
            i += 1;
            model.train_step(x.clone(), y).map_err(|e| err(&e))?;
            Ok(())
        };
        let samples = time(plan, &mut step)?;
        let before = pool_stats();
        for _ in 0..COUNTED_STEPS {
            step()?;
        }
        let after = pool_stats();
        let misses = after.misses - before.misses;
        let requests = misses + (after.hits - before.hits);
        out.insert(
            batch,
            Throughput {
                samples_per_sec: batch as f64 / samples.median(),
                allocations_per_step: misses as f64 / COUNTED_STEPS as f64,
                buffer_requests_per_step: requests as f64 / COUNTED_STEPS as f64,
            },
        );
    }
    Ok(out)
}

/// The benchmarked MLP, compiled for one device or, built in its scope, for a strategy.
pub fn compile(strategy: Option<Arc<MirroredStrategy>>) -> Result<Model, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let build = || {
        let mut net = mirra::models::mlp();
        net.build(&[28, 28], SEED).map(|()| net)
    };
    let opt = Box::new(Adam::new(1e-3));
    let loss = Box::new(SparseCategoricalCrossentropy::default());
    let metrics: Vec<Box<dyn Metric>> = vec![Box::new(Accuracy::new())];
    match strategy {
        None => Ok(Model::compile(
            build().map_err(|e| err(&e))?,
            opt,
            loss,
            metrics,
            SEED,
        )),
        Some(s) => {
            let net = s.scope(build).map_err(|e| err(&e))?;
            Model::compile_in(s, net, opt, loss, metrics, SEED).map_err(|e| err(&e))
        }
    }
}

/// A few distinct synthetic MNIST-shaped batches of `batch` examples, to cycle through.
pub fn synthetic_batches(batch: usize) -> Result<Vec<(Tensor, Tensor)>, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    (0..DISTINCT_BATCHES as u64)
        .map(|i| {
            let x = Initializer::Uniform {
                low: 0.0,
                high: 1.0,
            }
            .init(
                &[batch, 28, 28],
                DType::F32,
                Device::Cpu,
                &mut rng(SEED + i),
            )
            .map_err(|e| err(&e))?;
            let y = Tensor::from_vec(labels(batch, 10, SEED + i), &[batch], Device::Cpu)
                .map_err(|e| err(&e))?;
            Ok((x, y))
        })
        .collect()
}

/// `n` class labels in `0..classes` from a 64-bit linear congruential generator (the
/// labels only need to be valid, not good random numbers).
fn labels(n: usize, classes: u64, seed: u64) -> Vec<i64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % classes) as i64
        })
        .collect()
}
