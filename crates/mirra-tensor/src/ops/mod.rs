//! Tensor operations, one module per family. Each family has one generic kernel that
//! serves every dtype it supports.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
mod bf16_accumulation;
mod bf16_gemm;
mod bf16_pack;
mod channels;
mod conv;
mod conv_shifted;
mod convolution;
mod cuda;
mod elementwise;
mod index;
mod matmul;
mod nan;
mod reduce;
mod shape_ops;
#[cfg(target_arch = "x86_64")]
mod shifted_avx512;
#[cfg(target_arch = "x86_64")]
mod shifted_avx512_bf16;
#[cfg(target_arch = "x86_64")]
mod shifted_operands;
mod softmax;

pub use bf16_accumulation::{bf16_accumulation_ablation, set_bf16_accumulation_ablation};
pub use bf16_gemm::{bf16_matmul_path, bf16_matmul_request_error};
pub use conv::{Padding, Window, MAX_SPATIAL};
pub use convolution::{conv_algorithm, set_conv_algorithm, ConvAlgorithm, ConvSaved};
pub use elementwise::{BinaryOp, UnaryOp};
