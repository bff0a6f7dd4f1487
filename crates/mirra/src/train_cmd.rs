//! `mirra train`: the reference recipe on MNIST.

use mirra::data::{Dataset, Mnist};
use mirra::nn::loss::SparseCategoricalCrossentropy;
use mirra::nn::Accuracy;
use mirra::optim::Adam;
use mirra::train::{Callback, FitConfig, Model, ProgbarLogger};

use crate::{Failure, TrainArgs};

/// Shuffle buffer: the whole training split, a uniform permutation per epoch.
const SHUFFLE_BUFFER: usize = 60_000;
/// Batches prepared ahead of the training step on a background thread.
const PREFETCH: usize = 2;

pub fn run(args: TrainArgs) -> Result<(), Failure> {
    let run_err = |e: &dyn std::fmt::Display| Failure::Run(e.to_string());
    let Some(mut net) = mirra::models::by_name(&args.model) else {
        return Err(Failure::Usage(format!(
            "unknown model '{}' (known: {})",
            args.model,
            mirra::models::MODEL_NAMES.join(", ")
        )));
    };
    if let Some(t) = args.threads {
        mirra::tensor::set_num_threads(t);
    }
    let dir = args.data.clone().unwrap_or_else(mirra::data::bundled_dir);
    if !dir.is_dir() {
        return Err(Failure::Usage(format!(
            "data directory '{}' does not exist",
            dir.display()
        )));
    }
    let mnist = Mnist::load(&dir).map_err(|e| Failure::Usage(e.to_string()))?;
    let (train_n, val_n) = (mnist.train.len(), mnist.validation.len());
    let train = Dataset::from_tensor_slices(vec![mnist.train.images, mnist.train.labels])
        .map_err(|e| run_err(&e))?
        .shuffle(SHUFFLE_BUFFER, args.seed)
        .batch(args.batch_size, false)
        .prefetch(PREFETCH);
    let validation =
        Dataset::from_tensor_slices(vec![mnist.validation.images, mnist.validation.labels])
            .map_err(|e| run_err(&e))?
            .batch(args.batch_size.max(256), false)
            .prefetch(PREFETCH);

    net.build(&[28, 28], args.seed).map_err(|e| run_err(&e))?;
    println!(
        "Training {} ({} parameters) on {train_n} samples, validating on {val_n}; batch {}, \
         Adam(lr={}), {} epochs, seed {}, {} threads",
        args.model,
        net.num_params(),
        args.batch_size,
        args.lr,
        args.epochs,
        args.seed,
        mirra::tensor::num_threads(),
    );
    let optimizer = Adam::new(args.lr);
    let mut model = Model::compile(
        net,
        Box::new(optimizer),
        Box::new(SparseCategoricalCrossentropy::default()),
        vec![Box::new(Accuracy::new())],
        args.seed,
    );
    let mut callbacks: Vec<Box<dyn Callback>> = vec![Box::new(ProgbarLogger::new())];
    let config = FitConfig {
        epochs: args.epochs,
        initial_epoch: 0,
    };
    let history = model
        .fit(&train, Some(&validation), &config, &mut callbacks)
        .map_err(|e| run_err(&e))?;
    if let Some(path) = &args.history {
        history.save_json(path).map_err(|e| run_err(&e))?;
    }
    Ok(())
}
