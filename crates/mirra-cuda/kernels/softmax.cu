// Softmax and log-softmax along one axis of a tensor viewed as [outer, n, inner] and their
// backward maps (sparse cross-entropy is log-softmax, then index.cu's gather and a
// negation, as on the CPU). One block per (outer, inner) line:
// the max is subtracted before exponentiating, and a NaN input makes its line NaN.
#include "common.cuh"

__device__ __forceinline__ float s_exp(float x) { return expf(x); }
__device__ __forceinline__ double s_exp(double x) { return exp(x); }
__device__ __forceinline__ float s_log(float x) { return logf(x); }
__device__ __forceinline__ double s_log(double x) { return log(x); }

// y = softmax(x) (log_softmax when `log` is non-zero) along the middle axis.
template <typename T>
__device__ void softmax(const T* x, T* y, u64 outer, u64 n, u64 inner, int log) {
    typedef typename Acc<T>::type A;
    for (u64 line = blockIdx.x; line < outer * inner; line += gridDim.x) {
        const u64 base = (line / inner) * n * inner + line % inner;
        A m = A(-MIRRA_INF);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) m = max_nan(m, to_acc(x[base + j * inner]));
        m = block_reduce(m, MaxOp());
        A s = A(0);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) s += s_exp(to_acc(x[base + j * inner]) - m);
        s = block_reduce(s, SumOp());
        const A log_s = s_log(s);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const A z = to_acc(x[base + j * inner]) - m;
            y[base + j * inner] = from_acc<T>(log ? z - log_s : s_exp(z) / s);
        }
    }
}

// From the output y and its gradient g: softmax's dx = y * (g - sum(g * y)), log-softmax's
// dx = g - exp(y) * sum(g).
template <typename T>
__device__ void softmax_backward(const T* y, const T* g, T* dx, u64 outer, u64 n, u64 inner, int log) {
    typedef typename Acc<T>::type A;
    for (u64 line = blockIdx.x; line < outer * inner; line += gridDim.x) {
        const u64 base = (line / inner) * n * inner + line % inner;
        A s = A(0);
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const u64 k = base + j * inner;
            s += log ? to_acc(g[k]) : to_acc(g[k]) * to_acc(y[k]);
        }
        s = block_reduce(s, SumOp());
        for (u64 j = threadIdx.x; j < n; j += blockDim.x) {
            const u64 k = base + j * inner;
            const A yk = to_acc(y[k]), gk = to_acc(g[k]);
            dx[k] = from_acc<T>(log ? gk - s_exp(yk) * s : yk * (gk - s));
        }
    }
}

#define SOFTMAX(T, name)                                                                             \
    extern "C" __global__ void softmax_##name(const T* x, T* y, u64 outer, u64 n, u64 inner, int log) { \
        softmax(x, y, outer, n, inner, log);                                                         \
    }                                                                                                \
    extern "C" __global__ void softmax_backward_##name(const T* y, const T* g, T* dx, u64 outer,     \
                                                       u64 n, u64 inner, int log) {                  \
        softmax_backward(y, g, dx, outer, n, inner, log);                                           \
    }
MIRRA_FLOAT_KERNELS(SOFTMAX)
