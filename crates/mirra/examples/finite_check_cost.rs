//! What the scan of every weight for NaN and infinities (`Model::first_non_finite_weight`)
//! costs against a training step, for the MNIST MLP at batch 256 on the bundled data (the
//! reference recipe of `mirra train`). `fit` checks the loss after every step (free) and
//! scans the weights once per epoch and whenever the loss is not finite; this measures
//! what a scan after every step would cost instead.
//!
//! ```sh
//! cargo run --release -p mirra --example finite_check_cost [-- STEPS]
//! ```
//!
//! Prints the median and fastest time of a step and of a scan over the same steps, their
//! ratio, and the ratio per epoch (one scan per epoch of the bundled training split).

use std::time::Instant;

use mirra::data::{pixels_to_unit_f32, Dataset, Mnist};
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::nn::{Accuracy, Metric};
use mirra::optim::Adam;
use mirra::train::Model;

const BATCH: usize = 256;
const WARMUP: usize = 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 300,
    };
    let mnist = Mnist::bundled()?;
    let train = Dataset::from_tensor_slices(vec![mnist.train.pixels, mnist.train.labels])?
        .shuffle(60_000, 1)
        .batch(BATCH, true)
        .map(pixels_to_unit_f32);
    let mut net = mirra::models::mlp();
    net.build(&[28, 28], 1)?;
    let metrics: Vec<Box<dyn Metric>> = vec![Box::new(Accuracy::new())];
    let mut model = Model::compile(
        net,
        Box::new(Adam::new(1e-3)),
        Box::new(SparseCategoricalCrossentropy::default()),
        metrics,
        1,
    );
    let (mut step_secs, mut scan_secs) = (vec![], vec![]);
    let mut epoch = 0;
    while step_secs.len() < WARMUP + steps {
        for batch in train.iter_epoch(epoch)? {
            let mut batch = batch?.into_iter();
            let (x, y) = (batch.next().unwrap(), batch.next().unwrap());
            let t = Instant::now();
            model.train_step(x, &y)?;
            step_secs.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let hit = model.first_non_finite_weight()?;
            scan_secs.push(t.elapsed().as_secs_f64());
            assert!(hit.is_none(), "a weight is not finite: {hit:?}");
            if step_secs.len() == WARMUP + steps {
                break;
            }
        }
        epoch += 1;
    }
    // The warm-up steps (buffers allocated, caches filled) are left out.
    let (step_secs, scan_secs) = (step_secs.split_off(WARMUP), scan_secs.split_off(WARMUP));
    let steps_per_epoch = train.cardinality().unwrap_or(1).max(1);
    let params: usize = model
        .get_weights()
        .iter()
        .map(|(_, w)| w.elem_count())
        .sum();
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (fastest_step, fastest_scan) = (min(&step_secs), min(&scan_secs));
    let (step, scan) = (median(step_secs), median(scan_secs));
    println!(
        "MLP, batch {BATCH}, {} threads, {steps} steps: median step {:.1} us, median scan of \
         {params} weights {:.2} us = {:.3}% of a step",
        mirra::tensor::num_threads(),
        step * 1e6,
        scan * 1e6,
        100.0 * scan / step
    );
    println!(
        "fastest step {:.1} us, fastest scan {:.2} us = {:.3}% of the fastest step",
        fastest_step * 1e6,
        fastest_scan * 1e6,
        100.0 * fastest_scan / fastest_step
    );
    println!(
        "one scan per epoch of {steps_per_epoch} steps (what fit does): {:.4}% of the \
         epoch's steps",
        100.0 * scan / (step * steps_per_epoch as f64)
    );
    Ok(())
}
