// Fused optimizer updates, one pass over each parameter: SGD (momentum, Nesterov, decay),
// Adam / AdamW (AMSGrad), RMSprop (centered, momentum), and clipping's in-place scale.
// Parameters and gradients are of the element type T, the optimizer's slots of its
// accumulation type; each formula and its order of operations are mirra-optim's (see
// sgd.rs, adam.rs, rmsprop.rs there), whose host computes the coefficients per step.
#include "common.cuh"

// SGD, Keras's form: m = mu * m - lr * g; p = p * decay + (nesterov ? mu * m - lr * g : m).
// Without momentum (m null): p = p * decay - lr * g.
template <typename T>
__device__ void sgd(T* p, const T* g, typename Acc<T>::type* m, u64 n, double lr, double mu,
                    double decay, int nesterov) {
    typedef typename Acc<T>::type A;
    const A lr_ = (A)lr, mu_ = (A)mu, decay_ = (A)decay;
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        const A gi = to_acc(g[i]);
        if (m == nullptr) {
            p[i] = from_acc<T>(to_acc(p[i]) * decay_ - lr_ * gi);
        } else {
            const A mi = mu_ * m[i] - lr_ * gi;
            m[i] = mi;
            const A delta = nesterov ? mu_ * mi - lr_ * gi : mi;
            p[i] = from_acc<T>(to_acc(p[i]) * decay_ + delta);
        }
    }
}

// Adam (Keras's placement of epsilon): m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
// vhat = max(vhat, v) with AMSGrad (vhat non-null); p = p * decay - alpha m / (sqrt(.) + eps).
template <typename T>
__device__ void adam(T* p, const T* g, typename Acc<T>::type* m, typename Acc<T>::type* v,
                     typename Acc<T>::type* vhat, u64 n, double alpha, double one_minus_beta1,
                     double one_minus_beta2, double epsilon, double decay) {
    typedef typename Acc<T>::type A;
    const A alpha_ = (A)alpha, b1 = (A)one_minus_beta1, b2 = (A)one_minus_beta2, eps = (A)epsilon,
            decay_ = (A)decay;
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        const A gi = to_acc(g[i]);
        const A mi = m[i] + (gi - m[i]) * b1;
        const A vi = v[i] + (gi * gi - v[i]) * b2;
        m[i] = mi;
        v[i] = vi;
        A second = vi;
        if (vhat != nullptr) {
            second = max_nan(vhat[i], vi);
            vhat[i] = second;
        }
        const A decayed = to_acc(p[i]) * decay_;
        p[i] = from_acc<T>(decayed - mi * alpha_ / (sqrt(second) + eps));
    }
}

// RMSprop (Keras's form): v = rho v + (1 - rho) g^2; centered: a = rho a + (1 - rho) g and
// d = v - a^2 + eps, else d = v + eps; delta = lr g / sqrt(d); with momentum b = mu b +
// delta, delta = b; p = p * decay - delta. `a` and `b` are null when not used.
template <typename T>
__device__ void rmsprop(T* p, const T* g, typename Acc<T>::type* v, typename Acc<T>::type* a,
                        typename Acc<T>::type* b, u64 n, double lr, double rho, double one_minus_rho,
                        double epsilon, double momentum, double decay) {
    typedef typename Acc<T>::type A;
    const A lr_ = (A)lr, rho_ = (A)rho, omr = (A)one_minus_rho, eps = (A)epsilon, mu = (A)momentum,
            decay_ = (A)decay;
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        const A gi = to_acc(g[i]);
        const A vi = rho_ * v[i] + omr * gi * gi;
        v[i] = vi;
        A d;
        if (a != nullptr) {
            const A ai = rho_ * a[i] + omr * gi;
            a[i] = ai;
            d = vi - ai * ai + eps;
        } else {
            d = vi + eps;
        }
        A delta = lr_ * gi / sqrt(d);
        if (b != nullptr) {
            delta = mu * b[i] + delta;
            b[i] = delta;
        }
        p[i] = from_acc<T>(to_acc(p[i]) * decay_ - delta);
    }
}

// Clipping: x *= scale, in the accumulation type.
template <typename T> __device__ void scale_in_place(T* x, u64 n, double scale) {
    typedef typename Acc<T>::type A;
    const A s = (A)scale;
    for (u64 i = global_index(); i < n; i += grid_stride()) x[i] = from_acc<T>(to_acc(x[i]) * s);
}

// Loss scaling: g *= inv in the accumulation type, and the flag set (never cleared) when a
// stored result is infinite or NaN (x - x is NaN exactly for those). One flag for every
// gradient of a step, read by the host once: the step's skip decision.
template <typename T> __device__ void unscale_check(T* g, u64 n, double inv, unsigned int* flag) {
    typedef typename Acc<T>::type A;
    const A s = (A)inv;
    bool bad = false;
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        const T out = from_acc<T>(to_acc(g[i]) * s);
        const A back = to_acc(out);
        bad |= !(back - back == back - back);
        g[i] = out;
    }
    if (bad) atomicOr(flag, 1u);
}

#define OPTIM(T, name)                                                                              \
    extern "C" __global__ void sgd_##name(T* p, const T* g, Acc<T>::type* m, u64 n, double lr,     \
                                          double mu, double decay, int nesterov) {                 \
        sgd(p, g, m, n, lr, mu, decay, nesterov);                                                  \
    }                                                                                               \
    extern "C" __global__ void adam_##name(T* p, const T* g, Acc<T>::type* m, Acc<T>::type* v,     \
                                           Acc<T>::type* vhat, u64 n, double alpha, double b1,      \
                                           double b2, double epsilon, double decay) {               \
        adam(p, g, m, v, vhat, n, alpha, b1, b2, epsilon, decay);                                  \
    }                                                                                               \
    extern "C" __global__ void rmsprop_##name(T* p, const T* g, Acc<T>::type* v, Acc<T>::type* a,  \
                                              Acc<T>::type* b, u64 n, double lr, double rho,        \
                                              double one_minus_rho, double epsilon,                 \
                                              double momentum, double decay) {                      \
        rmsprop(p, g, v, a, b, n, lr, rho, one_minus_rho, epsilon, momentum, decay);               \
    }                                                                                               \
    extern "C" __global__ void scale_in_place_##name(T* x, u64 n, double scale) {                 \
        scale_in_place(x, n, scale);                                                               \
    }                                                                                               \
    extern "C" __global__ void unscale_check_##name(T* g, u64 n, double inv, unsigned int* flag) { \
        unscale_check(g, n, inv, flag);                                                            \
    }
MIRRA_FLOAT_KERNELS(OPTIM)
