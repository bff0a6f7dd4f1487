// Element-wise kernels: unary maps, binary maps with NumPy broadcasting, the scalar affine
// map, fill, and casts between float types. The op codes are mirra-cuda's `UnaryKernel`
// and `BinaryKernel` (src/kernels.rs, whose tests check that the numbers agree), in the
// order of mirra-tensor's `UnaryOp` and `BinaryOp`; each formula is the CPU's.
#include "common.cuh"

enum Unary {
    UNARY_RELU = 0,
    UNARY_SIGMOID = 1,
    UNARY_TANH = 2,
    UNARY_GELU = 3,
    UNARY_EXP = 4,
    UNARY_LOG = 5,
    UNARY_SQRT = 6,
    UNARY_NEG = 7,
    UNARY_ABS = 8,
    UNARY_SQUARE = 9,
    UNARY_RECIP = 10,
    UNARY_SIGN = 11,
};

enum Binary {
    BINARY_ADD = 0,
    BINARY_SUB = 1,
    BINARY_MUL = 2,
    BINARY_DIV = 3,
    BINARY_MAXIMUM = 4,
    BINARY_MINIMUM = 5,
    BINARY_EQ_MASK = 6,
    BINARY_RELU_BACKWARD = 7,
    BINARY_SIGMOID_BACKWARD = 8,
    BINARY_TANH_BACKWARD = 9,
    BINARY_GELU_BACKWARD = 10,
};

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
// The CPU computes erf in f64 for every type (libm): so does this.
__device__ __forceinline__ float m_erf(float x) { return (float)erf((double)x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }

template <typename A> __device__ __forceinline__ A sigmoid(A x) {
    // Split by sign so that exp never overflows.
    if (x >= A(0)) return A(1) / (A(1) + m_exp(-x));
    A e = m_exp(x);
    return e / (A(1) + e);
}

#define M_SQRT1_2_ 0.70710678118654752440
#define M_2_SQRTPI_ 1.12837916709551257390

template <typename A> __device__ __forceinline__ A gelu(A x) {
    return A(0.5) * x * (A(1) + m_erf(x * A(M_SQRT1_2_)));
}

template <typename A> __device__ __forceinline__ A gelu_grad(A x) {
    const A half = A(0.5);
    A cdf = half * (A(1) + m_erf(x * A(M_SQRT1_2_)));
    A pdf = m_exp(-half * x * x) * A(M_2_SQRTPI_) * A(M_SQRT1_2_) * half;
    return cdf + x * pdf;
}

template <typename A> __device__ __forceinline__ A unary_op(int op, A x) {
    switch (op) {
    case UNARY_RELU: return x < A(0) ? A(0) : x;
    case UNARY_SIGMOID: return sigmoid(x);
    case UNARY_TANH: return m_tanh(x);
    case UNARY_GELU: return gelu(x);
    case UNARY_EXP: return m_exp(x);
    case UNARY_LOG: return m_log(x);
    case UNARY_SQRT: return m_sqrt(x);
    case UNARY_NEG: return -x;
    case UNARY_ABS: return m_abs(x);
    case UNARY_SQUARE: return x * x;
    case UNARY_RECIP: return A(1) / x;
    case UNARY_SIGN: return x > A(0) ? A(1) : (x < A(0) ? A(-1) : (x != x ? x : A(0)));
    default: return x - x + A(MIRRA_NAN);  // an op code this source does not know: NaN, never a guess
    }
}

template <typename A> __device__ __forceinline__ A binary_op(int op, A a, A b) {
    switch (op) {
    case BINARY_ADD: return a + b;
    case BINARY_SUB: return a - b;
    case BINARY_MUL: return a * b;
    case BINARY_DIV: return a / b;
    case BINARY_MAXIMUM: return max_nan(a, b);
    case BINARY_MINIMUM: return min_nan(a, b);
    case BINARY_EQ_MASK: return a == b ? A(1) : A(0);
    case BINARY_RELU_BACKWARD: return b <= A(0) ? A(0) : a;
    case BINARY_SIGMOID_BACKWARD: return a * b * (A(1) - b);
    case BINARY_TANH_BACKWARD: return a * (A(1) - b * b);
    case BINARY_GELU_BACKWARD: return a * gelu_grad(b);
    default: return A(MIRRA_NAN);
    }
}

// The broadcast of two operands to one contiguous output: the output's dims, and each
// operand's strides in elements (0 along a broadcast dimension). Rust's `Broadcast`
// (src/kernels.rs) has this layout.
#define MIRRA_MAX_RANK 8
struct Broadcast {
    u64 dims[MIRRA_MAX_RANK];
    u64 a_strides[MIRRA_MAX_RANK];
    u64 b_strides[MIRRA_MAX_RANK];
    u64 rank;
};

// The contiguous maps load ILP elements per thread (each load coalesced across the warp)
// before computing any: more loads in flight per thread, which a map that reads one array
// and writes one needs to reach the device's copy rate (one at a time: 0.70 of it on an
// H200). In place (y == x) is fine: each element is loaded before its own store.
#define ILP 4

template <typename T> __device__ void unary(int op, const T* x, T* y, u64 n) {
    const u64 s = grid_stride();
    u64 i = global_index();
    for (; i + (ILP - 1) * s < n; i += ILP * s) {
        T v[ILP];
#pragma unroll
        for (int k = 0; k < ILP; ++k) v[k] = x[i + k * s];
#pragma unroll
        for (int k = 0; k < ILP; ++k) y[i + k * s] = from_acc<T>(unary_op(op, to_acc(v[k])));
    }
    for (; i < n; i += s) y[i] = from_acc<T>(unary_op(op, to_acc(x[i])));
}

// Both operands contiguous, of the output's length.
template <typename T> __device__ void binary(int op, const T* a, const T* b, T* y, u64 n) {
    const u64 s = grid_stride();
    u64 i = global_index();
    for (; i + (ILP - 1) * s < n; i += ILP * s) {
        T va[ILP], vb[ILP];
#pragma unroll
        for (int k = 0; k < ILP; ++k) {
            va[k] = a[i + k * s];
            vb[k] = b[i + k * s];
        }
#pragma unroll
        for (int k = 0; k < ILP; ++k) y[i + k * s] = from_acc<T>(binary_op(op, to_acc(va[k]), to_acc(vb[k])));
    }
    for (; i < n; i += s) y[i] = from_acc<T>(binary_op(op, to_acc(a[i]), to_acc(b[i])));
}

template <typename T>
__device__ void binary_broadcast(int op, const T* a, const T* b, T* y, u64 n, Broadcast s) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        u64 rest = i, ia = 0, ib = 0;
        for (int d = (int)s.rank - 1; d >= 0; --d) {
            u64 c = rest % s.dims[d];
            rest /= s.dims[d];
            ia += c * s.a_strides[d];
            ib += c * s.b_strides[d];
        }
        y[i] = from_acc<T>(binary_op(op, to_acc(a[ia]), to_acc(b[ib])));
    }
}

// y = x * scale + shift, in the accumulation type (two roundings, as the CPU).
template <typename T> __device__ void affine(const T* x, T* y, u64 n, double scale, double shift) {
    typedef typename Acc<T>::type A;
    const A s = (A)scale, t = (A)shift;
    for (u64 i = global_index(); i < n; i += grid_stride()) y[i] = from_acc<T>(to_acc(x[i]) * s + t);
}

template <typename T> __device__ void fill(T* y, u64 n, double value) {
    const T v = from_acc<T>((typename Acc<T>::type)value);
    for (u64 i = global_index(); i < n; i += grid_stride()) y[i] = v;
}

#define ELEMENTWISE(T, name)                                                                          \
    extern "C" __global__ void unary_##name(int op, const T* x, T* y, u64 n) { unary(op, x, y, n); } \
    extern "C" __global__ void binary_##name(int op, const T* a, const T* b, T* y, u64 n) {          \
        binary(op, a, b, y, n);                                                                      \
    }                                                                                                \
    extern "C" __global__ void binary_broadcast_##name(int op, const T* a, const T* b, T* y, u64 n, \
                                                       Broadcast s) {                                \
        binary_broadcast(op, a, b, y, n, s);                                                         \
    }                                                                                                \
    extern "C" __global__ void affine_##name(const T* x, T* y, u64 n, double scale, double shift) { \
        affine(x, y, n, scale, shift);                                                               \
    }                                                                                                \
    extern "C" __global__ void fill_##name(T* y, u64 n, double value) { fill(y, n, value); }
MIRRA_FLOAT_KERNELS(ELEMENTWISE)

// A contiguous copy of a strided view (the operand's strides in `a_strides`), for every
// element type: a copy converts nothing.
template <typename T> __device__ void copy_strided(const T* x, T* y, u64 n, Broadcast s) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        u64 rest = i, ix = 0;
        for (int d = (int)s.rank - 1; d >= 0; --d) {
            ix += (rest % s.dims[d]) * s.a_strides[d];
            rest /= s.dims[d];
        }
        y[i] = x[ix];
    }
}

#define COPY(T, name)                                                                             \
    extern "C" __global__ void copy_strided_##name(const T* x, T* y, u64 n, Broadcast s) {       \
        copy_strided(x, y, n, s);                                                                 \
    }
MIRRA_FLOAT_KERNELS(COPY)
COPY(int, i32)
COPY(i64, i64)
COPY(unsigned char, u8)

// Casts between float types, each rounding once to nearest even, as the CPU's: from f32
// and the 16-bit types through f32 (exact), from f64 directly.
template <typename D> __device__ __forceinline__ D cast_one(float x) {
    return from_acc<D>((typename Acc<D>::type)x);
}
template <typename D> __device__ __forceinline__ D cast_double(double x);
template <> __device__ __forceinline__ float cast_double<float>(double x) { return (float)x; }
template <> __device__ __forceinline__ double cast_double<double>(double x) { return x; }
template <> __device__ __forceinline__ __half cast_double<__half>(double x) { return __double2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 cast_double<__nv_bfloat16>(double x) {
    return __double2bfloat16(x);
}
template <typename D> __device__ __forceinline__ D cast_one(double x) { return cast_double<D>(x); }

template <typename S, typename D> __device__ void cast(const S* x, D* y, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) y[i] = cast_one<D>(to_acc(x[i]));
}

#define CAST(S, s, D, d) \
    extern "C" __global__ void cast_##s##_##d(const S* x, D* y, u64 n) { cast(x, y, n); }
#define CAST_FROM(S, s)                  \
    CAST(S, s, float, f32)               \
    CAST(S, s, double, f64)              \
    CAST(S, s, __half, f16)              \
    CAST(S, s, __nv_bfloat16, bf16)
MIRRA_FLOAT_KERNELS(CAST_FROM)
