//! A compiled model: network, optimizer, loss and metrics, with Keras's `fit`,
//! `evaluate` and `predict`.

use std::sync::Arc;
use std::time::Instant;

use mirra_autograd::Tape;
use mirra_data::Dataset;
use mirra_device::trace;
use mirra_nn::{Examples, Loss, Mean, Metric, ModelOutput, Network, Reduction};
use mirra_optim::Optimizer;
use mirra_strategy::MirroredStrategy;
use mirra_tensor::init::{rng, Rng};
use mirra_tensor::{DType, Device, Tensor};
use rand::RngExt as _;

use crate::replicas::{scaled_loss, CommStats, Mirrors, Primary};
use crate::rng_state::RngState;
use crate::{History, Logs, Result, TrainError};

/// How `fit` runs.
#[derive(Clone, Debug)]
pub struct FitConfig {
    /// The epoch to stop after (1-based count, as Keras's `epochs`).
    pub epochs: usize,
    /// The epoch to start from (0-based; for resumed runs).
    pub initial_epoch: usize,
}

impl Default for FitConfig {
    fn default() -> Self {
        FitConfig {
            epochs: 1,
            initial_epoch: 0,
        }
    }
}

/// A network with its optimizer, loss and metrics (Keras's compiled `Model`).
pub struct Model {
    net: Network,
    optimizer: Box<dyn Optimizer>,
    loss: Box<dyn Loss>,
    metrics: Vec<Box<dyn Metric>>,
    tape: Tape,
    rng: Rng,
    grads: Vec<Tensor>,
    /// Every epoch trained so far, restored with a checkpoint.
    history: History,
    /// Replicas `1..n` under a distribution strategy (the fields above are replica 0).
    mirrors: Option<Mirrors>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("net", &self.net)
            .field("optimizer", &self.optimizer.name())
            .field("loss", &self.loss.name())
            .finish()
    }
}

/// What a callback learns when training starts.
#[derive(Clone, Debug, Default)]
pub struct TrainInfo {
    /// Epochs to run (the last epoch's number, 1-based).
    pub epochs: usize,
    /// The first epoch to run (0-based; non-zero when resuming).
    pub initial_epoch: usize,
    /// Steps per epoch, when the dataset knows its length.
    pub steps_per_epoch: Option<usize>,
}

/// Whether training goes on after an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Go on.
    Continue,
    /// Stop after this epoch (as Keras's `model.stop_training = True`).
    Stop,
}

/// A hook into `fit`. Every method has a default that does nothing.
///
/// Like Keras's `callback.model`, every hook gets the model being trained: a callback may
/// read or replace its weights ([`Model::get_weights`], [`Model::set_weights`]), its
/// optimizer's learning rate, or save it. Under a distribution strategy the model's
/// methods act on every replica, so callbacks need not know about replicas.
pub trait Callback: Send {
    /// Before the first epoch.
    fn on_train_begin(&mut self, _info: &TrainInfo, _model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// Before each epoch (0-based).
    fn on_epoch_begin(&mut self, _epoch: usize, _model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// After each training step, with the running means of the epoch so far.
    fn on_train_batch_end(&mut self, _step: usize, _logs: &Logs, _model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// After each epoch's training and validation, before any callback's
    /// [`Callback::on_epoch_end`] and before the History records the logs: add entries to
    /// the epoch's logs, as a Keras callback writes into the shared `logs` dict (the
    /// [`LearningRateScheduler`](crate::LearningRateScheduler) adds `learning_rate`).
    fn on_epoch_logs(&mut self, _epoch: usize, _logs: &mut Logs, _model: &mut Model) -> Result<()> {
        Ok(())
    }
    /// After each epoch, with its final logs (training and validation).
    fn on_epoch_end(&mut self, _epoch: usize, _logs: &Logs, _model: &mut Model) -> Result<Control> {
        Ok(Control::Continue)
    }
    /// After the last epoch.
    fn on_train_end(&mut self, _logs: &Logs, _model: &mut Model) -> Result<()> {
        Ok(())
    }
}

/// What one training step produced.
#[derive(Debug)]
pub struct StepOutput {
    /// The batch's mean loss.
    pub loss: f64,
    /// The model's output for the batch (for metrics).
    pub output: Tensor,
}

impl Model {
    /// Compile a built network with an optimizer, a loss and metrics. `seed` drives
    /// training-time randomness (dropout).
    pub fn compile(
        net: Network,
        optimizer: Box<dyn Optimizer>,
        loss: Box<dyn Loss>,
        metrics: Vec<Box<dyn Metric>>,
        seed: u64,
    ) -> Model {
        Model {
            net,
            optimizer,
            loss,
            metrics,
            tape: Tape::new(),
            rng: rng(seed),
            grads: vec![],
            history: History::default(),
            mirrors: None,
        }
    }

    /// Compile a network for training under a distribution strategy (Keras's
    /// `model.compile` inside `strategy.scope()`): the network must have been built
    /// inside [`MirroredStrategy::scope`], and is mirrored on every replica, each
    /// starting from replica 0's weights by broadcast and with its own copy of the
    /// optimizer. `fit`, `evaluate` and `predict` then need no change: each training
    /// step splits the global batch among the replicas and all-reduces the gradients.
    pub fn compile_in(
        strategy: Arc<MirroredStrategy>,
        net: Network,
        optimizer: Box<dyn Optimizer>,
        loss: Box<dyn Loss>,
        metrics: Vec<Box<dyn Metric>>,
        seed: u64,
    ) -> Result<Model> {
        let (net, mirrors) = Mirrors::new(strategy, net, optimizer.as_ref())?;
        let mut model = Model::compile(net, optimizer, loss, metrics, seed);
        model.mirrors = Some(mirrors);
        Ok(model)
    }

    /// How much of the distributed training steps since the last call went to waiting
    /// on gradient all-reduces that backward did not hide (`None` without a strategy).
    /// Resets the count.
    pub fn comm_stats(&mut self) -> Option<CommStats> {
        self.mirrors.as_mut().map(Mirrors::take_stats)
    }

    /// The distribution strategy the model trains under, if any.
    pub fn strategy(&self) -> Option<&Arc<MirroredStrategy>> {
        self.mirrors.as_ref().map(|m| &m.strategy)
    }

    /// Synchronise gradients every `steps` training steps only, accumulating them
    /// locally in between (DDP's `no_sync`): `steps` micro-batches make one update of
    /// their combined batch. Needs a distribution strategy (use one replica for a single
    /// device); 1 (the default) updates at every step.
    ///
    /// The local accumulation is not part of a checkpoint: with checkpoints at epoch ends,
    /// choose `steps` dividing the steps of an epoch.
    pub fn set_accumulation_steps(&mut self, steps: usize) -> Result<()> {
        match (&mut self.mirrors, steps) {
            (_, 0) => Err(TrainError::Invalid(
                "gradient accumulation needs at least 1 step".into(),
            )),
            (Some(m), _) => {
                m.accumulation = steps;
                Ok(())
            }
            (None, 1) => Ok(()),
            (None, _) => Err(TrainError::Invalid(
                "gradient accumulation runs under a distribution strategy; compile with \
                 Model::compile_in(MirroredStrategy::cpu(1), ...) for one device"
                    .into(),
            )),
        }
    }

    /// An error naming the first replica and variable that differs, bitwise, from
    /// replica 0 (weights and optimizer state); `Ok` without a strategy. The mirrored
    /// strategy keeps replicas identical after every step; this checks it.
    pub fn check_replicas_in_sync(&self) -> Result<()> {
        let Some(m) = &self.mirrors else {
            return Ok(());
        };
        let bits = |t: &Tensor| t.contiguous().map(|c| c.as_bytes().map(<[u8]>::to_vec));
        let reference: Vec<(String, Tensor)> = self
            .get_weights()
            .into_iter()
            .chain(self.optimizer.state())
            .collect();
        let others = m.other_nets().zip(m.other_optimizers());
        for (r, (net, opt)) in others.enumerate() {
            let theirs: Vec<(String, Tensor)> = net
                .weight_names()
                .into_iter()
                .zip(net.weights())
                .chain(opt.state())
                .collect();
            if theirs.len() != reference.len() {
                return Err(TrainError::Invalid(format!(
                    "replica {} has {} variables and optimizer slots, replica 0 has {}",
                    r + 1,
                    theirs.len(),
                    reference.len()
                )));
            }
            for ((name, a), (_, b)) in reference.iter().zip(theirs) {
                if bits(a)?? != bits(&b)?? {
                    return Err(TrainError::Invalid(format!(
                        "replica {} differs from replica 0 in `{name}`",
                        r + 1
                    )));
                }
            }
        }
        Ok(())
    }

    /// The device the model's weights live on and its steps run on.
    pub fn device(&self) -> Device {
        self.net.device()
    }

    /// Move the model to `device` (PyTorch's `model.to(device)`): its weights now, its
    /// optimizer's state at the next step. Batches are copied to the device as they come,
    /// and a checkpoint holds host bytes, so a run resumes on any device. A model under a
    /// distribution strategy lives on its strategy's devices: moving it is an error.
    pub fn to_device(&mut self, device: Device) -> Result<()> {
        if let Some(m) = &self.mirrors {
            let here = m.strategy.device(0);
            if device != here {
                return Err(TrainError::Invalid(format!(
                    "a model under a distribution strategy lives on the strategy's devices \
                     (replica 0 on {here}); build the strategy on {device} instead"
                )));
            }
            return Ok(());
        }
        self.net.to_device(device)?;
        Ok(())
    }

    /// The network.
    pub fn net(&self) -> &Network {
        &self.net
    }

    /// The network, mutably. Under a strategy this is replica 0's alone: change weights
    /// with [`Model::set_weights`], which reaches every replica.
    pub fn net_mut(&mut self) -> &mut Network {
        &mut self.net
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &dyn Optimizer {
        self.optimizer.as_ref()
    }

    /// The optimizer, mutably. Under a strategy this is replica 0's alone: use
    /// [`Model::set_learning_rate`] and [`Model::load_optimizer_state`], which reach every
    /// replica.
    pub fn optimizer_mut(&mut self) -> &mut dyn Optimizer {
        self.optimizer.as_mut()
    }

    /// Every variable by name (`dense/kernel`, ..., then non-trainable state such as
    /// `batch_normalization/moving_mean`), in the order of [`Network::weights`] (Keras's
    /// `get_weights`). The tensors share their buffers with the model (the next update
    /// copies a shared buffer before changing it), so they are a snapshot.
    pub fn get_weights(&self) -> Vec<(String, Tensor)> {
        let names = self.net.weight_names().into_iter();
        names.zip(self.net.weights()).collect()
    }

    /// Replace every variable (by position, checked against the network's shapes and
    /// dtypes).
    pub fn set_weights(&mut self, weights: Vec<Tensor>) -> Result<()> {
        if let Some(m) = &mut self.mirrors {
            // Checked on replica 0 first, so that a bad list changes no replica.
            let mut check = self.net.clone();
            check.set_weights(weights.clone())?;
            m.for_others(|net, _| Ok(net.set_weights(weights.clone())?))?;
        }
        self.net.set_weights(weights)?;
        Ok(())
    }

    /// The optimizer's state by name (`iterations`, then `"{i}/{slot}"` per weight `i`,
    /// see [`Optimizer::state`]); a snapshot like [`Model::get_weights`].
    pub fn optimizer_state(&self) -> Vec<(String, Tensor)> {
        self.optimizer.state()
    }

    /// Restore a state exported by [`Model::optimizer_state`] of a model with the same
    /// weights and optimizer. The slots are checked against the weights' shapes here
    /// (the optimizer alone would only notice at the next step); on error nothing changes.
    pub fn load_optimizer_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        // Optimizer slots exist for the trainable weights, which come first.
        let mut weights = self.get_weights();
        weights.truncate(self.net.params().len());
        let mut covered = 0;
        for (key, t) in state {
            // Keys other than `{i}/{slot}` are the optimizer's to judge.
            let Some(i) = key
                .split_once('/')
                .and_then(|(i, _)| i.parse::<usize>().ok())
            else {
                continue;
            };
            let Some((name, w)) = weights.get(i) else {
                return Err(TrainError::Invalid(format!(
                    "optimizer state `{key}` is for weight {i}, but the model has {} trainable \
                     weights",
                    weights.len()
                )));
            };
            if t.shape() != w.shape() {
                return Err(TrainError::Invalid(format!(
                    "optimizer state `{key}` has shape {}, but weight {i} (`{name}`) has shape {}",
                    t.shape(),
                    w.shape()
                )));
            }
            covered = covered.max(i + 1);
        }
        if covered != 0 && covered != weights.len() {
            return Err(TrainError::Invalid(format!(
                "optimizer state covers {covered} weights, but the model has {} trainable ones",
                weights.len()
            )));
        }
        self.optimizer.load_state(state)?;
        if let Some(m) = &mut self.mirrors {
            m.for_others(|_, opt| Ok(opt.load_state(state)?))?;
        }
        Ok(())
    }

    /// Where the generator of training-time randomness (dropout) stands.
    pub fn rng_state(&self) -> RngState {
        RngState::of(&self.rng)
    }

    /// Put the generator of training-time randomness where [`Model::rng_state`] found it.
    pub fn set_rng_state(&mut self, state: &RngState) {
        self.rng = state.to_rng();
    }

    /// The learning rate of the next update.
    pub fn learning_rate(&self) -> f64 {
        self.optimizer.learning_rate()
    }

    /// Set a constant learning rate from the next update on.
    pub fn set_learning_rate(&mut self, lr: f64) {
        self.optimizer.set_learning_rate(lr);
        if let Some(m) = &mut self.mirrors {
            let _infallible = m.for_others(|_, opt| {
                opt.set_learning_rate(lr);
                Ok(())
            });
        }
    }

    /// The epochs that led to the current weights, as Keras's `model.history`: those of the
    /// last `fit` and, when it resumed a run (a non-zero
    /// [`FitConfig::initial_epoch`]), the earlier ones its checkpoint restored
    /// ([`Model::set_history`]).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Replace the record of the epochs trained so far (a checkpoint restores it).
    pub fn set_history(&mut self, history: History) {
        self.history = history;
    }

    /// The name, position (row-major) and value of the first weight element that is NaN
    /// or infinite, `None` when every weight is finite. One vectorised pass over the
    /// weights: `fit` runs it at the end of every epoch and whenever the loss is not
    /// finite.
    pub fn first_non_finite_weight(&self) -> Result<Option<(String, usize, f64)>> {
        for (name, w) in self.net.weight_names().into_iter().zip(self.net.weights()) {
            if let Some((at, value)) = w.first_non_finite()? {
                return Ok(Some((name, at, value)));
            }
        }
        Ok(None)
    }

    /// One step of gradient descent on a batch: forward, backward, update.
    pub fn train_step(&mut self, x: Tensor, y: &Tensor) -> Result<StepOutput> {
        let y = &y.to_device(self.device())?;
        // The key of this step's dropout masks: drawn once, the same on every replica
        // (an example's mask is keyed by it and the example's place in the batch).
        let step_key = self.rng.random::<u64>();
        if let Some(m) = &mut self.mirrors {
            let primary = Primary {
                net: &mut self.net,
                optimizer: self.optimizer.as_mut(),
                tape: &mut self.tape,
            };
            let (loss, output) = m.step(primary, self.loss.as_ref(), x, y, step_key)?;
            return Ok(StepOutput { loss, output });
        }
        let (loss, output) = {
            let forward = trace::span("compute", "forward");
            let examples = Examples { step_key, first: 0 };
            let out = self.net.forward(&self.tape, x, true, examples)?;
            let loss = self.loss.compute(&out, y, Reduction::SumOverBatchSize)?;
            drop(forward);
            let _backward = trace::span("compute", "backward");
            let mut grads = self
                .tape
                .backward(&scaled_loss(&loss, self.optimizer.loss_scale())?)?;
            self.grads.clear();
            for (i, p) in self.net.params().iter().enumerate() {
                // A parameter the loss does not reach gets a zero gradient, as in Keras.
                let g = match grads.take(i) {
                    Some(g) => g.contiguous()?,
                    None => p.zeros_like()?,
                };
                self.grads.push(g);
            }
            (scalar(loss.value())?, out.output.value().clone())
        };
        // The tape holds references to the parameters; release them so the optimizer
        // updates the buffers in place instead of copying them.
        self.tape.clear();
        let _step = trace::span("optimizer", "optimizer step");
        let stepped = self.optimizer.step(self.net.params_mut(), &self.grads);
        // The gradients are spent: free them now (keeping the list's capacity), not when the
        // next step's backward has made new ones, as PyTorch's `zero_grad(set_to_none=True)`:
        // otherwise two steps' gradients are alive at the next backward's peak.
        self.grads.clear();
        stepped?;
        Ok(StepOutput { loss, output })
    }

    /// Train for `config.epochs` epochs on `train`, validating on `validation` after each
    /// epoch, and return the History (`loss`, metrics, `val_` versions, `samples_per_sec`).
    pub fn fit(
        &mut self,
        train: &Dataset,
        validation: Option<&Dataset>,
        config: &FitConfig,
        callbacks: &mut [Box<dyn Callback>],
    ) -> Result<History> {
        if config.epochs == 0 {
            return Err(TrainError::Invalid("epochs must be at least 1".into()));
        }
        // Known to be empty: an error now, not an epoch of nothing (and a validation loss
        // of 0 that would become the best so far).
        for (what, data) in [("training", Some(train)), ("validation", validation)] {
            if data.and_then(Dataset::cardinality) == Some(0) {
                return Err(TrainError::EmptyData(what));
            }
        }
        self.history.truncate_from(config.initial_epoch);
        let info = TrainInfo {
            epochs: config.epochs,
            initial_epoch: config.initial_epoch,
            steps_per_epoch: train.cardinality(),
        };
        for cb in callbacks.iter_mut() {
            cb.on_train_begin(&info, self)?;
        }
        let mut history = History::default();
        let mut last = Logs::new();
        for epoch in config.initial_epoch..config.epochs {
            for cb in callbacks.iter_mut() {
                cb.on_epoch_begin(epoch, self)?;
            }
            let mut logs = self.train_epoch(train, epoch, callbacks)?;
            if let Some(val) = validation {
                for (name, value) in self.evaluate(val)?.iter() {
                    logs.set(&format!("val_{name}"), value);
                }
            }
            for cb in callbacks.iter_mut() {
                cb.on_epoch_logs(epoch, &mut logs, self)?;
            }
            // Keep the rate last, as the epoch line prints it at the end.
            if let Some(rate) = logs.get("samples_per_sec") {
                logs.remove("samples_per_sec");
                logs.set("samples_per_sec", rate);
            }
            history.push(epoch, &logs);
            self.history.push(epoch, &logs);
            let mut stop = false;
            for cb in callbacks.iter_mut() {
                stop |= cb.on_epoch_end(epoch, &logs, self)? == Control::Stop;
            }
            last = logs;
            if stop {
                break;
            }
        }
        for cb in callbacks.iter_mut() {
            cb.on_train_end(&last, self)?;
        }
        Ok(history)
    }

    fn train_epoch(
        &mut self,
        train: &Dataset,
        epoch: usize,
        callbacks: &mut [Box<dyn Callback>],
    ) -> Result<Logs> {
        let mut loss_mean = Mean::new("loss");
        for m in &mut self.metrics {
            m.reset();
        }
        let mut samples = 0usize;
        let start = Instant::now();
        let mut logs = Logs::new();
        let mut steps = 0;
        for (step, batch) in train.iter_epoch(epoch as u64)?.enumerate() {
            let (x, y) = split_batch(batch?)?;
            let n = x.dims().first().copied().unwrap_or(0);
            let out = self.train_step(x, &y)?;
            steps = step + 1;
            // The loss every step; the weights only when it is not finite, to name the
            // culprit: NaN propagates, so a weight that an update made NaN or infinite
            // makes the next step's loss so (the scan after the epoch's last update
            // covers that one). A scan per step would cost about 1% of a step of the MLP.
            if !out.loss.is_finite() {
                self.check_finite(out.loss, epoch, step)?;
            }
            loss_mean.add(out.loss, n as f64);
            for m in &mut self.metrics {
                m.update(&y, &out.output)?;
            }
            samples += n;
            logs.set("loss", loss_mean.value());
            for m in &self.metrics {
                logs.set(m.name(), m.result());
            }
            for cb in callbacks.iter_mut() {
                cb.on_train_batch_end(step, &logs, self)?;
            }
        }
        if samples == 0 {
            return Err(TrainError::EmptyData("training"));
        }
        // Before any callback sees (and saves) the epoch.
        self.check_finite(loss_mean.value(), epoch, steps - 1)?;
        let secs = start.elapsed().as_secs_f64();
        logs.set(
            "samples_per_sec",
            if secs > 0.0 {
                samples as f64 / secs
            } else {
                0.0
            },
        );
        Ok(logs)
    }

    /// An error naming the loss or the first weight that is NaN or infinite after the
    /// update of (0-based) `epoch` and `step`: a scan of every weight. Under loss scaling
    /// a non-finite loss alone is not an error: its step was skipped (its gradients were
    /// not finite either) and the scale lowered.
    fn check_finite(&self, loss: f64, epoch: usize, step: usize) -> Result<()> {
        let weight = self.first_non_finite_weight()?;
        let scaled = self.optimizer.loss_scale().is_some();
        if (loss.is_finite() || scaled) && weight.is_none() {
            return Ok(());
        }
        let (variable, value) = match (loss.is_finite(), weight) {
            (true, Some((name, at, value))) => (format!("weight `{name}` (element {at})"), value),
            (false, Some((name, _, _))) => (format!("the loss (and weight `{name}`)"), loss),
            (false, None) => ("the loss".to_string(), loss),
            (true, None) => unreachable!("checked above"),
        };
        Err(TrainError::NonFinite {
            variable,
            value,
            epoch: epoch + 1,
            step: step + 1,
        })
    }

    /// The loss and metrics over a dataset (no updates); an error when it holds no
    /// example.
    pub fn evaluate(&mut self, data: &Dataset) -> Result<Logs> {
        let mut loss_mean = Mean::new("loss");
        for m in &mut self.metrics {
            m.reset();
        }
        let tape = Tape::new();
        let mut examples = 0usize;
        for batch in data.iter_epoch(0)? {
            let (x, y) = split_batch(batch?)?;
            let y = y.to_device(self.device())?;
            let n = x.dims().first().copied().unwrap_or(0);
            let out = self.infer(&tape, x)?;
            let loss = self.loss.compute(&out, &y, Reduction::SumOverBatchSize)?;
            loss_mean.add(scalar(loss.value())?, n as f64);
            examples += n;
            for m in &mut self.metrics {
                m.update(&y, out.output.value())?;
            }
            drop(out);
            tape.clear();
        }
        if examples == 0 {
            return Err(TrainError::EmptyData("evaluation"));
        }
        let mut logs = Logs::new();
        logs.set("loss", loss_mean.value());
        for m in &self.metrics {
            logs.set(m.name(), m.result());
        }
        Ok(logs)
    }

    /// The model's outputs for every batch of a dataset, concatenated along the batch.
    pub fn predict(&self, data: &Dataset) -> Result<Tensor> {
        let mut outs = vec![];
        for batch in data.iter_epoch(0)? {
            let batch = batch?;
            let x = batch.into_iter().next().ok_or_else(|| {
                TrainError::Invalid("predict: dataset elements hold no tensor".into())
            })?;
            let tape = Tape::new();
            outs.push(self.infer(&tape, x)?.output.value().clone());
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        Ok(Tensor::concat(&refs, 0)?)
    }

    /// The inference output for a batch: on one device, or split across the replicas of
    /// the strategy and gathered on replica 0's device (the same values: an example's
    /// output does not depend on the rest of its batch in inference).
    fn infer<'t>(&self, tape: &'t Tape, x: Tensor) -> Result<ModelOutput<'t>> {
        let Some(m) = self
            .mirrors
            .as_ref()
            .filter(|m| m.strategy.num_replicas_in_sync() > 1)
        else {
            return Ok(self.net.forward_inference(tape, x)?);
        };
        let (output, logits) = m.infer(&self.net, x)?;
        Ok(ModelOutput {
            output: tape.constant(output),
            logits: logits.map(|l| tape.constant(l)),
        })
    }
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// `(inputs, labels)` of a dataset element.
fn split_batch(batch: Vec<Tensor>) -> Result<(Tensor, Tensor)> {
    let n = batch.len();
    let mut it = batch.into_iter();
    match (it.next(), it.next()) {
        (Some(x), Some(y)) => Ok((x, y)),
        _ => Err(TrainError::Invalid(format!(
            "training data must yield (inputs, labels); got elements of {n} tensor(s)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use mirra_tensor::{Device, Tensor};

    use crate::testutil::{tiny_data, tiny_model};
    use crate::{Callback, FitConfig, ModelCheckpoint, TrainError};

    /// The model's weights with element `at` of weight `index` set to `value`.
    fn poisoned(model: &crate::Model, index: usize, at: usize, value: f32) -> Vec<Tensor> {
        let mut weights: Vec<Tensor> = model.get_weights().into_iter().map(|w| w.1).collect();
        let w = &weights[index];
        let mut v = w.to_vec::<f32>().unwrap();
        v[at] = value;
        weights[index] = Tensor::from_vec(v, w.dims(), Device::Cpu).unwrap();
        weights
    }

    /// A NaN weight used to survive: ReLU turned the NaN it produced into 0, the loss
    /// stayed finite, and the checkpoint saved the NaN. Now the loss is NaN at once and
    /// the run stops, naming the weight, before any checkpoint is written.
    #[test]
    fn a_nan_weight_stops_the_run_naming_it_before_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last.safetensors");
        let mut model = tiny_model(1);
        model.set_weights(poisoned(&model, 0, 5, f32::NAN)).unwrap();
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(ModelCheckpoint::new(&path).unwrap())];
        let err = model
            .fit(
                &tiny_data(32, 8, 1),
                None,
                &FitConfig::default(),
                &mut callbacks,
            )
            .unwrap_err();
        assert!(matches!(err, TrainError::NonFinite { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with("the loss (and weight `dense/kernel`) is NaN after epoch 1, step 1"),
            "{text}"
        );
        assert!(!path.exists());
    }

    /// Changes a weight after the epoch's last step, as an update that overflowed would.
    #[derive(Debug)]
    struct PoisonAfterStep(usize);

    impl Callback for PoisonAfterStep {
        fn on_train_batch_end(
            &mut self,
            step: usize,
            _: &crate::Logs,
            model: &mut crate::Model,
        ) -> crate::Result<()> {
            if step == self.0 {
                model.set_weights(poisoned(model, 3, 0, f32::INFINITY))?;
            }
            Ok(())
        }
    }

    /// A weight made infinite by the epoch's last update (whose loss was still finite,
    /// and after which no step follows to make the loss infinite) is caught by the scan
    /// at the epoch's end, before any callback saves it.
    #[test]
    fn a_weight_made_infinite_by_the_last_update_is_caught_before_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last.safetensors");
        let mut model = tiny_model(1);
        let mut callbacks: Vec<Box<dyn Callback>> = vec![
            Box::new(PoisonAfterStep(3)),
            Box::new(ModelCheckpoint::new(&path).unwrap()),
        ];
        let err = model
            .fit(
                &tiny_data(32, 8, 1),
                None,
                &FitConfig::default(),
                &mut callbacks,
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("weight `dense_1/bias` (element 0) is inf after epoch 1, step 4"),
            "{err}"
        );
        assert!(!path.exists());
    }

    /// The check after every update names the first non-finite weight with the step,
    /// whether the loss is finite (an update overflowed) or not.
    #[test]
    fn the_check_after_each_update_names_the_weight_element_and_step() {
        let mut model = tiny_model(1);
        model
            .fit(&tiny_data(32, 8, 1), None, &FitConfig::default(), &mut [])
            .unwrap();
        assert_eq!(model.first_non_finite_weight().unwrap(), None);
        assert!(model.check_finite(0.25, 1, 16).is_ok());
        let err = model
            .check_finite(f64::INFINITY, 1, 16)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("the loss is inf after epoch 2, step 17: training diverged"),
            "{err}"
        );
        model
            .set_weights(poisoned(&model, 2, 7, f32::NEG_INFINITY))
            .unwrap();
        assert_eq!(
            model.first_non_finite_weight().unwrap(),
            Some(("dense_1/kernel".to_string(), 7, f64::NEG_INFINITY))
        );
        let err = model.check_finite(0.25, 1, 16).unwrap_err().to_string();
        assert!(
            err.starts_with("weight `dense_1/kernel` (element 7) is -inf after epoch 2, step 17"),
            "{err}"
        );
    }

    #[test]
    fn empty_training_or_validation_data_is_an_error_not_a_loss_of_0() {
        let mut model = tiny_model(1);
        let empty = tiny_data(0, 8, 1);
        let some = tiny_data(16, 8, 1);
        let config = FitConfig::default();
        let err = model.fit(&empty, None, &config, &mut []).unwrap_err();
        assert_eq!(err.to_string(), "the training data holds no example");
        let err = model
            .fit(&some, Some(&empty), &config, &mut [])
            .unwrap_err();
        assert_eq!(err.to_string(), "the validation data holds no example");
        let err = model.evaluate(&empty).unwrap_err();
        assert_eq!(err.to_string(), "the evaluation data holds no example");
        // Nothing was trained.
        assert_eq!(model.optimizer().iterations(), 0);
        assert!(model.history().is_empty());
    }

    #[test]
    fn fit_lowers_the_loss_and_callbacks_see_the_weights() {
        let mut model = tiny_model(3);
        let data = tiny_data(96, 16, 4);
        let before = model.evaluate(&data).unwrap().get("loss").unwrap();
        let config = FitConfig {
            epochs: 20,
            initial_epoch: 0,
        };
        let history = model.fit(&data, None, &config, &mut []).unwrap();
        let after = model.evaluate(&data).unwrap().get("loss").unwrap();
        assert!(after < before, "loss {before} -> {after}");
        assert_eq!(history.epochs.len(), 20);
        let w = model.get_weights();
        assert_eq!(w[0].0, "dense/kernel");
        assert_eq!(w[0].1.dims(), &[4, 8]);
        model.set_learning_rate(0.5);
        assert_eq!(model.learning_rate(), 0.5);
    }
}
