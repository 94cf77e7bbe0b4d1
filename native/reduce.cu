// horotopo reduce-step kernels, loaded at run time by horotopo/gpu/kernels.py (CuPy RawModule,
// compiled by NVRTC) and compiled ahead of time by tests/test_native.py (nvcc) so that a syntax
// error fails CI.
//
//   horotopo_reduce_<op>_<dt>(a, b, out, sa, sb, post, n):
//       out[i] = post * ((sa * a[i]) OP (sb * b[i]))      for i < n
//   horotopo_reduce_<op>_<dt>_v16(...): the same, with 16-byte vector loads; a, b and out must be
//       16-byte aligned (the loader checks and picks the scalar kernel otherwise).
//   horotopo_scale_<dt>(a, out, s, n): out[i] = s * a[i]  (a leaf's prescale before it sends).
//
//   op: sum, min, max, prod.   dt: f16, bf16, f32, f64.
//
// The file includes no header: NVRTC has no CUDA include path by default, and CuPy's bundled
// headers differ between versions. float16 goes through PTX cvt, bfloat16 through bit shifts.
// Half types compute in float32 and round once per step, so a step equals NumPy's
// (a.astype(f32) * f32(sa) OP b.astype(f32) * f32(sb)) * f32(post), rounded to the storage type.
// Compile with --fmad=false (the loader does): a fused multiply-add would change the last bit
// and break the bit-for-bit agreement with the CPU path and the CuPy fallback.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct alignas(16) Pack16 {
    u32 x, y, z, w;
};

struct F16 {
    typedef u16 storage;
    typedef float compute;
    static __device__ __forceinline__ float load(u16 h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ u16 store(float f) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

struct BF16 {
    typedef u16 storage;
    typedef float compute;
    static __device__ __forceinline__ float load(u16 h) {
        return __uint_as_float(((u32)h) << 16);
    }
    // Round to nearest even, as ml_dtypes and the CuPy fallback do; NaN becomes the quiet NaN of
    // its sign (rounding could otherwise carry a NaN into infinity).
    static __device__ __forceinline__ u16 store(float f) {
        u32 u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            return (u & 0x80000000u) ? (u16)0xffc0u : (u16)0x7fc0u;
        }
        u += 0x7fffu + ((u >> 16) & 1u);
        return (u16)(u >> 16);
    }
};

struct F32 {
    typedef float storage;
    typedef float compute;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};

struct F64 {
    typedef double storage;
    typedef double compute;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};

// min and max are IEEE 754-2019's minimum and maximum, as horotopo.ops.reduce_pair computes them
// on the host: NaN if either operand is NaN (MPI's < comparisons would let the operand order
// decide), and -0.0 below +0.0. Where both operands are zero the sign comes from arithmetic:
// x + y is -0.0 only when both are (max), -((-x) + (-y)) is -0.0 when either is (min). The
// engine makes every NaN result the canonical one afterwards, whatever payload is kept here.
struct OpSum {
    template <class C> static __device__ __forceinline__ C apply(C x, C y) { return x + y; }
};
struct OpProd {
    template <class C> static __device__ __forceinline__ C apply(C x, C y) { return x * y; }
};
struct OpMin {
    template <class C> static __device__ __forceinline__ C apply(C x, C y) {
        if (x != x) return x;
        if (y != y) return y;
        if (x == (C)0 && y == (C)0) return -((-x) + (-y));
        return x < y ? x : y;
    }
};
struct OpMax {
    template <class C> static __device__ __forceinline__ C apply(C x, C y) {
        if (x != x) return x;
        if (y != y) return y;
        if (x == (C)0 && y == (C)0) return x + y;
        return x > y ? x : y;
    }
};

template <class T, class Op>
__device__ __forceinline__ typename T::storage step(typename T::storage a, typename T::storage b,
                                                    typename T::compute sa, typename T::compute sb,
                                                    typename T::compute post) {
    typedef typename T::compute C;
    C x = T::load(a) * sa;
    C y = T::load(b) * sb;
    return T::store(Op::template apply<C>(x, y) * post);
}

template <class T, class Op>
__device__ __forceinline__ void reduce_scalar(const typename T::storage* a,
                                              const typename T::storage* b,
                                              typename T::storage* out, double sa, double sb,
                                              double post, u64 start, u64 n) {
    typedef typename T::compute C;
    const C csa = (C)sa, csb = (C)sb, cpost = (C)post;
    const u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 i = start + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = step<T, Op>(a[i], b[i], csa, csb, cpost);
    }
}

template <class T, class Op>
__device__ __forceinline__ void reduce_vector(const typename T::storage* a,
                                              const typename T::storage* b,
                                              typename T::storage* out, double sa, double sb,
                                              double post, u64 n) {
    typedef typename T::storage S;
    typedef typename T::compute C;
    enum { V = sizeof(Pack16) / sizeof(S) };
    union Lanes {
        Pack16 p;
        S s[V];
    };
    const C csa = (C)sa, csb = (C)sb, cpost = (C)post;
    const Pack16* av = reinterpret_cast<const Pack16*>(a);
    const Pack16* bv = reinterpret_cast<const Pack16*>(b);
    Pack16* ov = reinterpret_cast<Pack16*>(out);
    const u64 groups = n / V;
    const u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        Lanes x, y, r;
        x.p = av[g];
        y.p = bv[g];
#pragma unroll
        for (int j = 0; j < V; ++j) {
            r.s[j] = step<T, Op>(x.s[j], y.s[j], csa, csb, cpost);
        }
        ov[g] = r.p;
    }
    // The tail (fewer than V elements) is done element by element by the first threads.
    reduce_scalar<T, Op>(a, b, out, sa, sb, post, groups * V, n);
}

template <class T>
__device__ __forceinline__ void scale(const typename T::storage* a, typename T::storage* out,
                                      double s, u64 n) {
    typedef typename T::compute C;
    const C cs = (C)s;
    const u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = T::store(T::load(a[i]) * cs);
    }
}

#define HOROTOPO_REDUCE(OPNAME, OP, DTNAME, T)                                                  \
    extern "C" __global__ void horotopo_reduce_##OPNAME##_##DTNAME(                             \
        const T::storage* a, const T::storage* b, T::storage* out, double sa, double sb,        \
        double post, u64 n) {                                                                   \
        reduce_scalar<T, OP>(a, b, out, sa, sb, post, 0, n);                                    \
    }                                                                                           \
    extern "C" __global__ void horotopo_reduce_##OPNAME##_##DTNAME##_v16(                       \
        const T::storage* a, const T::storage* b, T::storage* out, double sa, double sb,        \
        double post, u64 n) {                                                                   \
        reduce_vector<T, OP>(a, b, out, sa, sb, post, n);                                       \
    }

#define HOROTOPO_DTYPE(DTNAME, T)                                                               \
    HOROTOPO_REDUCE(sum, OpSum, DTNAME, T)                                                      \
    HOROTOPO_REDUCE(min, OpMin, DTNAME, T)                                                      \
    HOROTOPO_REDUCE(max, OpMax, DTNAME, T)                                                      \
    HOROTOPO_REDUCE(prod, OpProd, DTNAME, T)                                                    \
    extern "C" __global__ void horotopo_scale_##DTNAME(const T::storage* a, T::storage* out,    \
                                                       double s, u64 n) {                       \
        scale<T>(a, out, s, n);                                                                 \
    }

HOROTOPO_DTYPE(f16, F16)
HOROTOPO_DTYPE(bf16, BF16)
HOROTOPO_DTYPE(f32, F32)
HOROTOPO_DTYPE(f64, F64)
