// The element-wise reduction of the collectives (the GPU ring of the next issue): dst =
// op(dst, src) over n elements, for every dtype, and the mean's final division. Floats
// compute in their accumulation type; integers wrap (as NCCL's and the CPU collectives').
// Op codes: `enum Reduce` of common.cuh (sum, mean, max, min, product; mean adds here
// and divides once at the end with `divide_*`).
#include "common.cuh"

__device__ __forceinline__ int to_acc(int x) { return x; }
__device__ __forceinline__ i64 to_acc(i64 x) { return x; }
__device__ __forceinline__ unsigned to_acc(unsigned char x) { return x; }
template <typename T, typename A> __device__ __forceinline__ T narrow(A x) { return from_acc<T>(x); }
template <> __device__ __forceinline__ int narrow<int, int>(int x) { return x; }
template <> __device__ __forceinline__ i64 narrow<i64, i64>(i64 x) { return x; }
template <> __device__ __forceinline__ unsigned char narrow<unsigned char, unsigned>(unsigned x) {
    return (unsigned char)x;
}

// Signed integers wrap through their unsigned twins (signed overflow is undefined in C++).
template <typename S, typename U> __device__ __forceinline__ S combine_wrapping(int op, S a, S b) {
    switch (op) {
    case REDUCE_MAX: return a > b ? a : b;
    case REDUCE_MIN: return a < b ? a : b;
    case REDUCE_PRODUCT: return (S)((U)a * (U)b);
    default: return (S)((U)a + (U)b);
    }
}
template <> __device__ __forceinline__ int reduce_combine<int>(int op, int a, int b) {
    return combine_wrapping<int, unsigned>(op, a, b);
}
template <> __device__ __forceinline__ i64 reduce_combine<i64>(int op, i64 a, i64 b) {
    return combine_wrapping<i64, u64>(op, a, b);
}

template <typename T> __device__ void reduce_into(int op, T* dst, const T* src, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        auto a = to_acc(dst[i]);
        dst[i] = narrow<T>(reduce_combine(op, a, (decltype(a))to_acc(src[i])));
    }
}

// The mean's last step: x /= count (integers: truncating division).
template <typename T> __device__ void divide(T* x, u64 n, u64 count) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        auto a = to_acc(x[i]);
        x[i] = narrow<T>(a / (decltype(a))count);
    }
}

#define COLLECTIVE(T, name)                                                                    \
    extern "C" __global__ void reduce_into_##name(int op, T* dst, const T* src, u64 n) {      \
        reduce_into(op, dst, src, n);                                                         \
    }                                                                                          \
    extern "C" __global__ void divide_##name(T* x, u64 n, u64 count) { divide(x, n, count); }
MIRRA_FLOAT_KERNELS(COLLECTIVE)
COLLECTIVE(int, i32)
COLLECTIVE(i64, i64)
COLLECTIVE(unsigned char, u8)
