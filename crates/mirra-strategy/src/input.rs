//! Distributed input: a global batch split into per-replica sub-batches.

use mirra_tensor::Tensor;

use crate::{Result, StrategyError};

/// Split a global batch (tensors sharing their first dimension) among `replicas` as
/// TensorFlow's `experimental_distribute_dataset` does: each replica gets
/// `ceil(batch / replicas)` examples in order, so a last partial batch leaves the last
/// replicas with fewer examples or none (`None`). The parts are views (no copy).
///
/// A replica's loss must then be divided by the global batch size (not its own), so that
/// the sum of the replicas' gradients is the gradient of the global batch's mean loss.
pub fn split_batch(batch: &[Tensor], replicas: usize) -> Result<Vec<Option<Vec<Tensor>>>> {
    if replicas == 0 {
        return Err(StrategyError::NoReplicas(0));
    }
    let Some(first) = batch.first() else {
        return Err(StrategyError::Invalid(
            "split_batch: a batch holds at least one tensor".into(),
        ));
    };
    let n = first.dims().first().copied().unwrap_or(0);
    for t in batch {
        if t.dims().first().copied() != Some(n) {
            return Err(StrategyError::Invalid(format!(
                "split_batch: the batch's tensors disagree on the batch dimension ({:?} and {:?})",
                first.dims(),
                t.dims()
            )));
        }
    }
    let per = n.div_ceil(replicas);
    (0..replicas)
        .map(|r| {
            let start = (r * per).min(n);
            let len = per.min(n - start);
            if len == 0 {
                return Ok(None);
            }
            let parts: Result<Vec<Tensor>> =
                batch.iter().map(|t| Ok(t.narrow(0, start, len)?)).collect();
            parts.map(Some)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mirra_tensor::Device;

    fn rows(n: usize) -> Vec<Tensor> {
        let x: Vec<f32> = (0..n * 2).map(|i| i as f32).collect();
        let y: Vec<i64> = (0..n as i64).collect();
        vec![
            Tensor::from_vec(x, &[n, 2], Device::Cpu).unwrap(),
            Tensor::from_vec(y, &[n], Device::Cpu).unwrap(),
        ]
    }

    fn sizes(parts: &[Option<Vec<Tensor>>]) -> Vec<usize> {
        parts
            .iter()
            .map(|p| p.as_ref().map_or(0, |t| t[0].dims()[0]))
            .collect()
    }

    #[test]
    fn full_and_partial_batches_split_as_tensorflow_does() {
        assert_eq!(sizes(&split_batch(&rows(256), 4).unwrap()), [64; 4]);
        assert_eq!(sizes(&split_batch(&rows(100), 4).unwrap()), [25; 4]);
        assert_eq!(sizes(&split_batch(&rows(10), 4).unwrap()), [3, 3, 3, 1]);
        assert_eq!(sizes(&split_batch(&rows(5), 4).unwrap()), [2, 2, 1, 0]);
        assert_eq!(sizes(&split_batch(&rows(1), 2).unwrap()), [1, 0]);
        let parts = split_batch(&rows(5), 2).unwrap();
        let second = parts[1].as_ref().unwrap();
        assert_eq!(second[1].to_vec::<i64>().unwrap(), vec![3, 4]);
        assert_eq!(second[0].to_vec::<f32>().unwrap(), vec![6.0, 7.0, 8.0, 9.0]);
    }

    #[test]
    fn bad_batches_are_errors() {
        assert!(split_batch(&rows(4), 0).is_err());
        assert!(split_batch(&[], 2).is_err());
        let mut b = rows(4);
        b[1] = rows(3).remove(1);
        let e = split_batch(&b, 2).unwrap_err().to_string();
        assert!(e.contains("disagree on the batch dimension"), "{e}");
    }
}
