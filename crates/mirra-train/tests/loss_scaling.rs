//! Dynamic loss scaling under the mirrored strategy: a step whose gradients overflow on
//! one replica only is skipped on every replica, the scale halves on every replica, and
//! the replicas stay bitwise identical, as one device does with the same batches.

use std::sync::Arc;

use mirra_nn::loss::SparseCategoricalCrossentropy;
use mirra_nn::{Activation, Dense, Network};
use mirra_optim::{LossScaleOptimizer, Sgd, INITIAL_LOSS_SCALE};
use mirra_strategy::{MirroredStrategy, StrategyConfig};
use mirra_tensor::{Device, Tensor};
use mirra_train::Model;

const BATCH: usize = 8;

fn net() -> Network {
    let mut n = Network::new(vec![
        Box::new(Dense::new(6, Activation::Relu)),
        Box::new(Dense::new(3, Activation::Softmax)),
    ]);
    n.build(&[4], 3).unwrap();
    n
}

fn compile(replicas: Option<usize>) -> Model {
    let opt = Box::new(LossScaleOptimizer::new(Box::new(Sgd::new(0.1))));
    let loss = Box::new(SparseCategoricalCrossentropy::default());
    match replicas {
        None => Model::compile(net(), opt, loss, vec![], 1),
        Some(n) => {
            let config = StrategyConfig::cpu(n).with_threads_per_replica(1);
            let s = Arc::new(MirroredStrategy::new(config).unwrap());
            let built = s.scope(net);
            Model::compile_in(s, built, opt, loss, vec![], 1).unwrap()
        }
    }
}

/// Batch `step`; with `overflow`, its last example (on the last replica's shard) is
/// scaled by 1e37: the forward pass stays finite, but its kernel gradient times the
/// scale of 2^15 passes f32's largest value.
fn batch(step: usize, overflow: bool) -> (Tensor, Tensor) {
    let mut x: Vec<f32> = (0..BATCH * 4)
        .map(|i| ((i + 7 * step) as f32 * 0.61).sin())
        .collect();
    if overflow {
        for v in &mut x[(BATCH - 1) * 4..] {
            *v *= 1e37;
        }
    }
    let y: Vec<i64> = (0..BATCH).map(|i| ((i + step) % 3) as i64).collect();
    (
        Tensor::from_vec(x, &[BATCH, 4], Device::Cpu).unwrap(),
        Tensor::from_vec(y, &[BATCH], Device::Cpu).unwrap(),
    )
}

fn weights(m: &Model) -> Vec<Vec<u32>> {
    m.get_weights()
        .iter()
        .map(|(_, t)| {
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn an_overflow_on_one_replica_skips_the_step_on_every_replica() {
    let mut one = compile(None);
    for replicas in [2, 4] {
        let mut model = compile(Some(replicas));
        let mut reference = compile(None);
        // A finite step, the overflowing one, then a finite one again.
        for (step, overflow) in [(0, false), (1, true), (2, false)] {
            let before = weights(&model);
            let scale = model.optimizer().loss_scale().unwrap();
            let (x, y) = batch(step, overflow);
            model.train_step(x.clone(), &y).unwrap();
            reference.train_step(x, &y).unwrap();
            model.check_replicas_in_sync().unwrap();
            let after_scale = model.optimizer().loss_scale().unwrap();
            if overflow {
                assert_eq!(weights(&model), before, "{replicas} replicas: skipped");
                assert_eq!(after_scale, scale / 2.0, "{replicas} replicas: halved");
            } else {
                assert_ne!(weights(&model), before, "{replicas} replicas: applied");
                assert_eq!(after_scale, scale);
            }
            assert_eq!(reference.optimizer().loss_scale().unwrap(), after_scale);
            assert_eq!(
                model.optimizer().iterations(),
                reference.optimizer().iterations()
            );
        }
        assert_eq!(model.optimizer().iterations(), 2);
        assert_eq!(
            model.optimizer().loss_scale(),
            Some(INITIAL_LOSS_SCALE / 2.0)
        );
        // N replicas follow one device through the skip.
        for (a, b) in model.get_weights().iter().zip(reference.get_weights()) {
            let (a, b) = (a.1.to_vec::<f32>().unwrap(), b.1.to_vec::<f32>().unwrap());
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() <= 1e-6 * (1.0 + q.abs()), "{p} vs {q}");
            }
        }
    }
    // Without the overflowing example nothing is skipped: the skip was the overflow's.
    for step in 0..3 {
        let (x, y) = batch(step, false);
        one.train_step(x, &y).unwrap();
    }
    assert_eq!(one.optimizer().iterations(), 3);
    assert_eq!(one.optimizer().loss_scale(), Some(INITIAL_LOSS_SCALE));
}
