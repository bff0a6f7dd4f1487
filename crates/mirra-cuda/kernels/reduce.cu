// Reductions along one axis of a tensor viewed as [outer, n, inner] -> [outer, inner]
// (sum, mean, max, min, product, accumulated in f32, or f64 for f64), argmax, and the
// partial sums of squares of gradient clipping. Every result is deterministic: each output
// has one block or one thread, whose order of additions depends only on the launch shape.
// Op codes: `enum Reduce` of common.cuh.
#include "common.cuh"

struct ProductOp { template <typename A> __device__ A operator()(A a, A b) const { return a * b; } };

template <typename A> __device__ __forceinline__ A reduce_identity(int op) {
    switch (op) {
    case REDUCE_MAX: return A(-MIRRA_INF);
    case REDUCE_MIN: return A(MIRRA_INF);
    case REDUCE_PRODUCT: return A(1);
    default: return A(0);
    }
}

// inner == 1: one block per row (a grid-stride loop over rows), the block's threads
// striding over the row, then a block reduction.
template <typename T> __device__ void reduce_rows(int op, const T* x, T* y, u64 rows, u64 n) {
    typedef typename Acc<T>::type A;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        A v = reduce_identity<A>(op);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) v = reduce_combine(op, v, to_acc(row[j]));
        switch (op) {
        case REDUCE_MAX: v = block_reduce(v, MaxOp()); break;
        case REDUCE_MIN: v = block_reduce(v, MinOp()); break;
        case REDUCE_PRODUCT: v = block_reduce(v, ProductOp()); break;
        default: v = block_reduce(v, SumOp()); break;
        }
        if (threadIdx.x == 0) y[r] = from_acc<T>(op == REDUCE_MEAN ? v / A(n) : v);
    }
}

// inner > 1: one thread per output, walking the reduced axis in order (coalesced across
// the threads of a warp, which read neighbouring `inner` elements).
template <typename T>
__device__ void reduce_strided(int op, const T* x, T* y, u64 outer, u64 n, u64 inner) {
    typedef typename Acc<T>::type A;
    for (u64 i = global_index(); i < outer * inner; i += grid_stride()) {
        const u64 o = i / inner, k = i % inner;
        const T* p = x + o * n * inner + k;
        A v = reduce_identity<A>(op);
        for (u64 j = 0; j < n; ++j) v = reduce_combine(op, v, to_acc(p[j * inner]));
        y[i] = from_acc<T>(op == REDUCE_MEAN ? v / A(n) : v);
    }
}

// Each block's sum of squares of its grid-stride share of x, in f64, into partials[block]
// (the host adds the partials in order: clipping's global norm, deterministic).
template <typename T> __device__ void sum_squares_partial(const T* x, u64 n, double* partials) {
    double v = 0.0;
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        double e = (double)to_acc(x[i]);
        v += e * e;
    }
    v = block_reduce(v, SumOp());
    if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// The index of the largest element along the middle axis of [outer, n, inner], as i64: one
// thread per output walking the axis in order; the first maximum wins ties and the first
// NaN counts as the largest (PyTorch's rule and the CPU's).
template <typename T> __device__ void argmax(const T* x, i64* y, u64 outer, u64 n, u64 inner) {
    typedef typename Acc<T>::type A;
    for (u64 i = global_index(); i < outer * inner; i += grid_stride()) {
        const T* p = x + (i / inner) * n * inner + i % inner;
        u64 best = 0;
        A b = to_acc(p[0]);
        for (u64 j = 1; j < n && b == b; ++j) {
            const A v = to_acc(p[j * inner]);
            if (v > b || v != v) {
                best = j;
                b = v;
            }
        }
        y[i] = (i64)best;
    }
}

#define REDUCE(T, name)                                                                            \
    extern "C" __global__ void reduce_rows_##name(int op, const T* x, T* y, u64 rows, u64 n) {    \
        reduce_rows(op, x, y, rows, n);                                                           \
    }                                                                                              \
    extern "C" __global__ void reduce_strided_##name(int op, const T* x, T* y, u64 outer, u64 n, \
                                                     u64 inner) {                                  \
        reduce_strided(op, x, y, outer, n, inner);                                                \
    }                                                                                              \
    extern "C" __global__ void sum_squares_partial_##name(const T* x, u64 n, double* partials) {  \
        sum_squares_partial(x, n, partials);                                                      \
    }                                                                                              \
    extern "C" __global__ void argmax_##name(const T* x, i64* y, u64 outer, u64 n, u64 inner) {   \
        argmax(x, y, outer, n, inner);                                                            \
    }
MIRRA_FLOAT_KERNELS(REDUCE)
