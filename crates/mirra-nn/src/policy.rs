//! Mixed precision: which dtype a layer computes in, Keras's dtype policies.
//!
//! Variables stay in the network's dtype (f32: the master weights the optimizer updates).
//! Under a `mixed_*` policy the layers that do the arithmetic (matrix products and
//! convolutions, [`Autocast::Lower`]) compute in the 16-bit dtype: their inputs and
//! weights are cast on the way in, each cast an autograd op whose gradient casts back, so
//! every weight's gradient arrives in f32. Layers whose statistics need the range and
//! precision of f32 (batch norm, [`Autocast::Float32`]) cast 16-bit inputs up; the rest
//! follow their inputs (a merge of mixed inputs computes in the widest). The network's
//! output, the softmax and the loss are always in the variables' dtype, as Keras's
//! guide has the output layer in float32.

use mirra_autograd::Var;
use mirra_tensor::DType;

use crate::Result;

/// A dtype policy: Keras's `float32`, `mixed_bfloat16` and `mixed_float16`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Compute in the variables' dtype.
    #[default]
    Float32,
    /// Compute matrix products and convolutions in bfloat16 (f32's range, 8 bits of
    /// mantissa).
    MixedBfloat16,
    /// Compute matrix products and convolutions in float16 (11 bits of mantissa, a
    /// range up to 65504: gradients need loss scaling).
    MixedFloat16,
}

impl Policy {
    /// The policies by their Keras names.
    pub const ALL: [Policy; 3] = [Policy::Float32, Policy::MixedBfloat16, Policy::MixedFloat16];

    /// Keras's name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Float32 => "float32",
            Policy::MixedBfloat16 => "mixed_bfloat16",
            Policy::MixedFloat16 => "mixed_float16",
        }
    }

    /// The policy called `name`, if any.
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The 16-bit dtype [`Autocast::Lower`] layers compute in; `None` for `float32`.
    pub fn lower_dtype(self) -> Option<DType> {
        match self {
            Policy::Float32 => None,
            Policy::MixedBfloat16 => Some(DType::BF16),
            Policy::MixedFloat16 => Some(DType::F16),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What dtype a layer wants its inputs and weights in under a mixed policy (PyTorch's
/// autocast lists, per layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Autocast {
    /// The policy's 16-bit dtype: matrix products and convolutions.
    Lower,
    /// The variables' dtype whatever the policy: layers that sum statistics.
    Float32,
    /// The inputs' dtype, the widest of them when they differ: element-wise layers,
    /// pooling, shapes, merges.
    Follow,
}

/// The dtype a layer of `autocast` computes in under `policy`, given its inputs' dtypes
/// and the variables' dtype.
pub(crate) fn compute_dtype(
    policy: Policy,
    autocast: Autocast,
    inputs: &[DType],
    variables: DType,
) -> DType {
    match (autocast, policy.lower_dtype()) {
        (Autocast::Lower, Some(lower)) => lower,
        (Autocast::Lower, None) | (Autocast::Float32, _) => variables,
        (Autocast::Follow, _) => inputs
            .iter()
            .copied()
            .max_by_key(|d| d.size_in_bytes())
            .unwrap_or(variables),
    }
}

/// `vars` cast to `dtype` where they are floats of another dtype.
pub(crate) fn cast_all<'t>(vars: &[Var<'t>], dtype: DType) -> Result<Vec<Var<'t>>> {
    vars.iter()
        .map(|v| {
            if v.value().dtype().is_float() {
                Ok(v.to_dtype(dtype)?)
            } else {
                Ok(v.clone())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use mirra_autograd::Tape;
    use mirra_tensor::{Device, Tensor};

    use super::*;
    use crate::{
        Activation, BatchNormalization, Dense, Examples, ForwardCtx, Layer, Network, ParamSpec,
    };

    /// A layer that passes its input on and records the dtype it arrived in.
    #[derive(Clone, Debug, Default)]
    struct Probe(Arc<Mutex<Vec<DType>>>);

    impl Layer for Probe {
        fn kind(&self) -> &'static str {
            "probe"
        }

        fn build(&mut self, input: &[usize]) -> Result<(Vec<ParamSpec>, Vec<usize>)> {
            Ok((vec![], input.to_vec()))
        }

        fn forward<'t>(
            &self,
            x: &Var<'t>,
            _: &[Var<'t>],
            _: &mut ForwardCtx<'_>,
        ) -> Result<Var<'t>> {
            self.0.lock().unwrap().push(x.value().dtype());
            Ok(x.clone())
        }
    }

    /// Dense (linear: no relu kink for a rounding to flip), a probe, Dense (softmax): what
    /// the first layer computed in, and
    /// the output and the weights' gradients of one training pass.
    fn run(policy: Policy, first_layer: Option<Policy>) -> (DType, Tensor, Vec<Tensor>) {
        let probe = Probe::default();
        let seen = probe.0.clone();
        let mut net = Network::new(vec![
            Box::new(Dense::new(16, Activation::Linear)),
            Box::new(probe),
            Box::new(Dense::new(3, Activation::Softmax)),
        ]);
        net.build(&[5], 7).unwrap();
        net.set_policy(policy);
        if let Some(p) = first_layer {
            net.set_layer_policy(0, p).unwrap();
        }
        let x: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(x, &[4, 5], Device::Cpu).unwrap();
        let tape = Tape::new();
        let out = net.forward(&tape, x, true, Examples::default()).unwrap();
        let loss = out.output.square().unwrap().sum(&[], false).unwrap();
        let grads = tape.backward(&loss).unwrap();
        let grads = (0..net.params().len())
            .map(|i| grads.get(i).unwrap().clone())
            .collect();
        let dtype = seen.lock().unwrap()[0];
        (dtype, out.output.value().clone(), grads)
    }

    fn to_f32(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    }

    #[test]
    fn mixed_policies_compute_in_16_bits_and_keep_f32_weights_gradients_and_output() {
        let (dtype, out32, grads32) = run(Policy::Float32, None);
        assert_eq!(dtype, DType::F32);
        for (policy, lower) in [
            (Policy::MixedBfloat16, DType::BF16),
            (Policy::MixedFloat16, DType::F16),
        ] {
            let (dtype, out, grads) = run(policy, None);
            assert_eq!(dtype, lower, "{policy}: the dense layer's output");
            assert_eq!(out.dtype(), DType::F32, "{policy}: the softmax in f32");
            for (g, g32) in grads.iter().zip(&grads32) {
                assert_eq!(g.dtype(), DType::F32, "{policy}: gradients of f32 weights");
                let (a, b) = (to_f32(g), to_f32(g32));
                // bf16 keeps 8 bits of mantissa (f16 11): a relative error of 2^-9 per
                // rounding, a few roundings deep. A zero or unrelated gradient is off by ~1.
                let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| x * x).sum::<f32>().sqrt();
                let off =
                    norm(&mut a.iter().zip(&b).map(|(x, y)| x - y)) / norm(&mut b.iter().copied());
                assert!(
                    off < 0.03,
                    "{policy}: relative difference {off}: {a:?} vs {b:?}"
                );
            }
            // And not the f32 run itself: the product really was computed in 16 bits.
            assert_ne!(to_f32(&out), to_f32(&out32), "{policy}");
        }
    }

    #[test]
    fn a_layer_s_own_policy_overrides_the_network_s() {
        let (dtype, out, _) = run(Policy::MixedBfloat16, Some(Policy::Float32));
        assert_eq!(dtype, DType::F32);
        assert_eq!(out.dtype(), DType::F32);
        let (dtype, _, _) = run(Policy::Float32, Some(Policy::MixedFloat16));
        assert_eq!(dtype, DType::F16);
        let mut net = Network::new(vec![Box::new(Dense::new(2, Activation::Linear))]);
        let e = net.set_layer_policy(3, Policy::Float32).unwrap_err();
        assert!(e.to_string().contains("the network has 1 layers"), "{e}");
    }

    #[test]
    fn batch_norm_computes_in_f32_under_a_mixed_policy() {
        let probe = Probe::default();
        let seen = probe.0.clone();
        let mut net = Network::new(vec![
            Box::new(Dense::new(4, Activation::Linear)),
            Box::new(BatchNormalization::new()),
            Box::new(probe),
            Box::new(Dense::new(2, Activation::Softmax)),
        ]);
        net.build(&[3], 1).unwrap();
        net.set_policy(Policy::MixedBfloat16);
        let x = Tensor::from_vec(
            vec![0.5f32, -1.0, 2.0, 1.0, 0.0, -0.5],
            &[2, 3],
            Device::Cpu,
        )
        .unwrap();
        let tape = Tape::new();
        net.forward(&tape, x, true, Examples::default()).unwrap();
        assert_eq!(seen.lock().unwrap()[..], [DType::F32]);
        assert!(net.weights().iter().all(|w| w.dtype() == DType::F32));
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_none() {
        for p in Policy::ALL {
            assert_eq!(Policy::from_name(p.name()), Some(p));
        }
        assert_eq!(Policy::from_name("mixed_float8"), None);
        assert_eq!(Policy::default(), Policy::Float32);
    }

    #[test]
    fn each_kind_of_layer_computes_in_its_dtype() {
        use Autocast::*;
        use DType::{BF16, F16, F32, F64};
        let bf = Policy::MixedBfloat16;
        assert_eq!(compute_dtype(bf, Lower, &[F32], F32), BF16);
        assert_eq!(compute_dtype(Policy::MixedFloat16, Lower, &[F32], F32), F16);
        assert_eq!(compute_dtype(Policy::Float32, Lower, &[F32], F32), F32);
        assert_eq!(compute_dtype(bf, Float32, &[BF16], F32), F32);
        assert_eq!(compute_dtype(Policy::Float32, Float32, &[F64], F64), F64);
        assert_eq!(compute_dtype(bf, Follow, &[BF16], F32), BF16);
        assert_eq!(compute_dtype(bf, Follow, &[BF16, F32], F32), F32);
    }
}
