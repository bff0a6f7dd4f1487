//! `mirra train`: the reference recipe on MNIST.

use mirra::device::DType;
use mirra::device::Device;
use mirra::nn::loss::SparseCategoricalCrossentropy;
use std::sync::Arc;

use mirra::data::CLASSES;
use mirra::models::Task;
use mirra::nn::{Accuracy, Metric, Overlap};
use mirra::optim::{scale_lr, Adam, CosineDecay};
use mirra::strategy::{MirroredStrategy, StrategyConfig};
use mirra::train::console::{print_line, stdout_closed, warn};
use mirra::train::{Callback, FitConfig, HistoryFile, Model, ProgbarLogger};

use crate::mpi_job::Job;
use crate::{Failure, LrSchedule, TrainArgs};

/// `mirra train`: one run, restarted from its last checkpoint up to `--max-restarts` times
/// when it fails (torchrun's `--max-restarts`): the strategy and its replicas are rebuilt,
/// and `--resume` continues from the last checkpoint, so the final weights are an
/// uninterrupted run's. Under mpirun the job itself must restart: `mirra launch`.
pub fn run(args: TrainArgs) -> Result<(), Failure> {
    if args.max_restarts > 0 {
        if args.checkpoint_dir.is_none() {
            return Err(Failure::Usage(
                "--max-restarts needs --checkpoint-dir DIR: a restart resumes from the last \
                 checkpoint"
                    .into(),
            ));
        }
        if let Some(job) = crate::mpi_job::detect()? {
            return Err(Failure::Usage(format!(
                "--max-restarts under mpirun (process {} of {}): a failed MPI job ends every \
                 process, so the job restarts, not the process: `mirra launch -np {} \
                 --max-restarts {} -- train ...`",
                job.rank, job.size, job.size, args.max_restarts
            )));
        }
    }
    let mut fault = Fault::from_env()?;
    let mut args = args;
    for restart in 1.. {
        match train(&args, fault.take()) {
            Err(Failure::Run(cause)) if restart <= args.max_restarts => {
                warn(&format!(
                    "mirra train: restart {restart} of {} after: {}; resuming from the last \
                     checkpoint in {}",
                    args.max_restarts,
                    mirra::train::console::one_line(&cause),
                    args.checkpoint_dir
                        .as_deref()
                        .map_or(String::new(), |d| d.display().to_string())
                ));
                args.resume = true;
            }
            other => return other,
        }
    }
    unreachable!("the loop returns")
}

/// `MIRRA_FAULT_AFTER_STEPS=N`: the first attempt of the run fails after N training
/// steps, as a replica or a worker might: what tests of `--max-restarts` and `mirra
/// launch` restart from.
#[derive(Clone, Copy, Debug)]
struct Fault {
    after: usize,
    seen: usize,
}

impl Fault {
    const VAR: &'static str = "MIRRA_FAULT_AFTER_STEPS";

    fn from_env() -> Result<Option<Fault>, Failure> {
        let Ok(v) = std::env::var(Fault::VAR) else {
            return Ok(None);
        };
        let after = v
            .trim()
            .parse::<usize>()
            .map_err(|_| Failure::Usage(format!("{}={v:?}: a number of steps", Fault::VAR)))?;
        Ok(Some(Fault { after, seen: 0 }))
    }
}

impl Callback for Fault {
    fn on_train_batch_end(
        &mut self,
        _step: usize,
        _logs: &mirra::train::Logs,
        _model: &mut Model,
    ) -> mirra::train::Result<()> {
        self.seen += 1;
        if self.seen == self.after {
            return Err(mirra::train::TrainError::Invalid(format!(
                "a fault injected after {} steps ({})",
                self.after,
                Fault::VAR
            )));
        }
        Ok(())
    }
}

/// One attempt of the run (with `fault` injected, if any).
fn train(args: &TrainArgs, fault: Option<Fault>) -> Result<(), Failure> {
    let run_err = |e: &dyn std::fmt::Display| Failure::Run(e.to_string());
    // Under mpirun: one worker of a multi-worker strategy. Rank 0 alone prints and writes.
    let job = crate::mpi_job::detect()?;
    let leader = Job::is_leader(job);
    if !leader {
        mirra::train::console::silence();
    }
    let workers = job.map_or(1, |j| j.size);
    if !mirra::models::MODEL_NAMES.contains(&args.model.as_str()) {
        return Err(Failure::Usage(format!(
            "unknown model '{}' (known: {})",
            args.model,
            mirra::models::MODEL_NAMES.join(", ")
        )));
    }
    if let (Some(replicas), true) = (args.replicas, args.devices().len() > 1) {
        if replicas != args.devices().len() {
            return Err(Failure::Usage(format!(
                "--replicas {replicas} with --device {}: one replica per device of the list \
                 ({} devices)",
                args.device,
                args.devices().len()
            )));
        }
    }
    if job.is_some() && args.devices().iter().any(|d| *d != "cpu") {
        return Err(Failure::Usage(format!(
            "--device {} under mpirun: each worker's replicas are host replicas (--device cpu; \
             GPU workers are not supported yet)",
            args.device
        )));
    }
    let mut devices = Vec::new();
    for d in args.devices() {
        devices.push(match d.strip_prefix("cuda:") {
            None => Device::Cpu,
            Some(ordinal) => {
                let ordinal: usize = ordinal.parse().unwrap_or(usize::MAX);
                // No driver or no such device: one line saying so.
                Device::cuda(ordinal).map_err(|e| Failure::Usage(format!("--device: {e}")))?
            }
        });
    }
    let device = devices[0];
    if args.tf32 && device.is_cpu() {
        return Err(Failure::Usage(
            "--tf32 with --device cpu: TF32 is a CUDA matmul mode; the CPU computes f32 \
             products in f32"
                .into(),
        ));
    }
    mirra::tensor::set_allow_tf32(args.tf32);
    if let Some(e) = mirra::tensor::bf16_matmul_request_error() {
        return Err(Failure::Usage(e));
    }
    if args.micro_batch.is_some() && !args.deterministic {
        return Err(Failure::Usage(
            "--micro-batch without --deterministic: it is deterministic mode's micro-batch \
             size"
                .into(),
        ));
    }
    let replica_count = args.replica_count();
    if args.mirrored() && devices.len() == 1 {
        // --replicas N on one device: N replicas there.
        devices = vec![device; replica_count];
    }
    let mirrored = args.mirrored() || job.is_some();
    if args.collective.is_some() && !mirrored {
        return Err(Failure::Usage(format!(
            "--collective {} with one device: a collective needs replicas (--replicas N, or a \
             list of devices)",
            args.collective_name()
        )));
    }
    if let Some(replicas) = mirrored
        .then_some(replica_count * workers)
        .filter(|&r| r > args.batch_size)
    {
        return Err(Failure::Usage(format!(
            "{} is more than --batch-size {}: every replica needs at least one example of \
             the global batch",
            match job {
                Some(j) => format!(
                    "{replicas} replicas ({} workers x --replicas {replica_count})",
                    j.size
                ),
                None => format!("--replicas {replicas}"),
            },
            args.batch_size
        )));
    }
    // Before anything is loaded or trained: a bad output path fails now (rank 0 alone
    // writes them).
    let _outputs = match leader {
        true => Some(crate::outputs::prepare(args)?),
        false => None,
    };
    if let Some(t) = args.threads {
        mirra::tensor::set_num_threads(t);
    }
    if args.allreduce_dtype != crate::AllReduceDtype::Float32 && !mirrored {
        return Err(Failure::Usage(format!(
            "--allreduce-dtype {} with one device: there is no all-reduce without replicas",
            args.allreduce_dtype.name()
        )));
    }
    if args.ablate_bf16_accumulation {
        if args.precision != crate::Precision::MixedBfloat16 {
            return Err(Failure::Usage(
                "--ablate-bf16-accumulation needs --precision mixed_bfloat16: it changes how \
                 bf16 matrix products accumulate"
                    .into(),
            ));
        }
        mirra::tensor::set_bf16_accumulation_ablation(true);
    }
    // MPI, when this is one worker of a job: held until the strategy is gone.
    let mut _mpi = None;
    let strategy = match mirrored {
        false => None,
        true => {
            let mut config = StrategyConfig::devices(&devices)
                .map_err(|e| Failure::Usage(e.to_string()))?
                .with_collective(&args.collective_name())
                .with_bucket_bytes(((args.bucket_mb * (1 << 20) as f64) as usize).max(1));
            if let Some(t) = args.threads {
                config = config.with_threads_per_replica(t);
            }
            if let Some(dtype) = args.allreduce_dtype.dtype() {
                config = config.with_gradient_dtype(dtype);
            }
            if let Some(micro) = args.deterministic_micro_batch() {
                config = config.with_deterministic(micro);
            }
            let strategy = match job {
                Some(job) => {
                    let (session, strategy) = crate::mpi_job::strategy(job, config)?;
                    _mpi = Some(session);
                    strategy
                }
                None => MirroredStrategy::new(config).map_err(|e| Failure::Usage(e.to_string()))?,
            };
            Some(Arc::new(strategy))
        }
    };
    let lr = if args.scale_lr {
        scale_lr(args.lr, args.batch_size, crate::SCALE_LR_BASE_BATCH)
    } else {
        args.lr
    };
    let task = mirra::models::task(&args.model);
    if task == Task::Synthetic {
        if let Some(dir) = &args.data {
            return Err(Failure::Usage(format!(
                "--data {} with --model {}: it trains on synthetic ImageNet-shaped batches \
                 (224x224x3, 1000 classes), a throughput run",
                dir.display(),
                args.model
            )));
        }
    }
    if args.augment && task != Task::Classification {
        return Err(Failure::Usage(format!(
            "--augment with --model {}: augmentation is for the 28x28 digits of the \
             classifiers (it would move the images but not segmentation masks)",
            args.model
        )));
    }
    // MNIST's files, NumPy arrays or an image folder; without --data, the test set
    // embedded in the binary: no file, no checkout needed.
    let data = crate::data_arg::open(args.data.as_deref())?;
    let mut fresh_canvases = None;
    let data = match task {
        Task::Classification => data,
        Task::Segmentation => {
            if data.folder.is_some() || data.classes > 10 || data.train.pixels.dtype() != DType::U8
            {
                return Err(Failure::Usage(format!(
                    "--model {} draws its canvases from digits: u8 images of 10 classes or \
                     fewer held in memory (MNIST's files or NumPy arrays), not {}",
                    args.model,
                    if data.folder.is_some() {
                        "an image folder (read per batch)".to_string()
                    } else {
                        format!("{} {} classes", data.train.pixels.dtype(), data.classes)
                    }
                )));
            }
            // Canvases of 2-4 digits, half as many as there are digits (volumes: an eighth,
            // each 32 slices); validation canvases from the validation digits. Training
            // draws fresh canvases every epoch after the first (`fresh_canvases`).
            let (op, depth, per) = if args.model == "unet3d" {
                ("digit_volumes", mirra::data::VOLUME_DEPTH, 8)
            } else {
                ("digit_canvases", 1, 2)
            };
            let drawer = |split: &mirra::data::Split| {
                mirra::data::Canvases::new(op, split, depth).map_err(|e| run_err(&e))
            };
            let draw = |drawer: &mirra::data::Canvases, count: usize, seed: u64| {
                drawer.draw(seed, 0..count as u64).map_err(|e| run_err(&e))
            };
            let train_digits = drawer(&data.train)?;
            let train = draw(&train_digits, data.train.len().div_ceil(per), args.seed)?;
            let validation = draw(
                &drawer(&data.validation)?,
                data.validation.len().div_ceil(per),
                args.seed ^ 0x7e57,
            )?;
            fresh_canvases = Some(train_digits);
            crate::data_arg::Data {
                train,
                validation,
                classes: CLASSES,
                folder: None,
            }
        }
        Task::Synthetic => {
            // Four batches to train on, one to validate on: what a step costs.
            let image = mirra::models::input_shape(&args.model);
            let classes = mirra::models::SYNTHETIC_CLASSES;
            let synthetic = |count: usize, salt: u64| {
                mirra::data::synthetic_images(count, &image, classes, args.seed ^ salt)
            };
            crate::data_arg::Data {
                train: synthetic(4 * args.batch_size, 0).map_err(|e| run_err(&e))?,
                validation: synthetic(args.batch_size, 0x7e57).map_err(|e| run_err(&e))?,
                classes,
                folder: None,
            }
        }
    };
    let options = mirra::models::Options {
        sync_batch_norm: args.sync_batch_norm,
        classes: data.classes,
    };
    let mut net = mirra::models::by_name(&args.model, options)
        .ok_or_else(|| Failure::Usage(format!("unknown model '{}'", args.model)))?;
    net.set_policy(args.precision.policy());
    let (train_n, val_n) = (data.train.len(), data.validation.len());
    // Images stay u8 as stored; each batch becomes f32 in [0, 1] as it is formed.
    let train = if let Some(canvases) = fresh_canvases {
        mirra::recipe::fresh_canvas_train_pipeline(
            &data.train,
            canvases,
            args.seed,
            args.batch_size,
            args.seed,
        )
    } else if args.augment {
        let augment = mirra::data::Augment::digits(args.seed);
        mirra::recipe::augmented_train_pipeline(
            &data.train,
            data.examples(),
            args.batch_size,
            args.seed,
            augment,
        )
    } else {
        mirra::recipe::train_pipeline(&data.train, data.examples(), args.batch_size, args.seed)
    }
    .map_err(|e| run_err(&e))?;
    // Validation at the training batch, as Keras's `validation_batch_size` defaults: it
    // then never needs more memory than a training step. (At 256 a U-Net trained at 16
    // held 3 GB of convolution patches while it validated.)
    let validation =
        mirra::recipe::eval_pipeline(&data.validation, data.examples(), args.batch_size)
            .map_err(|e| run_err(&e))?;

    // Under a strategy the model is built in its scope, so its variables are mirrored.
    let input = mirra::models::input_shape(&args.model);
    match &strategy {
        Some(s) => s.scope(|| net.build(&input, args.seed)),
        None => net.build(&input, args.seed),
    }
    .map_err(|e| run_err(&e))?;
    let replica_local = net
        .state_roles()
        .iter()
        .position(|r| *r == mirra::nn::Role::ReplicaLocal);
    if let (true, Some(i)) = (args.deterministic, replica_local) {
        return Err(Failure::Usage(format!(
            "--deterministic with --model {}: its batch normalization (`{}`) keeps statistics \
             per replica; add --sync-batch-norm, whose statistics are the global batch's",
            args.model,
            net.state_names()[i]
        )));
    }
    net.to_device(device).map_err(|e| run_err(&e))?;
    let placement = match &strategy {
        Some(s) if !device.is_cpu() => format!(
            "{} replicas in sync on {}, collective {}, {} per replica",
            s.num_replicas_in_sync(),
            devices
                .iter()
                .map(Device::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            s.collective(),
            args.batch_size.div_ceil(s.num_replicas_in_sync()),
        ),
        Some(s) if s.is_multi_worker() => format!(
            "{} replicas in sync: {workers} workers (MPI processes) x {}, collective {} \
             within a worker and mpi across, {} threads each, {} per replica",
            s.num_replicas_in_sync(),
            s.local_replicas(),
            s.collective(),
            s.threads_per_replica(),
            args.batch_size.div_ceil(s.num_replicas_in_sync()),
        ),
        Some(s) if s.deterministic().is_some() => {
            let micro = s.deterministic().unwrap_or(1);
            let plan = mirra::strategy::MicroBatches::new(
                micro,
                args.batch_size,
                s.num_replicas_in_sync(),
            )
            .map_err(|e| Failure::Usage(e.to_string()))?;
            format!(
                "{} replicas in sync, collective {}, {} threads each, deterministic: \
                 micro-batches of {micro}, {} per replica",
                s.num_replicas_in_sync(),
                s.collective(),
                s.threads_per_replica(),
                plan.examples(0).len(),
            )
        }
        Some(s) => format!(
            "{} replicas in sync, collective {}, {} threads each, {} per replica",
            s.num_replicas_in_sync(),
            s.collective(),
            s.threads_per_replica(),
            args.batch_size.div_ceil(s.num_replicas_in_sync()),
        ),
        None if !device.is_cpu() => format!("one device, {device}"),
        None => format!("one device, {} threads", mirra::tensor::num_threads()),
    };
    print_line(&format!(
        "Training {} ({} parameters) on {train_n} samples, validating on {val_n}; global batch \
         {}, Adam(lr={lr}{}), {} epochs, seed {}{}; {placement}",
        args.model,
        net.num_params(),
        args.batch_size,
        if args.scale_lr {
            format!(
                " = {} x {}/{}",
                args.lr,
                args.batch_size,
                crate::SCALE_LR_BASE_BATCH
            )
        } else {
            String::new()
        },
        args.epochs,
        args.seed,
        match args.precision {
            crate::Precision::Float32 => String::new(),
            p if args.ablate_bf16_accumulation => format!(
                ", precision {} (ABLATION: bf16 products accumulated in bf16)",
                p.policy()
            ),
            crate::Precision::MixedBfloat16 if device.is_cpu() => format!(
                ", precision mixed_bfloat16 (bf16 products: {})",
                mirra::tensor::bf16_matmul_path()
            ),
            p => format!(", precision {}", p.policy()),
        },
    ));
    let optimizer = match args.lr_schedule {
        LrSchedule::Constant => Box::new(Adam::new(lr)),
        LrSchedule::Cosine => {
            let steps = (train_n.div_ceil(args.batch_size) * args.epochs) as u64;
            let cosine = CosineDecay::new(lr, steps, 0.0).map_err(|e| run_err(&e))?;
            Box::new(Adam::new(lr).with_schedule(Box::new(cosine)))
        }
    };
    let optimizer = mirra::recipe::optimizer_for(args.precision.policy(), optimizer);
    let loss = Box::new(SparseCategoricalCrossentropy::default());
    let metrics: Vec<Box<dyn Metric>> = match task {
        Task::Classification | Task::Synthetic => vec![Box::new(Accuracy::new())],
        // Pixel accuracy, and the overlap of each digit class's mask (the background
        // left out of the means): History keys `val_mean_iou` and `val_dice`.
        Task::Segmentation => vec![
            Box::new(Accuracy::new()),
            Box::new(Overlap::mean_iou(CLASSES, &[0])),
            Box::new(Overlap::dice(CLASSES, &[0])),
        ],
    };
    let mut model = match strategy {
        Some(s) => Model::compile_in(s, net, optimizer, loss, metrics, args.seed)
            .map_err(|e| run_err(&e))?,
        None => Model::compile(net, optimizer, loss, metrics, args.seed),
    };
    // Every worker computes the same logs; rank 0 alone shows and writes them.
    let mut callbacks: Vec<Box<dyn Callback>> = Vec::new();
    if leader {
        callbacks.push(Box::new(ProgbarLogger::new()));
    }
    if let (Some(dir), true) = (&args.logdir, leader) {
        callbacks.push(Box::new(mirra::train::TensorBoard::new(dir)));
    }
    let initial_epoch = crate::resume::setup(args, &mut model, &mut callbacks, leader)?;
    if let Some(fault) = fault {
        callbacks.push(Box::new(fault));
    }
    if let (Some(path), true) = (&args.history, leader) {
        callbacks.push(Box::new(HistoryFile::new(path)));
    }
    let config = FitConfig {
        epochs: args.epochs,
        initial_epoch,
    };
    if stdout_closed() {
        warn("mirra train: standard output is closed: nothing trained");
        return Ok(());
    }
    let trace = args.trace.as_ref().filter(|_| leader);
    if trace.is_some() {
        mirra::device::trace::start();
    }
    let fitted = model.fit(&train, Some(&validation), &config, &mut callbacks);
    if let Some(path) = trace {
        // Written whether training ended well or not: a trace of a failure shows it too.
        let trace = mirra::device::trace::stop();
        let mut bytes = Vec::new();
        trace
            .write_json(&mut bytes)
            .and_then(|()| {
                mirra::train::fsutil::write_atomic(path, &bytes).map_err(std::io::Error::other)
            })
            .map_err(|e| Failure::Run(format!("--trace {}: {e}", path.display())))?;
        print_line(&format!(
            "Trace of {} spans written to {} (open it in chrome://tracing or ui.perfetto.dev)",
            trace.events.len(),
            path.display()
        ));
    }
    let history = fitted.map_err(|e| run_err(&e))?;
    if let Some(mib) = mirra::device::memory::peak_resident_mib() {
        let on_device = match mirra::device::memory::peak_device_mib(device) {
            Some(d) => format!(", {device} {d:.1} MiB (tensors' peak)"),
            None => String::new(),
        };
        print_line(&format!(
            "Peak memory: host {mib:.1} MiB (resident){on_device}"
        ));
    }
    if stdout_closed() {
        let done = history.epochs.last().map_or(initial_epoch, |e| e + 1);
        let resume = match &args.checkpoint_dir {
            Some(_) if done < args.epochs => " (--resume continues the run)",
            _ => "",
        };
        warn(&format!(
            "mirra train: standard output was closed: stopped after epoch {done} of {}, its \
             outputs saved{resume}",
            args.epochs
        ));
    }
    Ok(())
}
