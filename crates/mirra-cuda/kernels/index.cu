// Indexing: gather and its backward scatter-add along one axis of a tensor viewed as
// [outer, n, inner] (sparse cross-entropy's pick of the labelled log-probability), the
// selection of rows of dimension 0, and one-hot encoding. Every index is checked: one
// outside its range sets *bad, which the host turns into an error naming it (never a
// silent wrong read or write).
#include "common.cuh"

// y[o, j, i] = x[o, index[o, j, i], i] for x [outer, n, inner] and index [outer, k, inner];
// an index outside [0, n) writes NaN there and sets *bad (the host turns it into an
// error naming the index: never a silent wrong read).
template <typename T>
__device__ void gather(const T* x, const i64* index, T* y, u64 outer, u64 n, u64 k, u64 inner, int* bad) {
    for (u64 i = global_index(); i < outer * k * inner; i += grid_stride()) {
        const u64 o = i / (k * inner), r = i % inner;
        const i64 j = index[i];
        if (j < 0 || (u64)j >= n) {
            *bad = 1;
            y[i] = from_acc<T>(typename Acc<T>::type(MIRRA_NAN));
        } else {
            y[i] = x[(o * n + (u64)j) * inner + r];
        }
    }
}

// The backward of gather: dx[o, index[o, j, i], i] += g[o, j, i], with dx zeroed first.
// One thread per (o, i) line walks j in order, so repeated indices add in a fixed order.
template <typename T>
__device__ void scatter_add(const T* g, const i64* index, T* dx, u64 outer, u64 n, u64 k, u64 inner, int* bad) {
    for (u64 line = global_index(); line < outer * inner; line += grid_stride()) {
        const u64 o = line / inner, r = line % inner;
        for (u64 j = 0; j < k; ++j) {
            const u64 src = (o * k + j) * inner + r;
            const i64 t = index[src];
            if (t < 0 || (u64)t >= n) {
                *bad = 1;
                continue;
            }
            const u64 dst = (o * n + (u64)t) * inner + r;
            dx[dst] = from_acc<T>(to_acc(dx[dst]) + to_acc(g[src]));
        }
    }
}

// y[r, :] = x[rows[r], :] for x [n, row]: one thread per output element (any dtype).
template <typename T>
__device__ void index_select(const T* x, const i64* rows, T* y, u64 count, u64 row, u64 n, int* bad) {
    for (u64 i = global_index(); i < count * row; i += grid_stride()) {
        const i64 r = rows[i / row];
        if (r < 0 || (u64)r >= n) {
            *bad = 1;
            continue;
        }
        y[i] = x[(u64)r * row + i % row];
    }
}

// y[i, index[i]] = 1 for y [count, depth], zeroed first (float T).
template <typename T> __device__ void one_hot(const i64* index, T* y, u64 count, u64 depth, int* bad) {
    for (u64 i = global_index(); i < count; i += grid_stride()) {
        const i64 k = index[i];
        if (k < 0 || (u64)k >= depth) {
            *bad = 1;
            continue;
        }
        y[i * depth + (u64)k] = from_acc<T>(typename Acc<T>::type(1));
    }
}

#define INDEX(T, name)                                                                               \
    extern "C" __global__ void gather_##name(const T* x, const i64* index, T* y, u64 outer, u64 n,  \
                                             u64 k, u64 inner, int* bad) {                           \
        gather(x, index, y, outer, n, k, inner, bad);                                                \
    }                                                                                                \
    extern "C" __global__ void scatter_add_##name(const T* g, const i64* index, T* dx, u64 outer,    \
                                                  u64 n, u64 k, u64 inner, int* bad) {               \
        scatter_add(g, index, dx, outer, n, k, inner, bad);                                          \
    }                                                                                                \
    extern "C" __global__ void one_hot_##name(const i64* index, T* y, u64 count, u64 depth,          \
                                              int* bad) {                                            \
        one_hot(index, y, count, depth, bad);                                                        \
    }
MIRRA_FLOAT_KERNELS(INDEX)

#define SELECT(T, name)                                                                              \
    extern "C" __global__ void index_select_##name(const T* x, const i64* rows, T* y, u64 count,     \
                                                   u64 row, u64 n, int* bad) {                       \
        index_select(x, rows, y, count, row, n, bad);                                                \
    }
MIRRA_FLOAT_KERNELS(SELECT)
SELECT(int, i32)
SELECT(i64, i64)
SELECT(unsigned char, u8)
