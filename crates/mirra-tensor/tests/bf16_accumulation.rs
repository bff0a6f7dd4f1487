//! The bf16-accumulation ablation (`set_bf16_accumulation_ablation`), in a process of its
//! own: the switch is global, and would change the bf16 products of tests running beside it.

use mirra_tensor::{set_bf16_accumulation_ablation, DType, Device, Tensor};

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

/// The ablation computes what it says: a sum of 512 ones stalls at 256 in bf16 (256 + 1
/// is a tie that rounds back to even), where f32 accumulation gives 512; batched and
/// broadcast operands are handled as the kernel it replaces handles them; switched off,
/// the same product is exact again.
#[test]
fn a_bf16_running_sum_stalls_where_f32_does_not() {
    let ones = Tensor::ones(&[1, 512], DType::BF16, Device::Cpu).unwrap();
    let col = Tensor::ones(&[512, 1], DType::BF16, Device::Cpu).unwrap();
    let batched = Tensor::ones(&[3, 2, 512], DType::BF16, Device::Cpu).unwrap();
    // Distinct values, to catch a row or batch mixed up: each row of `a` times a column
    // of small integers, which bf16 holds and sums exactly below 256.
    let a = Tensor::from_vec(
        (0..2 * 3 * 4).map(|v| (v % 7) as f32).collect(),
        &[2, 3, 4],
        Device::Cpu,
    )
    .unwrap()
    .to_dtype(DType::BF16)
    .unwrap();
    let b = Tensor::from_vec(
        (0..4 * 5).map(|v| (v % 5) as f32).collect(),
        &[4, 5],
        Device::Cpu,
    )
    .unwrap()
    .to_dtype(DType::BF16)
    .unwrap();

    set_bf16_accumulation_ablation(true);
    let stalled = values(&ones.matmul(&col).unwrap())[0];
    let many = batched.matmul(&col).unwrap();
    let small = values(&a.matmul(&b).unwrap());
    set_bf16_accumulation_ablation(false);
    let exact = values(&ones.matmul(&col).unwrap())[0];
    let small_f32 = values(&a.matmul(&b).unwrap());

    assert_eq!((stalled, exact), (256.0, 512.0));
    assert_eq!(many.dims(), [3, 2, 1]);
    assert!(values(&many).iter().all(|&v| v == 256.0));
    assert_eq!(small, small_f32);
}
