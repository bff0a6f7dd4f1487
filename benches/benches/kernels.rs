//! Criterion benches of the hot CPU kernels of a training step.
//!
//! Names are tagged with the device (`cpu/matmul/1024`) so that CUDA benches can sit next
//! to them later. Matmul throughput counts floating-point operations (`2 m k n`) as
//! criterion "elements", so its `Gelem/s` reads as GFLOP/s; the other kernels count tensor
//! elements. Kept short (small samples, short windows) so a full run takes about a minute.

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use mirra_benches::{elems, uniform, DEVICE_TAG};
use mirra_tensor::{num_threads, set_num_threads, Tensor};

/// Short windows: these kernels are stable within a few percent after a second.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group(format!("{DEVICE_TAG}/matmul"));
    // A 1024 product takes milliseconds: flat sampling keeps the window short.
    group.sampling_mode(SamplingMode::Flat);
    for n in [256usize, 512, 1024] {
        let a = uniform(&[n, n], 1).unwrap();
        let b = uniform(&[n, n], 2).unwrap();
        group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        group.bench_function(BenchmarkId::from_parameter(n), |bench| {
            bench.iter(|| black_box(a.matmul(&b).unwrap()))
        });
    }
    // The MNIST MLP's first layer at batch 256: forward, and the two products of its
    // backward, each with a transposed view as one operand (no copy is made).
    let (batch, inputs, units) = (256usize, 784usize, 128usize);
    let x = uniform(&[batch, inputs], 3).unwrap();
    let w = uniform(&[inputs, units], 4).unwrap();
    let g = uniform(&[batch, units], 5).unwrap();
    let flops = 2 * (batch * inputs * units) as u64;
    let cases: [(&str, Tensor, Tensor); 3] = [
        ("mlp_forward_256x784x128", x.clone(), w.clone()),
        ("mlp_grad_kernel_xT_784x256x128", x.t().unwrap(), g.clone()),
        ("mlp_grad_input_wT_256x128x784", g, w.t().unwrap()),
    ];
    for (name, lhs, rhs) in &cases {
        group.throughput(Throughput::Elements(flops));
        group.bench_function(*name, |bench| {
            bench.iter(|| black_box(lhs.matmul(rhs).unwrap()))
        });
    }
    group.finish();
}

/// The MLP's forward products (batch 64, and the first layer at batch 256) on one thread
/// and on all of them: where the parallel split starts to pay (mirra-tensor's
/// `PARALLEL_MIN_FLOPS`).
fn matmul_threads(c: &mut Criterion) {
    let all = num_threads();
    let mut group = c.benchmark_group(format!("{DEVICE_TAG}/matmul_threads"));
    for (m, k, n) in [
        (64usize, 784usize, 128usize),
        (64, 128, 64),
        (64, 64, 10),
        (256, 784, 128),
    ] {
        let a = uniform(&[m, k], 11).unwrap();
        let b = uniform(&[k, n], 12).unwrap();
        group.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        for threads in [1, all] {
            set_num_threads(threads);
            group.bench_function(format!("{m}x{k}x{n}/{threads}"), |bench| {
                bench.iter(|| black_box(a.matmul(&b).unwrap()))
            });
        }
    }
    set_num_threads(all);
    group.finish();
}

fn elementwise(c: &mut Criterion) {
    let dims = [256usize, 128];
    let x = uniform(&dims, 6).unwrap();
    let grad = uniform(&dims, 7).unwrap();
    let bias = uniform(&dims[1..], 8).unwrap();
    let n = elems(&dims);

    let mut group = c.benchmark_group(format!("{DEVICE_TAG}/bias_add"));
    group.throughput(Throughput::Elements(n));
    group.bench_function("256x128+128", |bench| {
        bench.iter(|| black_box(x.add(&bias).unwrap()))
    });
    group.finish();

    let mut group = c.benchmark_group(format!("{DEVICE_TAG}/relu"));
    group.throughput(Throughput::Elements(n));
    group.bench_function("256x128", |bench| {
        bench.iter(|| black_box(x.relu().unwrap()))
    });
    group.finish();

    let mut group = c.benchmark_group(format!("{DEVICE_TAG}/relu_backward"));
    group.throughput(Throughput::Elements(n));
    group.bench_function("256x128", |bench| {
        bench.iter(|| black_box(grad.relu_backward(&x).unwrap()))
    });
    group.finish();
}

fn softmax(c: &mut Criterion) {
    let dims = [256usize, 10];
    let logits = uniform(&dims, 9).unwrap();
    for (name, f) in [
        ("softmax", Tensor::softmax as fn(&Tensor, isize) -> _),
        ("log_softmax", Tensor::log_softmax),
    ] {
        let mut group = c.benchmark_group(format!("{DEVICE_TAG}/{name}"));
        group.throughput(Throughput::Elements(elems(&dims)));
        group.bench_function("256x10/axis-1", |bench| {
            bench.iter(|| black_box(f(&logits, -1).unwrap()))
        });
        group.finish();
    }
}

fn reduce(c: &mut Criterion) {
    let dims = [256usize, 128];
    let x = uniform(&dims, 10).unwrap();
    let mut group = c.benchmark_group(format!("{DEVICE_TAG}/sum"));
    group.throughput(Throughput::Elements(elems(&dims)));
    // The bias gradient of a dense layer: a sum over the batch axis.
    group.bench_function("256x128/axis0", |bench| {
        bench.iter(|| black_box(x.sum(&[0], false).unwrap()))
    });
    group.finish();
}

fn report_threads(_: &mut Criterion) {
    eprintln!("mirra-benches: kernels use {} thread(s)", num_threads());
}

criterion_group! {
    name = kernels;
    config = config();
    targets = report_threads, matmul, matmul_threads, elementwise, softmax, reduce
}
criterion_main!(kernels);
