//! How fast the input pipeline batches MNIST: `cargo run --release -p mirra-data
//! --example batch_throughput`. The training loop needs well over 180,000 samples/s; the
//! index-gathering path should give millions.

use std::time::{Duration, Instant};

use mirra_data::{pixels_to_unit_f32, Dataset, Mnist};

fn measure(
    name: &str,
    ds: &Dataset,
    epochs: u64,
    step: Duration,
) -> Result<(), mirra_data::DataError> {
    // One warm-up epoch fills the buffer pool.
    for b in ds.iter_epoch(0)? {
        b?;
    }
    let start = Instant::now();
    let mut samples = 0;
    for epoch in 1..=epochs {
        for b in ds.iter_epoch(epoch)? {
            samples += b?[1].dims()[0];
            let t = Instant::now();
            while t.elapsed() < step {
                std::hint::spin_loop();
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{name:<40} {:>6.2} M samples/s ({samples} samples in {secs:.3} s)",
        samples as f64 / secs / 1e6
    );
    Ok(())
}

fn main() -> Result<(), mirra_data::DataError> {
    let mnist = Mnist::bundled()?;
    let (x, y) = (mnist.train.pixels, mnist.train.labels);
    let slices = Dataset::from_tensor_slices(vec![x, y])?;
    // The CLI's pipeline: u8 pixels gathered per batch, then converted to f32.
    let gathered = slices
        .clone()
        .shuffle(10_000, 1)
        .batch(256, false)
        .map(pixels_to_unit_f32);
    let none = Duration::ZERO;
    measure(
        "slices -> shuffle -> batch(256) -> to f32",
        &gathered,
        50,
        none,
    )?;
    measure(
        "... -> prefetch(2)",
        &gathered.clone().prefetch(2),
        50,
        none,
    )?;
    let per_example = slices
        .shuffle(10_000, 1)
        .map(Ok)
        .batch(256, false)
        .map(pixels_to_unit_f32);
    measure(
        "slices -> shuffle -> map -> batch(256)",
        &per_example,
        5,
        none,
    )?;
    // With a simulated 1 ms training step per batch (a 256,000 samples/s model), the
    // pipeline's cost shows as the shortfall from that rate.
    let step = Duration::from_millis(1);
    measure("batch(256), 1 ms step", &gathered, 10, step)?;
    let ahead = gathered.prefetch(2);
    measure("batch(256) -> prefetch(2), 1 ms step", &ahead, 10, step)?;
    Ok(())
}
