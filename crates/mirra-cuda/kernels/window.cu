// Sliding windows over channels-last tensors [n, d1, d2, d3, c] (unused spatial dims of
// size 1): the patches of a convolution (im2col) and their adjoint (col2im), max pooling
// and its gradient. Each output element is computed by one thread from a gather in a
// fixed order, never by atomic additions, so results do not depend on scheduling, and
// they are the CPU kernels' bits: im2col and max pooling copy elements, and col2im and the
// pooling gradient add in the CPU's order (output positions in order) in the
// accumulation type, rounding once.
#include "common.cuh"

// A window's geometry: Rust's `WindowGeometry` (src/kernels.rs) has this layout. Input
// coordinate of tap k at output position o along dimension d: o * stride - pad + k *
// dilation.
struct WindowGeometry {
    u64 input[3];
    u64 output[3];
    u64 kernel[3];
    u64 stride[3];
    u64 dilation[3];
    u64 pad[3];
    u64 images;
    u64 channels;
};

__device__ __forceinline__ u64 input_positions(const WindowGeometry& w) {
    return w.input[0] * w.input[1] * w.input[2];
}
__device__ __forceinline__ u64 output_positions(const WindowGeometry& w) {
    return w.output[0] * w.output[1] * w.output[2];
}
__device__ __forceinline__ u64 taps(const WindowGeometry& w) { return w.kernel[0] * w.kernel[1] * w.kernel[2]; }

// The flat input position (within its image) that tap `k` (row-major over the kernel's
// dims) of output position `o` (row-major over the output's) reads, or false when it falls
// in the padding.
__device__ __forceinline__ bool tap_input(const WindowGeometry& w, u64 o, u64 k, u64* at) {
    u64 pos = 0;
    // Digits of o over the output dims and of k over the kernel dims, last dim fastest.
    const u64 o2 = o % w.output[2], o1 = (o / w.output[2]) % w.output[1], o0 = o / (w.output[2] * w.output[1]);
    const u64 k2 = k % w.kernel[2], k1 = (k / w.kernel[2]) % w.kernel[1], k0 = k / (w.kernel[2] * w.kernel[1]);
    const u64 od[3] = {o0, o1, o2}, kd[3] = {k0, k1, k2};
    for (int d = 0; d < 3; ++d) {
        const i64 x = (i64)(od[d] * w.stride[d]) - (i64)w.pad[d] + (i64)(kd[d] * w.dilation[d]);
        if (x < 0 || x >= (i64)w.input[d]) return false;
        pos = pos * w.input[d] + (u64)x;
    }
    *at = pos;
    return true;
}

// cols[i, o, k, ch] = x[i, tap k of o, ch], zero in the padding: one thread per element
// of the patches [n, positions, taps, c] (any dtype: a copy).
template <typename T> __device__ void im2col(const T* x, T* cols, WindowGeometry w) {
    const u64 c = w.channels, kt = taps(w), positions = output_positions(w);
    const u64 total = w.images * positions * kt * c;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 ch = i % c, k = (i / c) % kt, o = (i / (c * kt)) % positions, image = i / (c * kt * positions);
        u64 at;
        cols[i] = tap_input(w, o, k, &at) ? x[(image * input_positions(w) + at) * c + ch]
                                          : from_acc<T>(typename Acc<T>::type(0));
    }
}

// dx[i, p, ch] = the sum of the patch values cols[i, o, k, ch] of every (o, k) whose tap
// reads p: one thread per input element, taps from last to first, which visits the output
// positions in increasing order (the CPU's order), summed in the accumulation type.
template <typename T> __device__ void col2im(const T* cols, T* dx, WindowGeometry w) {
    typedef typename Acc<T>::type A;
    const u64 c = w.channels, kt = taps(w), positions = input_positions(w);
    const u64 total = w.images * positions * c;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 ch = i % c, p = (i / c) % positions, image = i / (c * positions);
        const u64 p2 = p % w.input[2], p1 = (p / w.input[2]) % w.input[1], p0 = p / (w.input[2] * w.input[1]);
        const u64 pd[3] = {p0, p1, p2};
        A sum = A(0);
        for (u64 kk = kt; kk-- > 0;) {
            const u64 k2 = kk % w.kernel[2], k1 = (kk / w.kernel[2]) % w.kernel[1], k0 = kk / (w.kernel[2] * w.kernel[1]);
            const u64 kd[3] = {k0, k1, k2};
            u64 o = 0;
            bool inside = true;
            for (int d = 0; d < 3 && inside; ++d) {
                // o * stride = p + pad - k * dilation, when that is a multiple of the stride.
                const i64 num = (i64)(pd[d] + w.pad[d]) - (i64)(kd[d] * w.dilation[d]);
                inside = num >= 0 && num % (i64)w.stride[d] == 0 && (u64)(num / (i64)w.stride[d]) < w.output[d];
                if (inside) o = o * w.output[d] + (u64)(num / (i64)w.stride[d]);
            }
            if (inside) sum += to_acc(cols[((image * output_positions(w) + o) * kt + kk) * c + ch]);
        }
        dx[i] = from_acc<T>(sum);
    }
}

// values[i, o, ch] = the largest tap of output position o in channel ch, winners[i, o, ch]
// = its flat index into x (the first of equal maxima; a NaN wins, the first NaN): one
// thread per output element. A position with no tap inside the input sets *bad.
template <typename T>
__device__ void max_pool(const T* x, T* values, i64* winners, WindowGeometry w, int* bad) {
    typedef typename Acc<T>::type A;
    const u64 c = w.channels, kt = taps(w), positions = output_positions(w);
    const u64 total = w.images * positions * c;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 ch = i % c, o = (i / c) % positions, image = i / (c * positions);
        bool any = false;
        A best = A(0);
        u64 from = 0;
        for (u64 k = 0; k < kt; ++k) {
            u64 at;
            if (!tap_input(w, o, k, &at)) continue;
            const u64 index = (image * input_positions(w) + at) * c + ch;
            const A v = to_acc(x[index]);
            if (!any || v > best || (v != v && best == best)) {
                best = v;
                from = index;
            }
            any = true;
        }
        if (!any) *bad = 1;
        values[i] = from_acc<T>(best);
        winners[i] = (i64)from;
    }
}

// dx = the pooled gradient g added into each output's winner, zeros elsewhere: one thread
// per (image, channel) walks that image's output positions in order (the CPU's order),
// adding into `sums` (the accumulation type, zeroed first; a winner lies in its own image
// and channel), then rounds each of that image's and channel's elements once into dx. A
// winner outside its image or channel sets *bad.
template <typename T>
__device__ void max_pool_grad(const T* g, const i64* winners, typename Acc<T>::type* sums, T* dx, WindowGeometry w,
                              int* bad) {
    const u64 c = w.channels, positions = output_positions(w), image_len = input_positions(w) * c;
    for (u64 line = global_index(); line < w.images * c; line += grid_stride()) {
        const u64 image = line / c, ch = line % c;
        typename Acc<T>::type* mine = sums + image * image_len;
        for (u64 o = 0; o < positions; ++o) {
            const u64 src = (image * positions + o) * c + ch;
            const i64 t = winners[src] - (i64)(image * image_len);
            if (t < 0 || (u64)t >= image_len || (u64)t % c != ch) {
                *bad = 1;
                continue;
            }
            mine[t] += to_acc(g[src]);
        }
        for (u64 p = ch; p < image_len; p += c) dx[image * image_len + p] = from_acc<T>(mine[p]);
    }
}

#define WINDOW(T, name)                                                                              \
    extern "C" __global__ void im2col_##name(const T* x, T* cols, WindowGeometry w) { im2col(x, cols, w); } \
    extern "C" __global__ void col2im_##name(const T* cols, T* dx, WindowGeometry w) { col2im(cols, dx, w); } \
    extern "C" __global__ void max_pool_##name(const T* x, T* values, i64* winners, WindowGeometry w,     \
                                               int* bad) {                                               \
        max_pool(x, values, winners, w, bad);                                                            \
    }                                                                                                    \
    extern "C" __global__ void max_pool_grad_##name(const T* g, const i64* winners,                      \
                                                    typename Acc<T>::type* sums, T* dx, WindowGeometry w, \
                                                    int* bad) {                                          \
        max_pool_grad(g, winners, sums, dx, w, bad);                                                     \
    }
MIRRA_FLOAT_KERNELS(WINDOW)
