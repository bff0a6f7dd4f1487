//! Tensors: a shared device [`Buffer`](mirra_device::Buffer) seen through a strided
//! [`Layout`], and the CPU kernels that compute on them.
//!
//! Tensors are immutable values with cheap clones (the buffer is reference-counted);
//! views (transpose, slice, broadcast, reshape of contiguous data) share the buffer.
//! Every operation returns a [`Result`] whose error names the op, shapes and dtypes.
//! Floating-point kernels are written once, generically over
//! [`FloatElement`](mirra_device::FloatElement), and serve f32, f64, f16 and bf16.

mod cast;
mod dispatch;
mod error;
pub mod init;
mod layout;
mod ops;
mod shape;
mod tensor;
mod threads;

pub use error::TensorError;
pub use layout::Layout;
/// Whether f32 matrix products on CUDA devices may run in TF32 (off by default, as
/// PyTorch's `torch.backends.cuda.matmul.allow_tf32`); bf16 and f16 products always
/// accumulate in f32.
pub use mirra_cuda::runtime::{allow_tf32, set_allow_tf32};
pub use mirra_device::{vectorize, DType, Device, Element, FloatElement};
pub use ops::{
    bf16_accumulation_ablation, bf16_matmul_path, bf16_matmul_request_error, conv_algorithm,
    set_bf16_accumulation_ablation, set_conv_algorithm, BinaryOp, ConvAlgorithm, ConvSaved,
    Padding, UnaryOp, Window, MAX_SPATIAL,
};
pub use shape::{Shape, MAX_RANK};
pub use tensor::Tensor;
pub use threads::{join, num_threads, set_num_threads};

/// Paths that [`match_float_dtype!`] expands to in other crates; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use half::{bf16, f16};
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, TensorError>;
