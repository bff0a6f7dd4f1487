//! DDP-style gradient synchronisation: gradients grouped into buckets, each bucket's
//! all-reduce submitted as soon as all of its gradients are ready during backward.
//!
//! Buckets are laid out once, from the parameters in reverse order (the order in which
//! backward produces their gradients: last layer first), up to `bucket_bytes` each and
//! one dtype per bucket. During backward, [`GradientReducer::grad_ready`] copies each
//! gradient into its bucket; when a bucket is complete it is submitted
//! ([`Communicator::submit_all_reduce`]), always in bucket order so that every replica
//! submits the same collectives in the same order, and the replica's progress thread
//! reduces it while backward goes on. [`GradientReducer::finish`] submits what is left,
//! waits for every bucket and hands out the summed gradients as views of the bucket
//! buffers (no copy); [`GradientReducer::reclaim`] takes the buffers back after the
//! optimizer step, so a warmed-up step allocates no buffer.
//!
//! Gradient accumulation (DDP's `no_sync`): a step begun with `sync == false` only adds
//! the gradients to local accumulators; the next synchronised step adds them in before
//! its buckets are reduced.

use std::time::{Duration, Instant};

use mirra_collectives::{Communicator, Pending, ReduceOp};
use mirra_device::{trace, Buffer, DType, Device};
use mirra_tensor::{Tensor, TensorError};

use crate::{Result, StrategyError};

/// PyTorch DDP's default bucket size (`bucket_cap_mb = 25`).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Where a parameter's gradient lives in the buckets.
#[derive(Debug)]
struct Slot {
    bucket: usize,
    /// Element offset in the bucket.
    offset: usize,
    dims: Vec<usize>,
    /// The parameter's dtype, which its reduced gradient is handed out in.
    dtype: DType,
    ready: bool,
}

#[derive(Debug)]
struct Bucket {
    dtype: DType,
    /// Elements.
    len: usize,
    /// Gradients still to arrive this step.
    missing: usize,
    params: usize,
    /// The flat buffer while it is being filled.
    storage: Option<Buffer>,
    pending: Option<Pending>,
    /// Reduced on the replica's own thread (or a group of one: nothing to reduce).
    done: Option<Buffer>,
    /// The reduced buffer, lent out as gradient views until `reclaim`.
    reduced: Option<Tensor>,
}

/// One replica's gradient buckets (see the module documentation).
#[derive(Debug)]
pub struct GradientReducer {
    slots: Vec<Slot>,
    buckets: Vec<Bucket>,
    next_submit: usize,
    sync: bool,
    /// Local gradient sums of unsynchronised micro-steps, per parameter.
    acc: Vec<Option<Tensor>>,
    /// Time `finish` spent waiting for reductions, since the last `take_wait_time`.
    waited: Duration,
    /// Where the parameters, and so the buckets, live.
    device: Device,
}

impl GradientReducer {
    /// Buckets for gradients shaped like `params`, each at most `bucket_bytes` (a
    /// parameter larger than that gets a bucket of its own), on the parameters' device.
    pub fn new(params: &[Tensor], bucket_bytes: usize) -> GradientReducer {
        GradientReducer::with_wire_dtype(params, bucket_bytes, None)
    }

    /// [`GradientReducer::new`] with the float gradients all-reduced in `wire` (bf16 or
    /// f16: half the bytes moved, as DDP's compression hooks) and handed out in their
    /// parameters' dtype again. Each gradient is rounded to `wire` once as it enters its
    /// bucket; the collective then adds in f32 and rounds every partial sum it stores to
    /// `wire` (each ring hop; `direct` adds all ranks in one pass and rounds once).
    pub fn with_wire_dtype(
        params: &[Tensor],
        bucket_bytes: usize,
        wire: Option<DType>,
    ) -> GradientReducer {
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        let mut slots: Vec<Option<Slot>> = (0..params.len()).map(|_| None).collect();
        let mut buckets: Vec<Bucket> = vec![];
        for (i, p) in params.iter().enumerate().rev() {
            let dtype = match wire {
                Some(w) if p.dtype().is_float() => w,
                _ => p.dtype(),
            };
            let len = p.elem_count();
            let fits = buckets.last().is_some_and(|b| {
                b.dtype == dtype && (b.len + len) * dtype.size_in_bytes() <= bucket_bytes
            });
            if !fits {
                buckets.push(Bucket {
                    dtype,
                    len: 0,
                    missing: 0,
                    params: 0,
                    storage: None,
                    pending: None,
                    done: None,
                    reduced: None,
                });
            }
            let b = buckets.len() - 1;
            let bucket = &mut buckets[b];
            slots[i] = Some(Slot {
                bucket: b,
                offset: bucket.len,
                dims: p.dims().to_vec(),
                dtype: p.dtype(),
                ready: false,
            });
            bucket.len += len;
            bucket.params += 1;
        }
        GradientReducer {
            slots: slots.into_iter().flatten().collect(),
            buckets,
            next_submit: 0,
            sync: true,
            acc: (0..params.len()).map(|_| None).collect(),
            waited: Duration::ZERO,
            device,
        }
    }

    /// The number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Start a step: synchronised (`sync`), or one whose gradients are only accumulated
    /// locally until the next synchronised step.
    pub fn begin(&mut self, sync: bool) -> Result<()> {
        self.sync = sync;
        self.next_submit = 0;
        for s in &mut self.slots {
            s.ready = false;
        }
        for b in &mut self.buckets {
            b.missing = b.params;
            if sync && b.storage.is_none() {
                b.storage = Some(Buffer::alloc(b.dtype, b.len, self.device).map_err(tensor)?);
            }
        }
        Ok(())
    }

    /// Parameter `key`'s gradient is final: copy it into its bucket and submit every
    /// bucket that is now complete, in order.
    pub fn grad_ready(&mut self, comm: &dyn Communicator, key: usize, grad: &Tensor) -> Result<()> {
        let slot = self.slots.get(key).ok_or_else(|| {
            StrategyError::Invalid(format!(
                "gradient for parameter {key}, but the reducer has {} parameters",
                self.slots.len()
            ))
        })?;
        if slot.dims != grad.dims() {
            return Err(StrategyError::Invalid(format!(
                "gradient of parameter {key} has shape {:?}, the parameter {:?}",
                grad.dims(),
                slot.dims
            )));
        }
        if slot.ready {
            return Ok(());
        }
        let total = match self.acc[key].take() {
            Some(acc) => acc.add(grad)?,
            None => grad.clone(),
        };
        if !self.sync {
            self.acc[key] = Some(total);
            self.slots[key].ready = true;
            return Ok(());
        }
        self.write(key, Some(&total))?;
        self.submit_complete(comm, false)
    }

    /// Copy a gradient (or zeros) into its bucket and count it.
    fn write(&mut self, key: usize, grad: Option<&Tensor>) -> Result<()> {
        let slot = &mut self.slots[key];
        let _span = trace::span_with("comm", || {
            format!("copy gradient {key} into bucket {}", slot.bucket).into()
        });
        let bucket = &mut self.buckets[slot.bucket];
        let storage = bucket
            .storage
            .as_mut()
            .ok_or_else(|| StrategyError::Invalid("reducer: step not begun".into()))?;
        let n: usize = slot.dims.iter().product();
        let g = match grad {
            Some(g) => g.to_dtype(bucket.dtype)?.contiguous()?,
            None => Tensor::zeros(&[n], bucket.dtype, storage.device())?,
        };
        storage
            .copy_range_from(slot.offset, g.buffer(), g.layout().offset(), n)
            .map_err(TensorError::from)?;
        slot.ready = true;
        bucket.missing -= 1;
        Ok(())
    }

    /// Start the reduction of every complete bucket not started yet, in bucket order:
    /// in the background during backward, or, once backward is over (`inline`), on this
    /// thread, which then has nothing else to do and saves the hand-offs to and from the
    /// progress thread (a blocking collective first waits for the submitted ones, so the
    /// order holds).
    fn submit_complete(&mut self, comm: &dyn Communicator, inline: bool) -> Result<()> {
        while let Some(b) = self.buckets.get_mut(self.next_submit) {
            if b.missing > 0 {
                break;
            }
            let index = self.next_submit;
            let mut storage = b.storage.take().expect("a complete bucket has its storage");
            if comm.world_size() == 1 {
                b.done = Some(storage);
            } else if inline {
                let _span =
                    trace::span_with("comm", || format!("all-reduce bucket {index}").into());
                comm.all_reduce(&mut storage, ReduceOp::Sum)?;
                b.done = Some(storage);
            } else {
                let _span = trace::span_with("comm", || {
                    format!("submit all-reduce of bucket {index}").into()
                });
                b.pending = Some(comm.submit_all_reduce(storage, ReduceOp::Sum)?);
            }
            self.next_submit += 1;
        }
        Ok(())
    }

    /// End a synchronised step: gradients that never arrived are zero (or the local
    /// accumulation), every bucket is reduced, and the summed gradients come back in
    /// parameter order as views of the bucket buffers. Returns `None` after an
    /// accumulation-only step.
    pub fn finish(&mut self, comm: &dyn Communicator) -> Result<Option<Vec<Tensor>>> {
        if !self.sync {
            return Ok(None);
        }
        for key in 0..self.slots.len() {
            if !self.slots[key].ready {
                let acc = self.acc[key].take();
                self.write(key, acc.as_ref())?;
            }
        }
        let start = Instant::now();
        self.submit_complete(comm, true)?;
        for (index, b) in self.buckets.iter_mut().enumerate() {
            let buffer = match (b.done.take(), b.pending.take()) {
                (Some(buffer), _) => buffer,
                (None, Some(pending)) => {
                    let _span =
                        trace::span_with("comm", || format!("wait for bucket {index}").into());
                    pending.wait()?
                }
                (None, None) => unreachable!("every bucket was started"),
            };
            b.reduced = Some(Tensor::from_buffer(buffer, &[b.len])?);
        }
        self.waited += start.elapsed();
        let grads = self
            .slots
            .iter()
            .map(|s| {
                let whole = self.buckets[s.bucket].reduced.as_ref().expect("reduced");
                let n = s.dims.iter().product();
                // A view of the bucket; a converted copy when it travelled in 16 bits.
                let g = whole.narrow(0, s.offset, n)?.reshape(&s.dims)?;
                Ok(g.to_dtype(s.dtype)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(grads))
    }

    /// Time spent waiting for reductions after backward (communication that backward did
    /// not hide) since the last call; resets the count.
    pub fn take_wait_time(&mut self) -> Duration {
        std::mem::take(&mut self.waited)
    }

    /// Take the bucket buffers back once the gradients handed out by
    /// [`finish`](GradientReducer::finish) are dropped, for the next step.
    pub fn reclaim(&mut self, grads: Vec<Tensor>) {
        drop(grads);
        for b in &mut self.buckets {
            if let Some(t) = b.reduced.take() {
                // A gradient view still held elsewhere keeps the buffer; `begin`
                // allocates a new one then.
                b.storage = t.into_buffer().ok();
            }
        }
    }
}

fn tensor(e: mirra_device::DeviceError) -> StrategyError {
    StrategyError::Tensor(e.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MirroredStrategy, StrategyConfig};
    use mirra_tensor::init::{rng, Initializer};

    const SHAPES: [&[usize]; 4] = [&[4, 3], &[3], &[3, 2], &[2]];

    fn params() -> Vec<Tensor> {
        params_on(Device::Cpu)
    }

    fn params_on(device: Device) -> Vec<Tensor> {
        SHAPES
            .iter()
            .map(|d| Tensor::zeros(d, DType::F32, device).unwrap())
            .collect()
    }

    /// Replica `r`'s gradients at micro-step `k`.
    fn grads(r: usize, k: u64) -> Vec<Tensor> {
        let mut g = rng(100 * r as u64 + k);
        let init = Initializer::Normal {
            mean: 0.0,
            std: 1.0,
        };
        SHAPES
            .iter()
            .map(|d| init.init(d, DType::F32, Device::Cpu, &mut g).unwrap())
            .collect()
    }

    /// The strategy of `replicas` replicas: on the host (`ring`), or all on `cuda:0`
    /// (`cuda-ring`).
    fn strategy(replicas: usize, device: Device) -> MirroredStrategy {
        let config = if device.is_cpu() {
            StrategyConfig::cpu(replicas).with_collective("ring")
        } else {
            StrategyConfig::devices(&vec![device; replicas]).unwrap()
        };
        MirroredStrategy::new(config).unwrap()
    }

    /// Run `steps` steps (each `micro` micro-steps, the last synchronised) on `replicas`
    /// replicas with buckets of `bucket_bytes`; replica 1 gets no data in its last
    /// micro-step when `starve` (its gradients never arrive). Returns every replica's
    /// final gradients.
    fn reduce(
        replicas: usize,
        bucket_bytes: usize,
        micro: u64,
        starve: bool,
    ) -> Vec<Vec<Vec<f32>>> {
        reduce_on(Device::Cpu, replicas, bucket_bytes, micro, starve)
    }

    /// [`reduce`] with the parameters and gradients on `device`.
    fn reduce_on(
        device: Device,
        replicas: usize,
        bucket_bytes: usize,
        micro: u64,
        starve: bool,
    ) -> Vec<Vec<Vec<f32>>> {
        let s = strategy(replicas, device);
        s.run(|ctx| {
            assert_eq!(ctx.device, device);
            let mut red = GradientReducer::new(&params_on(device), bucket_bytes);
            let mut out = vec![];
            for step in 0..2 {
                for k in 0..micro {
                    let sync = k + 1 == micro;
                    red.begin(sync).unwrap();
                    let skip = starve && sync && ctx.replica_id == 1;
                    if !skip {
                        // Backward hands gradients out last parameter first.
                        for (i, g) in grads(ctx.replica_id, step * 10 + k)
                            .iter()
                            .enumerate()
                            .rev()
                        {
                            let g = g.to_device(device).unwrap();
                            red.grad_ready(ctx.comm, i, &g).unwrap();
                        }
                    }
                    if let Some(g) = red.finish(ctx.comm).unwrap() {
                        out = g.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
                        red.reclaim(g);
                    }
                }
            }
            out
        })
        .unwrap()
        .into_values()
    }

    /// The sum over replicas (and micro-steps) of the last step's gradients, in f64.
    fn expected(replicas: usize, micro: u64, starve: bool) -> Vec<Vec<f64>> {
        let mut want: Vec<Vec<f64>> = SHAPES
            .iter()
            .map(|d| vec![0.0; d.iter().product()])
            .collect();
        for r in 0..replicas {
            for k in 0..micro {
                if starve && r == 1 && k + 1 == micro {
                    continue;
                }
                for (w, g) in want.iter_mut().zip(grads(r, 10 + k)) {
                    for (a, b) in w.iter_mut().zip(g.to_vec::<f32>().unwrap()) {
                        *a += b as f64;
                    }
                }
            }
        }
        want
    }

    fn assert_close(got: &[Vec<f32>], want: &[Vec<f64>]) {
        for (g, w) in got.iter().zip(want) {
            for (a, b) in g.iter().zip(w) {
                assert!(
                    (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn layout_is_reverse_order_within_the_cap() {
        assert_eq!(GradientReducer::new(&params(), 1 << 20).num_buckets(), 1);
        // 2 + 6 floats fit in 32 bytes; then 3 alone (12 bytes + 48 > 32); then 12.
        assert_eq!(GradientReducer::new(&params(), 32).num_buckets(), 3);
        assert_eq!(GradientReducer::new(&params(), 1).num_buckets(), 4);
    }

    #[test]
    fn every_replica_gets_the_sum_bucketed_or_not() {
        sums_bucketed_or_not(Device::Cpu);
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn every_replica_on_a_gpu_gets_the_sum_bucketed_or_not() {
        sums_bucketed_or_not(Device::cuda(0).unwrap());
        // Accumulation and a replica without data, with buckets in device memory.
        let got = reduce_on(Device::cuda(0).unwrap(), 3, 16, 2, true);
        assert_close(&got[2], &expected(3, 2, true));
    }

    fn sums_bucketed_or_not(device: Device) {
        for replicas in [1, 2, 3] {
            let whole = reduce_on(device, replicas, 1 << 20, 1, false);
            let split = reduce_on(device, replicas, 8, 1, false);
            for r in &whole {
                assert_eq!(r, &whole[0], "replicas differ");
            }
            assert_close(&whole[0], &expected(replicas, 1, false));
            assert_close(&split[0], &expected(replicas, 1, false));
            if replicas <= 2 {
                // A sum of two is the same in any order: bucketing changes no bit.
                assert_eq!(whole, split);
            }
        }
    }

    /// Gradients all-reduced in bf16 and f16 come back in f32, within the rounding of
    /// each gradient to 16 bits and of every partial sum the ring stores (n - 1 hops), of
    /// the exact sum; and not equal to the f32 all-reduce (the bytes really were 16-bit).
    #[test]
    fn gradients_reduced_in_16_bits_come_back_in_f32_within_their_rounding() {
        for (wire, eps) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))] {
            for replicas in [2, 3, 4] {
                let s = strategy(replicas, Device::Cpu);
                let got = s
                    .run(|ctx| {
                        let mut red = GradientReducer::with_wire_dtype(&params(), 24, Some(wire));
                        red.begin(true).unwrap();
                        for (i, g) in grads(ctx.replica_id, 10).iter().enumerate().rev() {
                            red.grad_ready(ctx.comm, i, g).unwrap();
                        }
                        let g = red.finish(ctx.comm).unwrap().unwrap();
                        assert!(g.iter().all(|t| t.dtype() == DType::F32));
                        g.iter()
                            .map(|t| t.to_vec::<f32>().unwrap())
                            .collect::<Vec<_>>()
                    })
                    .unwrap()
                    .into_values();
                for r in &got {
                    assert_eq!(r, &got[0], "{wire}: replicas differ");
                }
                let want = expected(replicas, 1, false);
                let mut worst = 0f64;
                for (k, (g, w)) in got[0].iter().zip(&want).enumerate() {
                    for (j, (a, b)) in g.iter().zip(w).enumerate() {
                        // Σ |g_r|: the size each rounding is relative to.
                        let size: f64 = (0..replicas)
                            .map(|r| grads(r, 10)[k].to_vec::<f32>().unwrap()[j].abs() as f64)
                            .sum();
                        let bound = replicas as f64 * eps * size + 1e-30;
                        let err = (*a as f64 - b).abs();
                        assert!(err <= bound, "{wire}, {replicas} replicas: {a} vs {b}");
                        worst = worst.max(err / bound);
                    }
                }
                assert!(worst > 0.0, "{wire}: no rounding at all");
            }
        }
    }

    #[test]
    fn accumulation_and_missing_gradients() {
        let got = reduce(2, 16, 3, false);
        assert_eq!(got[0], got[1]);
        assert_close(&got[0], &expected(2, 3, false));
        // Replica 1 has no data in the synchronised micro-step: its accumulated
        // gradients still count, and nothing hangs.
        let got = reduce(3, 16, 2, true);
        assert_close(&got[2], &expected(3, 2, true));
        // No data at all on a replica, no accumulation: it contributes zeros.
        let got = reduce(2, 16, 1, true);
        assert_close(&got[0], &expected(2, 1, true));
    }

    #[test]
    fn wrong_gradients_are_errors() {
        let s = MirroredStrategy::cpu(1).unwrap();
        s.run(|ctx| {
            let mut red = GradientReducer::new(&params(), 64);
            red.begin(true).unwrap();
            let g = Tensor::zeros(&[2, 2], DType::F32, Device::Cpu).unwrap();
            let e = red.grad_ready(ctx.comm, 0, &g).unwrap_err().to_string();
            assert!(e.contains("has shape [2, 2], the parameter [4, 3]"), "{e}");
            let e = red.grad_ready(ctx.comm, 9, &g).unwrap_err().to_string();
            assert!(e.contains("the reducer has 4 parameters"), "{e}");
        })
        .unwrap();
    }
}
