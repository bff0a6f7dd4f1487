//! Tensor operations, one module per family. Each family has one generic kernel that
//! serves every dtype it supports.

mod bf16_accumulation;
mod channels;
mod conv;
mod cuda;
mod elementwise;
mod index;
mod matmul;
mod nan;
mod reduce;
mod shape_ops;
mod softmax;

pub use bf16_accumulation::{bf16_accumulation_ablation, set_bf16_accumulation_ablation};
pub use conv::{Padding, Window, MAX_SPATIAL};
pub use elementwise::{BinaryOp, UnaryOp};
pub use matmul::bf16_matmul_path;
