//! The optimizers' fused updates on a CUDA device against the same updates on the CPU,
//! for every optimizer configuration and float dtype. `#[ignore]`d without a GPU: the GPU
//! bundle runs them.
//!
//! Bounds: an update is a fixed sequence of IEEE operations per element (add, multiply,
//! divide, square root, max), computed in the accumulation type on both sides from the
//! same f64 coefficients, and the kernels are compiled without FMA contraction, so the
//! parameters and every state slot must agree bit for bit after several steps. The global
//! norm sums squares in f64 in another order on the device (per-block partials), so it
//! agrees to a relative 1e-12, and the clipped gradients to one unit in the last place.

use mirra_optim::{clip_by_global_norm, global_norm, Adam, AdamW, Optimizer, RmsProp, Sgd};
use mirra_tensor::{DType, Device, Tensor};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn gpu() -> Device {
    Device::cuda(0).expect("needs a CUDA device")
}

/// Values spread over about [-2, 2] from a fixed seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn random(dims: &[usize], dtype: DType, seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_slice(&values(n, seed), dims, Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// The bits of every element, as f64 (exact for every float dtype), on the host.
fn bits(t: &Tensor) -> Vec<u64> {
    let t = t.to_device(Device::Cpu).unwrap();
    let v = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every configuration of every optimizer whose device kernel takes another path.
fn configurations() -> Vec<(&'static str, Box<dyn Optimizer>)> {
    vec![
        ("sgd", Box::new(Sgd::new(0.05))),
        ("sgd momentum", Box::new(Sgd::new(0.05).momentum(0.9))),
        (
            "sgd nesterov, weight decay",
            Box::new(
                Sgd::new(0.05)
                    .momentum(0.9)
                    .nesterov(true)
                    .weight_decay(0.01),
            ),
        ),
        ("adam", Box::new(Adam::new(0.01))),
        ("adam amsgrad", Box::new(Adam::new(0.01).amsgrad(true))),
        ("adamw", Box::new(AdamW::new(0.01))),
        ("rmsprop", Box::new(RmsProp::new(0.01))),
        (
            "rmsprop centered, momentum",
            Box::new(RmsProp::new(0.01).centered(true).momentum(0.9)),
        ),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_optimizer_updates_on_the_device_as_on_the_cpu() {
    let shapes: [&[usize]; 3] = [&[7], &[33, 65], &[1000, 3]];
    for (what, opt) in configurations() {
        for dtype in FLOATS {
            let mut on_cpu = opt.box_clone();
            let mut on_gpu = opt.box_clone();
            let mut cpu: Vec<Tensor> = (0..shapes.len())
                .map(|i| random(shapes[i], dtype, i as u64))
                .collect();
            let mut dev: Vec<Tensor> = cpu.iter().map(|t| t.to_device(gpu()).unwrap()).collect();
            for step in 0..4u64 {
                let grads: Vec<Tensor> = (0..shapes.len())
                    .map(|i| random(shapes[i], dtype, 100 + 10 * step + i as u64))
                    .collect();
                let dev_grads: Vec<Tensor> =
                    grads.iter().map(|g| g.to_device(gpu()).unwrap()).collect();
                on_cpu.step(&mut cpu, &grads).unwrap();
                on_gpu.step(&mut dev, &dev_grads).unwrap();
            }
            for (i, (c, d)) in cpu.iter().zip(&dev).enumerate() {
                assert_eq!(
                    d.device(),
                    gpu(),
                    "{what} {dtype:?}: parameter {i} left the device"
                );
                assert_eq!(bits(c), bits(d), "{what} {dtype:?}: parameter {i}");
            }
            let (sc, sd) = (on_cpu.state(), on_gpu.state());
            assert_eq!(sc.len(), sd.len(), "{what} {dtype:?}: state slots");
            for ((nc, c), (nd, d)) in sc.iter().zip(&sd) {
                assert_eq!(nc, nd);
                assert_eq!(bits(c), bits(d), "{what} {dtype:?}: state {nc}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_device_state_restores_on_the_host_and_continues_identically() {
    // Checkpoints hold the state wherever it lived; a state saved from the GPU loads on the
    // CPU and the two continue bit for bit.
    let mut on_gpu = Adam::new(0.01);
    let mut p = vec![random(&[100], DType::F32, 1).to_device(gpu()).unwrap()];
    let g = random(&[100], DType::F32, 2);
    on_gpu.step(&mut p, &[g.to_device(gpu()).unwrap()]).unwrap();
    let state: Vec<(String, Tensor)> = on_gpu
        .state()
        .into_iter()
        .map(|(n, t)| (n, t.to_device(Device::Cpu).unwrap()))
        .collect();
    let mut on_cpu = Adam::new(0.01);
    on_cpu.load_state(&state).unwrap();
    let mut q = vec![p[0].to_device(Device::Cpu).unwrap()];
    on_cpu.step(&mut q, std::slice::from_ref(&g)).unwrap();
    on_gpu.step(&mut p, &[g.to_device(gpu()).unwrap()]).unwrap();
    assert_eq!(bits(&q[0]), bits(&p[0]));
}

#[test]
#[ignore = "needs a CUDA device"]
fn global_norm_and_clipping_on_the_device_match_the_cpu() {
    for dtype in FLOATS {
        let cpu: Vec<Tensor> = [&[300usize, 7][..], &[5], &[1 << 16]]
            .iter()
            .enumerate()
            .map(|(i, d)| random(d, dtype, 40 + i as u64))
            .collect();
        let dev: Vec<Tensor> = cpu.iter().map(|t| t.to_device(gpu()).unwrap()).collect();
        let (nc, nd) = (global_norm(&cpu).unwrap(), global_norm(&dev).unwrap());
        assert!(
            ((nc - nd) / nc).abs() <= 1e-12,
            "{dtype:?}: norm {nd} on the device, {nc} on the CPU"
        );
        let (mut cpu, mut dev) = (cpu, dev);
        clip_by_global_norm(&mut cpu, nc / 3.0).unwrap();
        clip_by_global_norm(&mut dev, nc / 3.0).unwrap();
        for (c, d) in cpu.iter().zip(&dev) {
            assert_eq!(d.device(), gpu());
            let (c, d) = (bits(c), bits(d));
            for (a, b) in c.iter().zip(&d) {
                let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
                // One unit in the last place of the dtype at this magnitude.
                let eps = match dtype {
                    DType::F64 => f64::EPSILON,
                    DType::F32 => f32::EPSILON as f64,
                    DType::F16 => 2f64.powi(-10),
                    _ => 2f64.powi(-7),
                };
                let ulp = eps * 2f64.powf(a.abs().max(1e-30).log2().floor());
                // Each side scales by max_norm over its own norm: the norms' relative
                // difference carries into the clipped values, plus one rounding.
                let bound = ulp + a.abs() * 2.0 * ((nc - nd) / nc).abs();
                assert!((a - b).abs() <= bound, "{dtype:?}: clipped {b}, want {a}");
            }
        }
    }
}

/// Loss scaling on the device: the gradients unscaled and checked by one kernel each,
/// one flag read per step. A finite step updates as the CPU's does (bit for bit: the
/// unscaling is one multiply in the accumulation type, then the same Adam); an infinity
/// or a NaN in any one gradient skips the step and halves the scale on both, the weights
/// unchanged.
#[test]
#[ignore = "needs a CUDA device"]
fn loss_scaling_skips_and_updates_on_the_device_as_on_the_cpu() {
    use mirra_optim::LossScaleOptimizer;
    for dtype in FLOATS {
        let params = [random(&[33, 65], dtype, 1), random(&[7], dtype, 2)];
        let mut cpu = LossScaleOptimizer::new(Box::new(Adam::new(0.01)));
        let mut gpu_opt = LossScaleOptimizer::new(Box::new(Adam::new(0.01)));
        let mut on_cpu: Vec<Tensor> = params.to_vec();
        let mut on_gpu: Vec<Tensor> = params.iter().map(|p| p.to_device(gpu()).unwrap()).collect();
        for step in 0..4u64 {
            // Gradients scaled by the current scale, as backward of a scaled loss gives;
            // step 2's second gradient holds an infinity (or a NaN for the 16-bit types).
            let scale = cpu.loss_scale().unwrap();
            let mut grads: Vec<Tensor> = [&[33usize, 65][..], &[7]]
                .iter()
                .enumerate()
                .map(|(i, dims)| {
                    random(dims, dtype, 10 + step * 2 + i as u64)
                        .scale(scale)
                        .unwrap()
                })
                .collect();
            if step == 2 {
                let mut v = grads[1]
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec::<f64>()
                    .unwrap();
                v[3] = if dtype == DType::F32 {
                    f64::INFINITY
                } else {
                    f64::NAN
                };
                grads[1] = Tensor::from_slice(&v, &[7], Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
            }
            let device_grads: Vec<Tensor> =
                grads.iter().map(|g| g.to_device(gpu()).unwrap()).collect();
            let before: Vec<Vec<u64>> = on_gpu.iter().map(bits).collect();
            cpu.step(&mut on_cpu, &grads).unwrap();
            gpu_opt.step(&mut on_gpu, &device_grads).unwrap();
            assert_eq!(
                cpu.loss_scale(),
                gpu_opt.loss_scale(),
                "{dtype:?} step {step}"
            );
            if step == 2 {
                assert_eq!(gpu_opt.loss_scale(), Some(scale / 2.0), "{dtype:?}: halved");
                let after: Vec<Vec<u64>> = on_gpu.iter().map(bits).collect();
                assert_eq!(before, after, "{dtype:?}: a skipped step changes no weight");
            }
            for (c, g) in on_cpu.iter().zip(&on_gpu) {
                assert_eq!(bits(c), bits(g), "{dtype:?} step {step}");
            }
        }
    }
}
