//! Checkpoints: everything a killed run needs to go on exactly where it stood, in one
//! [safetensors](https://huggingface.co/docs/safetensors) file written atomically and
//! protected by checksums.
//!
//! # Format (version 2)
//!
//! | tensor | content |
//! |---|---|
//! | `dense/kernel`, `dense/bias`, ... | the weights under the network's names ([`Model::get_weights`]) |
//! | `optimizer/iterations`, `optimizer/0/m`, ... | the optimizer's state ([`Model::optimizer_state`]) under `optimizer/` |
//!
//! and `__metadata__` strings:
//!
//! | key | value |
//! |---|---|
//! | `format` | `mirra-checkpoint` (what tells a checkpoint from any safetensors file) |
//! | `format_version` | `2` |
//! | `epoch` | epochs completed ([`CheckpointMeta::epoch`]) |
//! | `step` | optimizer updates applied so far |
//! | `optimizer` | the optimizer's name (`adam`, ...) |
//! | `learning_rate` | the rate of the next update |
//! | `rng_seed`, `rng_stream`, `rng_word_pos` | the dropout generator (ChaCha8: 64 hex digits, decimal, decimal) |
//! | `data_seed` (when known), `data_epoch`, `data_batch` | where the input pipeline resumes ([`DataPosition`]) |
//! | `logs.<name>` | the epoch's logs (`logs.val_loss`, ...) |
//! | `history_epochs`, `history.<i>.<name>` | the model's [`History`] ([`Model::history`]): the epochs' numbers, and the values of its `i`-th metric, comma-separated |
//! | `extra.<key>` | the caller's own entries ([`CheckpointMeta::extra`]; the command line records its run configuration there) |
//! | `crc32c.<tensor>` | the CRC-32C of each tensor's bytes (8 hex digits) |
//! | `state_crc32c` | the CRC-32C of every other metadata entry and of every tensor's name, dtype and shape |
//!
//! Numbers are decimal text; floats are written in Rust's shortest form that reads back
//! bit for bit. Tensors are little-endian, as safetensors requires (mirra runs on
//! little-endian hosts). Reading checks everything before the model changes: a file that
//! is truncated, not safetensors, not a checkpoint, of another version, fails a checksum
//! (flipped bytes in a tensor name the tensor), or does not fit the model (weight names,
//! shapes, dtypes, the optimizer) is one [`TrainError::Checkpoint`] naming the file and
//! the problem.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use mirra_device::Buffer;
use mirra_tensor::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors, View};

use crate::console::one_line;
use crate::fsutil::write_atomic;
pub use crate::rng_state::RngState;
use crate::{History, Logs, Model, Result, TrainError};

/// The value of the `format` metadata entry of every checkpoint.
pub const CHECKPOINT_FORMAT: &str = "mirra-checkpoint";
/// The format version this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 2;
/// Prefix of the optimizer's state tensors.
const OPTIMIZER_PREFIX: &str = "optimizer/";
/// Prefix of the logs' metadata entries.
const LOGS_PREFIX: &str = "logs.";
/// Prefix of the caller's metadata entries.
const EXTRA_PREFIX: &str = "extra.";
/// Prefix of the History's metric entries.
const HISTORY_PREFIX: &str = "history.";
/// The History's epoch numbers.
const HISTORY_EPOCHS: &str = "history_epochs";
/// Prefix of the tensors' checksums.
const CHECKSUM_PREFIX: &str = "crc32c.";
/// The checksum of the metadata and the tensors' names, dtypes and shapes.
const STATE_CHECKSUM: &str = "state_crc32c";

/// Where the input pipeline resumes. The datasets of `fit` are deterministic per epoch
/// ([`Dataset::iter_epoch`](mirra_data::Dataset::iter_epoch) with the shuffle seed), so
/// the seed and epoch restart them exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPosition {
    /// The seed of the training data's shuffles, when the caller knows it.
    pub seed: Option<u64>,
    /// The (0-based) epoch whose elements come next.
    pub epoch: u64,
    /// Batches of that epoch already consumed (0 at the end of an epoch).
    pub batch: u64,
}

/// What the writer of a checkpoint records besides the model's own state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointMeta {
    /// Epochs completed; a resumed `fit` passes it as
    /// [`FitConfig::initial_epoch`](crate::FitConfig::initial_epoch).
    pub epoch: usize,
    /// Where the input pipeline resumes.
    pub data: DataPosition,
    /// The logs of the last epoch (loss, metrics, `val_` entries).
    pub logs: Logs,
    /// The caller's own entries (the command line records its settings here).
    pub extra: BTreeMap<String, String>,
}

/// A checkpoint in memory: the model's weights, optimizer state, generator and learning
/// rate, with the writer's [`CheckpointMeta`].
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The writer's metadata.
    pub meta: CheckpointMeta,
    /// Optimizer updates applied so far (Keras's `optimizer.iterations`).
    pub step: u64,
    /// The optimizer's name.
    pub optimizer: String,
    /// The learning rate of the next update.
    pub learning_rate: f64,
    /// The dropout generator.
    pub rng: RngState,
    /// The weights by name (in the model's order when captured, sorted by name when read).
    pub weights: Vec<(String, Tensor)>,
    /// The optimizer's state by name, without the `optimizer/` prefix, in the order of
    /// [`Model::optimizer_state`].
    pub optimizer_state: Vec<(String, Tensor)>,
    /// The epochs trained so far ([`Model::history`]).
    pub history: History,
    /// The file it was read from (for error messages).
    source: PathBuf,
}

impl Checkpoint {
    /// The model's state now, through [`Model::get_weights`], [`Model::optimizer_state`]
    /// and [`Model::rng_state`] (which act on every replica under a strategy).
    pub fn capture(model: &Model, meta: CheckpointMeta) -> Checkpoint {
        Checkpoint {
            meta,
            step: model.optimizer().iterations(),
            optimizer: model.optimizer().name().to_string(),
            learning_rate: model.learning_rate(),
            rng: model.rng_state(),
            weights: model.get_weights(),
            optimizer_state: model.optimizer_state(),
            history: model.history().clone(),
            source: PathBuf::from("(in memory)"),
        }
    }

    /// The file this checkpoint was read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Write the checkpoint to `path` atomically (temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes().map_err(|msg| TrainError::Checkpoint {
            path: path.to_path_buf(),
            msg: format!("cannot save: {msg}"),
        })?;
        write_atomic(path, &bytes)
    }

    /// Read and check a checkpoint file (format, version, metadata); whether it fits a
    /// model is checked by [`Checkpoint::restore`].
    pub fn read(path: &Path) -> Result<Checkpoint> {
        // Messages quote the file's strings: kept on one line whatever they hold.
        let bad = |msg: String| TrainError::Checkpoint {
            path: path.to_path_buf(),
            msg: one_line(&msg),
        };
        let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let mut checkpoint = Checkpoint::from_bytes(&bytes).map_err(bad)?;
        checkpoint.source = path.to_path_buf();
        Ok(checkpoint)
    }

    /// Put this checkpoint into `model`: weights, optimizer state, generator, learning
    /// rate and History. Everything is checked first (the optimizer's name, every weight's name, shape
    /// and dtype, the optimizer state's slots), so on error the model is unchanged.
    ///
    /// The learning rate is set only when the model's optimizer, with the restored
    /// iteration count, would use another: a rate changed by a callback (a
    /// [`LearningRateScheduler`](crate::LearningRateScheduler)) carries over, while an
    /// optimizer's schedule that gives the same rate is kept.
    pub fn restore(&self, model: &mut Model) -> Result<()> {
        let bad = |msg: String| TrainError::Checkpoint {
            path: self.source.clone(),
            msg: one_line(&msg),
        };
        if model.optimizer().name() != self.optimizer {
            return Err(bad(format!(
                "it holds the state of optimizer `{}`, but the model's optimizer is `{}`",
                self.optimizer,
                model.optimizer().name()
            )));
        }
        let weights = self.weights_for(model).map_err(bad)?;
        model
            .load_optimizer_state(&self.optimizer_state)
            .map_err(|e| bad(e.to_string()))?;
        // Cannot fail after the checks above; reported all the same.
        model.set_weights(weights).map_err(|e| bad(e.to_string()))?;
        model.set_rng_state(&self.rng);
        model.set_history(self.history.clone());
        if model.learning_rate().to_bits() != self.learning_rate.to_bits() {
            model.set_learning_rate(self.learning_rate);
        }
        Ok(())
    }

    /// The weights in the model's order, checked against its names, shapes and dtypes.
    fn weights_for(&self, model: &Model) -> std::result::Result<Vec<Tensor>, String> {
        let ours = model.get_weights();
        let names = || {
            ours.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some((extra, _)) = self
            .weights
            .iter()
            .find(|(n, _)| !ours.iter().any(|(m, _)| m == n))
        {
            return Err(format!(
                "tensor `{extra}` is not a weight of the model (its weights: {})",
                names()
            ));
        }
        ours.iter()
            .map(|(name, want)| {
                let Some((_, t)) = self.weights.iter().find(|(n, _)| n == name) else {
                    return Err(format!("weight `{name}` is missing"));
                };
                if t.shape() != want.shape() || t.dtype() != want.dtype() {
                    return Err(format!(
                        "weight `{name}` is {} {} in the file but {} {} in the model",
                        t.dtype(),
                        t.shape(),
                        want.dtype(),
                        want.shape()
                    ));
                }
                Ok(t.clone())
            })
            .collect()
    }

    /// The `__metadata__` entries.
    fn metadata(&self) -> HashMap<String, String> {
        let meta = &self.meta;
        let mut m = HashMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("format", CHECKPOINT_FORMAT.into());
        put("format_version", CHECKPOINT_VERSION.to_string());
        put("epoch", meta.epoch.to_string());
        put("step", self.step.to_string());
        put("optimizer", self.optimizer.clone());
        put("learning_rate", self.learning_rate.to_string());
        put(
            "rng_seed",
            self.rng.seed.iter().map(|b| format!("{b:02x}")).collect(),
        );
        put("rng_stream", self.rng.stream.to_string());
        put("rng_word_pos", self.rng.word_pos.to_string());
        if let Some(seed) = meta.data.seed {
            put("data_seed", seed.to_string());
        }
        put("data_epoch", meta.data.epoch.to_string());
        put("data_batch", meta.data.batch.to_string());
        for (name, value) in meta.logs.iter() {
            put(&format!("{LOGS_PREFIX}{name}"), value.to_string());
        }
        for (key, value) in &meta.extra {
            put(&format!("{EXTRA_PREFIX}{key}"), value.clone());
        }
        let joined =
            |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(",");
        let history = &self.history;
        put(
            HISTORY_EPOCHS,
            joined(&mut history.epochs.iter().map(usize::to_string)),
        );
        for (i, (name, values)) in history.history.iter().enumerate() {
            put(
                &format!("{HISTORY_PREFIX}{i}.{name}"),
                joined(&mut values.iter().map(f64::to_string)),
            );
        }
        m
    }

    /// The file's bytes.
    fn to_bytes(&self) -> std::result::Result<Vec<u8>, String> {
        if let Some((name, _)) = self
            .weights
            .iter()
            .find(|(n, _)| n.starts_with(OPTIMIZER_PREFIX))
        {
            return Err(format!(
                "weight name `{name}` clashes with the `{OPTIMIZER_PREFIX}` prefix of the optimizer state"
            ));
        }
        let optimizer = self
            .optimizer_state
            .iter()
            .map(|(n, t)| (format!("{OPTIMIZER_PREFIX}{n}"), t));
        let tensors = self
            .weights
            .iter()
            .map(|(n, t)| (n.clone(), t))
            .chain(optimizer)
            .map(|(n, t)| Ok((n, Bytes::new(t)?)))
            .collect::<std::result::Result<Vec<_>, String>>()?;
        encode(tensors, self.metadata())
    }

    /// Parse and check a checkpoint's bytes; the error is the message.
    fn from_bytes(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| {
            format!("not a complete safetensors file ({e}): truncated, or not a checkpoint")
        })?;
        let empty = HashMap::new();
        let meta = Fields(header.metadata().as_ref().unwrap_or(&empty));
        match meta.0.get("format") {
            Some(f) if f == CHECKPOINT_FORMAT => {}
            Some(f) => {
                return Err(format!(
                    "a safetensors file of format `{f}`, not a mirra checkpoint"
                ))
            }
            None => {
                return Err(format!(
                    "a safetensors file but not a mirra checkpoint (its metadata has no \
                     `format: {CHECKPOINT_FORMAT}`)"
                ))
            }
        }
        let version: u32 = meta.parse("format_version", "a whole number")?;
        if version != CHECKPOINT_VERSION {
            return Err(format!(
                "checkpoint format version {version}; this build of mirra reads version \
                 {CHECKPOINT_VERSION}"
            ));
        }
        let data = SafeTensors::deserialize(bytes).map_err(|e| format!("{e}"))?;
        verify_checksums(meta.0, &data)?;
        let mut weights = vec![];
        let mut optimizer_state = vec![];
        for (name, view) in data.iter() {
            let t = tensor_of(name, &view)?;
            match name.strip_prefix(OPTIMIZER_PREFIX) {
                Some(key) => optimizer_state.push((key.to_string(), t)),
                None => weights.push((name.to_string(), t)),
            }
        }
        // The file's index is a map: give readers a fixed order.
        weights.sort_by(|a, b| a.0.cmp(&b.0));
        optimizer_state.sort_by_cached_key(|(key, _)| state_order(key));
        let mut logs = Logs::new();
        let mut extra = BTreeMap::new();
        let mut history = History {
            epochs: meta.list(HISTORY_EPOCHS, "whole numbers")?,
            history: vec![],
        };
        let mut metrics = vec![];
        let mut keys: Vec<&String> = meta.0.keys().collect();
        keys.sort();
        for key in keys {
            if let Some(name) = key.strip_prefix(LOGS_PREFIX) {
                logs.set(name, meta.parse(key, "a number")?);
            } else if let Some(name) = key.strip_prefix(EXTRA_PREFIX) {
                extra.insert(name.to_string(), meta.0[key].clone());
            } else if let Some(numbered) = key.strip_prefix(HISTORY_PREFIX) {
                let position = numbered
                    .split_once('.')
                    .and_then(|(i, name)| Some((i.parse::<usize>().ok()?, name)));
                let Some((position, name)) = position else {
                    return Err(format!(
                        "metadata `{key}` is not `{HISTORY_PREFIX}<position>.<metric>`"
                    ));
                };
                let values: Vec<f64> = meta.list(key, "numbers")?;
                if values.len() != history.epochs.len() {
                    return Err(format!(
                        "metadata `{key}` has {} values for {} epochs",
                        values.len(),
                        history.epochs.len()
                    ));
                }
                metrics.push((position, name.to_string(), values));
            }
        }
        // The History's own order of metrics.
        metrics.sort_by_key(|m| m.0);
        history.history = metrics.into_iter().map(|(_, n, v)| (n, v)).collect();
        let data_seed = match meta.0.contains_key("data_seed") {
            true => Some(meta.parse("data_seed", "a whole number")?),
            false => None,
        };
        Ok(Checkpoint {
            meta: CheckpointMeta {
                epoch: meta.parse("epoch", "a whole number")?,
                data: DataPosition {
                    seed: data_seed,
                    epoch: meta.parse("data_epoch", "a whole number")?,
                    batch: meta.parse("data_batch", "a whole number")?,
                },
                logs,
                extra,
            },
            step: meta.parse("step", "a whole number")?,
            optimizer: meta.get("optimizer")?.to_string(),
            learning_rate: meta.parse("learning_rate", "a number")?,
            rng: RngState {
                seed: parse_seed(meta.get("rng_seed")?)
                    .ok_or("metadata `rng_seed` is not 64 hexadecimal digits")?,
                stream: meta.parse("rng_stream", "a whole number")?,
                word_pos: meta.parse("rng_word_pos", "a whole number")?,
            },
            weights,
            optimizer_state,
            history,
            source: PathBuf::from("(in memory)"),
        })
    }
}

impl Model {
    /// Write this model's checkpoint (see [`Checkpoint`]) to `path` atomically.
    pub fn save_checkpoint(&self, path: &Path, meta: &CheckpointMeta) -> Result<()> {
        Checkpoint::capture(self, meta.clone()).save(path)
    }

    /// Read the checkpoint at `path` into this model (see [`Checkpoint::restore`]) and
    /// return its writer's metadata.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<CheckpointMeta> {
        let checkpoint = Checkpoint::read(path)?;
        checkpoint.restore(self)?;
        Ok(checkpoint.meta)
    }
}

/// The metadata entries being parsed.
struct Fields<'a>(&'a HashMap<String, String>);

impl Fields<'_> {
    fn get(&self, key: &str) -> std::result::Result<&str, String> {
        self.0
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("metadata `{key}` is missing"))
    }

    fn parse<T: std::str::FromStr>(&self, key: &str, what: &str) -> std::result::Result<T, String> {
        let text = self.get(key)?;
        text.parse()
            .map_err(|_| format!("metadata `{key}` = `{text}` is not {what}"))
    }

    /// A comma-separated list (empty text: no element).
    fn list<T: std::str::FromStr>(
        &self,
        key: &str,
        what: &str,
    ) -> std::result::Result<Vec<T>, String> {
        let text = self.get(key)?;
        if text.is_empty() {
            return Ok(vec![]);
        }
        text.split(',')
            .map(|item| {
                item.parse()
                    .map_err(|_| format!("metadata `{key}` is not a list of {what} (`{item}`)"))
            })
            .collect()
    }
}

/// 8 hexadecimal digits.
fn hex32(value: u32) -> String {
    format!("{value:08x}")
}

/// The checksum of the metadata entries (without [`STATE_CHECKSUM`]) and of the tensors'
/// names, dtypes and shapes, in a fixed order, each string length-prefixed so that no two
/// different contents give the same bytes.
fn state_checksum<'a>(
    metadata: &HashMap<String, String>,
    tensors: impl Iterator<Item = (&'a str, Dtype, &'a [usize])>,
) -> u32 {
    let mut crc = 0;
    let mut add = |bytes: &[u8]| {
        crc = crc32c::crc32c_append(crc, &(bytes.len() as u64).to_le_bytes());
        crc = crc32c::crc32c_append(crc, bytes);
    };
    let mut entries: Vec<(&String, &String)> = metadata
        .iter()
        .filter(|(k, _)| k.as_str() != STATE_CHECKSUM)
        .collect();
    entries.sort();
    for (key, value) in entries {
        add(key.as_bytes());
        add(value.as_bytes());
    }
    let mut tensors: Vec<_> = tensors.collect();
    tensors.sort_by_key(|t| t.0);
    for (name, dtype, shape) in tensors {
        add(name.as_bytes());
        add(dtype.to_string().as_bytes());
        let dims: Vec<u8> = shape
            .iter()
            .flat_map(|&d| (d as u64).to_le_bytes())
            .collect();
        add(&dims);
    }
    crc
}

/// An error unless the metadata and every tensor match their checksums.
fn verify_checksums(
    metadata: &HashMap<String, String>,
    data: &SafeTensors<'_>,
) -> std::result::Result<(), String> {
    let recorded = |key: &str| -> std::result::Result<u32, String> {
        let text = metadata
            .get(key)
            .ok_or_else(|| format!("metadata `{key}` is missing"))?;
        match text.len() == 8 {
            true => u32::from_str_radix(text, 16).ok(),
            false => None,
        }
        .ok_or_else(|| format!("metadata `{key}` = `{text}` is not 8 hexadecimal digits"))
    };
    let tensors = data.tensors();
    let described = tensors
        .iter()
        .map(|(n, v)| (n.as_str(), v.dtype(), v.shape()));
    let (want, got) = (
        recorded(STATE_CHECKSUM)?,
        state_checksum(metadata, described),
    );
    if want != got {
        return Err(format!(
            "its metadata is corrupt: the recorded checksum is {}, its contents give {}",
            hex32(want),
            hex32(got)
        ));
    }
    for (name, view) in &tensors {
        let key = format!("{CHECKSUM_PREFIX}{name}");
        let (want, got) = (recorded(&key)?, crc32c::crc32c(view.data()));
        if want != got {
            return Err(format!(
                "tensor `{name}` is corrupt: the recorded checksum is {}, its bytes give {}",
                hex32(want),
                hex32(got)
            ));
        }
    }
    if let Some(key) = metadata.keys().find(|k| {
        k.strip_prefix(CHECKSUM_PREFIX)
            .is_some_and(|n| !tensors.iter().any(|(t, _)| t == n))
    }) {
        return Err(format!(
            "metadata `{key}` is the checksum of a tensor the file lacks"
        ));
    }
    Ok(())
}

/// The order of [`Optimizer::state`](mirra_optim::Optimizer::state): `iterations`, then
/// by weight index and slot name.
fn state_order(key: &str) -> (usize, usize, String) {
    if key == "iterations" {
        return (0, 0, String::new());
    }
    match key
        .split_once('/')
        .map(|(i, slot)| (i.parse::<usize>(), slot))
    {
        Some((Ok(i), slot)) => (1, i, slot.to_string()),
        _ => (2, 0, key.to_string()),
    }
}

fn parse_seed(hex: &str) -> Option<[u8; 32]> {
    let mut seed = [0u8; 32];
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    for (i, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(seed)
}

/// safetensors bytes of named tensors and metadata, with the checksum of every tensor
/// and of the state added to the metadata.
fn encode<V: View>(
    tensors: Vec<(String, V)>,
    mut metadata: HashMap<String, String>,
) -> std::result::Result<Vec<u8>, String> {
    for (name, view) in &tensors {
        metadata.insert(
            format!("{CHECKSUM_PREFIX}{name}"),
            hex32(crc32c::crc32c(&view.data())),
        );
    }
    let described = tensors
        .iter()
        .map(|(n, v)| (n.as_str(), v.dtype(), v.shape()));
    let state = state_checksum(&metadata, described);
    metadata.insert(STATE_CHECKSUM.into(), hex32(state));
    safetensors::serialize(tensors, Some(metadata)).map_err(|e| e.to_string())
}

/// A contiguous tensor seen as safetensors bytes.
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    tensor: Tensor,
}

impl Bytes {
    fn new(t: &Tensor) -> std::result::Result<Bytes, String> {
        // A checkpoint holds host bytes, whatever device trained: it resumes anywhere.
        let tensor = t
            .to_device(Device::Cpu)
            .and_then(|t| t.contiguous())
            .map_err(|e| e.to_string())?;
        // Checked here so that `data` cannot fail.
        tensor.as_bytes().map_err(|e| e.to_string())?;
        Ok(Bytes {
            dtype: safetensors_dtype(t.dtype()),
            shape: t.dims().to_vec(),
            tensor,
        })
    }
}

impl View for Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(
            self.tensor
                .as_bytes()
                .expect("contiguous, checked in Bytes::new"),
        )
    }

    fn data_len(&self) -> usize {
        self.tensor.elem_count() * self.tensor.dtype().size_in_bytes()
    }
}

fn safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
    }
}

/// A host tensor holding a copy of a safetensors view.
fn tensor_of(
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> std::result::Result<Tensor, String> {
    let dtype = match view.dtype() {
        Dtype::U8 => DType::U8,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        other => {
            return Err(format!(
                "tensor `{name}` has dtype {other}, which mirra does not have"
            ))
        }
    };
    let bad = |e: &dyn std::fmt::Display| format!("tensor `{name}`: {e}");
    let n = view.shape().iter().product();
    let mut buffer = Buffer::alloc(dtype, n, Device::Cpu).map_err(|e| bad(&e))?;
    // safetensors has checked that the data is exactly `n` elements long.
    buffer
        .as_bytes_mut()
        .map_err(|e| bad(&e))?
        .copy_from_slice(view.data());
    Tensor::from_buffer(buffer, view.shape()).map_err(|e| bad(&e))
}

#[cfg(test)]
mod tests {
    use rand::Rng as _;

    use super::*;
    use crate::testutil::{
        tiny_data, tiny_dropout_model, tiny_model, tiny_model_with, tiny_shuffled_data,
    };
    use crate::{Callback, FitConfig, ModelCheckpoint};

    fn bits(ts: &[(String, Tensor)]) -> Vec<(String, Vec<u8>)> {
        ts.iter()
            .map(|(n, t)| {
                let t = t.contiguous().unwrap();
                (n.clone(), t.as_bytes().unwrap().to_vec())
            })
            .collect()
    }

    fn epochs(epochs: usize, initial_epoch: usize) -> FitConfig {
        FitConfig {
            epochs,
            initial_epoch,
        }
    }

    #[test]
    fn a_resumed_fit_ends_with_the_same_bits_as_an_uninterrupted_one() {
        let data = tiny_shuffled_data(64, 16, 5);
        let mut whole = tiny_dropout_model(3);
        whole.fit(&data, None, &epochs(4, 0), &mut []).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last.safetensors");
        let mut first = tiny_dropout_model(3);
        let mut callbacks: Vec<Box<dyn Callback>> =
            vec![Box::new(ModelCheckpoint::new(&path).unwrap().data_seed(5))];
        first
            .fit(&data, None, &epochs(2, 0), &mut callbacks)
            .unwrap();
        // As a new process would: another initialisation, then the checkpoint.
        let mut resumed = tiny_dropout_model(99);
        let meta = resumed.load_checkpoint(&path).unwrap();
        assert_eq!(meta.epoch, 2);
        let position = DataPosition {
            seed: Some(5),
            epoch: 2,
            batch: 0,
        };
        assert_eq!(meta.data, position);
        assert_eq!(bits(&resumed.get_weights()), bits(&first.get_weights()));
        assert_eq!(
            bits(&resumed.optimizer_state()),
            bits(&first.optimizer_state())
        );
        assert_eq!(resumed.rng_state(), first.rng_state());

        assert_eq!(resumed.history().epochs, [0, 1]);
        resumed
            .fit(&data, None, &epochs(4, meta.epoch), &mut [])
            .unwrap();
        // The whole run's History, its first epochs from the checkpoint (all but the
        // timing, which differs from run to run).
        let untimed = |h: &History| {
            let mut h = h.clone();
            h.history.retain(|(n, _)| n != "samples_per_sec");
            h
        };
        assert_eq!(untimed(resumed.history()), untimed(whole.history()));
        assert_eq!(resumed.history().epochs, [0, 1, 2, 3]);
        assert_eq!(bits(&resumed.get_weights()), bits(&whole.get_weights()));
        assert_eq!(
            bits(&resumed.optimizer_state()),
            bits(&whole.optimizer_state())
        );
        assert_eq!(resumed.rng_state(), whole.rng_state());
    }

    #[test]
    fn rng_state_rebuilds_the_generator_in_the_middle_of_a_block() {
        let mut rng = mirra_tensor::init::rng(11);
        rng.set_stream(3);
        for _ in 0..37 {
            rng.next_u32();
        }
        let mut copy = RngState::of(&rng).to_rng();
        let a: Vec<u32> = (0..100).map(|_| rng.next_u32()).collect();
        let b: Vec<u32> = (0..100).map(|_| copy.next_u32()).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn a_schedule_is_kept_and_a_rate_set_by_a_callback_carries_over() {
        use mirra_optim::{Adam, CosineDecay};
        let data = tiny_data(32, 8, 1);
        let scheduled = || {
            let cosine = CosineDecay::new(0.01, 20, 0.1).unwrap();
            tiny_model_with(Box::new(Adam::new(0.0).with_schedule(Box::new(cosine))), 1)
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let mut a = scheduled();
        a.fit(&data, None, &epochs(1, 0), &mut []).unwrap();
        a.save_checkpoint(&path, &CheckpointMeta::default())
            .unwrap();
        let mut b = scheduled();
        b.load_checkpoint(&path).unwrap();
        assert_eq!(b.learning_rate(), a.learning_rate());
        // Both go on decaying: the schedule, not a constant, drives b.
        a.fit(&data, None, &epochs(2, 1), &mut []).unwrap();
        b.fit(&data, None, &epochs(2, 1), &mut []).unwrap();
        assert_eq!(b.learning_rate(), a.learning_rate());
        assert_eq!(bits(&b.get_weights()), bits(&a.get_weights()));

        a.set_learning_rate(0.003);
        a.save_checkpoint(&path, &CheckpointMeta::default())
            .unwrap();
        let mut c = scheduled();
        c.load_checkpoint(&path).unwrap();
        assert_eq!(c.learning_rate(), 0.003);
    }

    #[test]
    fn a_broken_foreign_or_mismatched_file_is_one_error_naming_it_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = tiny_model(1);
        model
            .fit(&tiny_data(16, 8, 1), None, &epochs(1, 0), &mut [])
            .unwrap();
        let good = dir.path().join("good.safetensors");
        let mut meta = CheckpointMeta::default();
        meta.logs.set("val_loss", f64::NAN);
        model.save_checkpoint(&good, &meta).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let saved = Checkpoint::read(&good).unwrap();
        assert!(saved.meta.logs.get("val_loss").unwrap().is_nan());

        let with = |change: &dyn Fn(&mut Checkpoint)| {
            let mut c = saved.clone();
            change(&mut c);
            c.to_bytes().unwrap()
        };
        let with_meta = |change: &dyn Fn(&mut HashMap<String, String>)| {
            let mut m = saved.metadata();
            change(&mut m);
            let kernel = Bytes::new(&saved.weights[0].1).unwrap();
            encode(vec![("dense/kernel".to_string(), kernel)], m).unwrap()
        };
        let set = |k: &'static str, v: &'static str| {
            move |m: &mut HashMap<String, String>| {
                m.insert(k.into(), v.into());
            }
        };
        let replace = |name: &'static str, t: Tensor| {
            move |c: &mut Checkpoint| {
                let all = c.weights.iter_mut().chain(c.optimizer_state.iter_mut());
                for (_, w) in all.filter(|(n, _)| n == name) {
                    *w = t.clone();
                }
            }
        };
        let zeros = |dims: &[usize], dtype| Tensor::zeros(dims, dtype, Device::Cpu).unwrap();
        let kernel = saved
            .weights
            .iter()
            .find(|(n, _)| n == "dense/kernel")
            .unwrap()
            .1
            .clone();
        let half = bytes[..bytes.len() / 2].to_vec();
        let foreign = encode(
            vec![("w".to_string(), Bytes::new(&kernel).unwrap())],
            HashMap::new(),
        )
        .unwrap();
        let u16_view = safetensors::tensor::TensorView::new(Dtype::U16, vec![2], &[0; 4]).unwrap();
        let odd_dtype = encode(
            vec![("dense/kernel".to_string(), u16_view)],
            saved.metadata(),
        )
        .unwrap();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("truncated", half, "not a complete safetensors file"),
            ("empty", vec![], "not a complete safetensors file"),
            ("text", b"epoch,loss\n0,1\n".to_vec(), "not a complete safetensors file"),
            ("foreign", foreign, "not a mirra checkpoint (its metadata has no"),
            ("gguf", with_meta(&set("format", "gguf")), "of format `gguf`"),
            // A string of the file with a newline stays on the error's one line.
            ("newline", with_meta(&set("format", "a\nb")), "of format `a\\nb`"),
            ("v3", with_meta(&set("format_version", "3")), "format version 3"),
            ("v1", with_meta(&set("format_version", "1")), "format version 1"),
            ("epoch", with_meta(&set("epoch", "x")), "`epoch` = `x` is not a whole number"),
            ("seed", with_meta(&set("rng_seed", "00")), "`rng_seed` is not 64 hex"),
            (
                "missing",
                with_meta(&|m| {
                    m.remove("step");
                }),
                "metadata `step` is missing",
            ),
            ("u16", odd_dtype, "has dtype U16, which mirra does not have"),
            (
                "no kernel",
                with(&|c| c.weights.retain(|(n, _)| n != "dense/kernel")),
                "weight `dense/kernel` is missing",
            ),
            (
                "extra",
                with(&|c| c.weights.push(("conv/kernel".into(), kernel.clone()))),
                "tensor `conv/kernel` is not a weight of the model (its weights: dense/kernel,",
            ),
            (
                "shape",
                with(&replace("dense/kernel", zeros(&[8, 4], DType::F32))),
                "weight `dense/kernel` is f32 [8, 4] in the file but f32 [4, 8] in the model",
            ),
            (
                "dtype",
                with(&replace("dense/kernel", zeros(&[4, 8], DType::F64))),
                "weight `dense/kernel` is f64 [4, 8] in the file",
            ),
            (
                "optimizer",
                with(&|c| c.optimizer = "sgd".into()),
                "the state of optimizer `sgd`, but the model's optimizer is `adam`",
            ),
            (
                "slot",
                with(&replace("0/m", zeros(&[3], DType::F32))),
                "optimizer state `0/m` has shape [3], but weight 0 (`dense/kernel`) has shape [4, 8]",
            ),
        ];
        let before = (bits(&model.get_weights()), bits(&model.optimizer_state()));
        for (name, contents, needle) in cases {
            let path = dir.path().join(format!("{name}.safetensors"));
            std::fs::write(&path, contents).unwrap();
            let err = model.load_checkpoint(&path).unwrap_err();
            assert!(
                matches!(err, TrainError::Checkpoint { .. }),
                "{name}: {err:?}"
            );
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("checkpoint {}: ", path.display())),
                "{name}: {text}"
            );
            assert!(text.contains(needle), "{name}: {text}");
            assert!(!text.contains('\n'), "{name}: {text}");
            assert_eq!(
                (bits(&model.get_weights()), bits(&model.optimizer_state())),
                before,
                "{name}"
            );
        }
        let missing = dir.path().join("none.safetensors");
        let err = model.load_checkpoint(&missing).unwrap_err().to_string();
        assert!(err.contains("none.safetensors: cannot read it"), "{err}");
    }

    /// The offset of the first byte of tensor `name`'s data in a checkpoint file.
    fn data_offset(bytes: &[u8], name: &str) -> usize {
        let (header_len, meta) = SafeTensors::read_metadata(bytes).unwrap();
        let info = meta.info(name).unwrap();
        8 + header_len + info.data_offsets.0
    }

    #[test]
    fn flipped_bytes_anywhere_are_caught_by_a_checksum_that_names_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = tiny_model(2);
        model
            .fit(&tiny_data(16, 8, 1), None, &epochs(2, 0), &mut [])
            .unwrap();
        let path = dir.path().join("c.safetensors");
        let mut meta = CheckpointMeta::default();
        meta.logs.set("val_loss", 0.25);
        model.save_checkpoint(&path, &meta).unwrap();
        let good = std::fs::read(&path).unwrap();
        let read = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            Checkpoint::read(&path).map_err(|e| e.to_string())
        };
        let read_back = read(&good).unwrap();
        assert_eq!(read_back.history, *model.history());
        assert_eq!(read_back.history.epochs, [0, 1]);
        // One bit of a weight, of an optimizer slot, of the last byte of the file.
        for name in ["dense/kernel", "optimizer/1/v", "dense_1/bias"] {
            let at = data_offset(&good, name) + 5;
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            let err = read(&bad).unwrap_err();
            assert!(
                err.contains(&format!(
                    "tensor `{name}` is corrupt: the recorded checksum is"
                )),
                "{name}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
        // A digit of the step in the header: still valid JSON and safetensors.
        let header = String::from_utf8_lossy(&good).into_owned();
        let at = header.find("\"step\":\"4\"").unwrap() + "\"step\":\"".len();
        let mut bad = good.clone();
        bad[at] = b'7';
        let err = read(&bad).unwrap_err();
        assert!(err.contains("its metadata is corrupt"), "{err}");
        // A checksum entry renamed: the state's checksum covers the metadata's keys.
        let c = read_back.clone();
        let tensors: Vec<(String, Bytes)> = c
            .weights
            .iter()
            .map(|(n, t)| (n.clone(), Bytes::new(t).unwrap()))
            .collect();
        let mut bytes = encode(tensors, c.metadata()).unwrap();
        assert!(read(&bytes).is_ok());
        let key = "\"crc32c.dense/bias\"";
        let at = String::from_utf8_lossy(&bytes).find(key).unwrap();
        bytes[at + 1..at + 7].copy_from_slice(b"crc32d");
        let err = read(&bytes).unwrap_err();
        assert!(err.contains("metadata is corrupt"), "{err}");
    }

    #[test]
    fn a_weight_under_the_optimizer_prefix_cannot_be_saved() {
        let model = tiny_model(1);
        let mut c = Checkpoint::capture(&model, CheckpointMeta::default());
        c.weights[0].0 = "optimizer/x".into();
        let err = c.save(Path::new("/tmp/never-written")).unwrap_err();
        assert!(
            err.to_string()
                .contains("clashes with the `optimizer/` prefix"),
            "{err}"
        );
    }
}
