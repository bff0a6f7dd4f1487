// What every mirra kernel shares: element types, their accumulation types, conversions,
// NaN-propagating max and min, the grid-stride loop and block reductions.
//
// Each kernel is a template over its element type, instantiated once per dtype under an
// `extern "C"` name `<kernel>_<dtype>` (MIRRA_FLOAT_KERNELS below): one piece of source
// serves f32, f64, f16 and bf16. 16-bit floats compute in f32, as on the CPU; f64 in f64.
// The kernels are compiled with --fmad=false (`cargo xtask kernels`): a * b + c rounds
// twice, as Rust's CPU kernels do, so element-wise results match the CPU's bit for bit
// wherever no library function (exp, log, tanh, erf) is involved.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned long long u64;

// NVRTC has no <cmath>: a quiet NaN and infinity by their bits (they convert to f64 exactly).
#define MIRRA_NAN __int_as_float(0x7fc00000)
#define MIRRA_INF __int_as_float(0x7f800000)
typedef long long i64;

// The accumulation type of an element type.
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round an accumulator to the element type (to nearest, ties to even).
template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// max and min that return NaN when either operand is NaN (PyTorch's and the CPU's rule).
template <typename A> __device__ __forceinline__ A max_nan(A a, A b) { return (a > b || a != a) ? a : b; }
template <typename A> __device__ __forceinline__ A min_nan(A a, A b) { return (a < b || a != a) ? a : b; }

// The index of this thread in a one-dimensional grid, and the grid's stride.
__device__ __forceinline__ u64 global_index() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 grid_stride() { return (u64)blockDim.x * gridDim.x; }

// The largest block any kernel here is launched with (block reductions size their shared
// memory by it).
#define MIRRA_MAX_BLOCK 1024

// Reduce `v` over the block with `op` (a functor); every thread gets the result. Uses
// warp shuffles, then one value per warp in shared memory.
template <typename A, typename Op> __device__ A block_reduce(A v, Op op) {
    __shared__ A warp_values[MIRRA_MAX_BLOCK / 32];
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
    __syncthreads();  // a previous call's readers are done with warp_values
    if (lane == 0) warp_values[warp] = v;
    __syncthreads();
    const unsigned warps = (blockDim.x + 31) / 32;
    if (warp == 0) {
        v = lane < warps ? warp_values[lane] : warp_values[0];
        for (int offset = 16; offset > 0; offset /= 2) {
            A other = __shfl_down_sync(0xffffffffu, v, offset);
            if (lane + offset < warps) v = op(v, other);
        }
        if (lane == 0) warp_values[0] = v;
    }
    __syncthreads();
    return warp_values[0];
}

// The reduction op codes of reduce.cu and collective.cu: mirra-cuda's `ReduceKernel`
// (src/kernels.rs, whose tests check that the numbers agree).
enum Reduce { REDUCE_SUM = 0, REDUCE_MEAN = 1, REDUCE_MAX = 2, REDUCE_MIN = 3, REDUCE_PRODUCT = 4 };

// One step of reduction `op` (the mean adds; its division comes last).
template <typename A> __device__ __forceinline__ A reduce_combine(int op, A a, A b) {
    switch (op) {
    case REDUCE_MAX: return max_nan(a, b);
    case REDUCE_MIN: return min_nan(a, b);
    case REDUCE_PRODUCT: return a * b;
    default: return a + b;
    }
}

struct SumOp { template <typename A> __device__ A operator()(A a, A b) const { return a + b; } };
struct MaxOp { template <typename A> __device__ A operator()(A a, A b) const { return max_nan(a, b); } };
struct MinOp { template <typename A> __device__ A operator()(A a, A b) const { return min_nan(a, b); } };

// Instantiate `kernel` (a macro taking the C++ type and the dtype's name) for every float.
#define MIRRA_FLOAT_KERNELS(kernel) \
    kernel(float, f32)              \
    kernel(double, f64)             \
    kernel(__half, f16)             \
    kernel(__nv_bfloat16, bf16)
