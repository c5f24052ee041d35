// Calibration statistics on the GPU, summed exactly (rust/speckv/src/stats.rs, invariant S1):
// per channel of a cache, the sums of its values, of its squared residuals (bf16 mode) and of
// its squared residuals in the fp8 mode. Every term is a fixed order of correctly rounded
// float64 operations, made a 192-bit fixed-point integer (trunc(term * 2^64), clamped to
// 2^160), and integers add in any order to the same sum: the GPU's atomics give the host's
// numbers bit for bit. One source for nvcc, NVRTC and the host compiler (speckv_params.cuh).
#pragma once

#include "speckv_params.cuh"

namespace speckv {
namespace stats {

constexpr int FRACTION_BITS = 64;  // stats.rs: FIXED_FRACTION_BITS
constexpr int CLAMP_LOG2 = 160;    // stats.rs: FIXED_CLAMP_LOG2

// stats.rs: fixed, trunc(v * 2^64) as 192-bit two's complement; 0 for non-finite v
SPECKV_HD void fixed(double v, uint64_t out[3]) {
    out[0] = out[1] = out[2] = 0;
    const uint64_t bits = f64_bits(v);
    const int biased = (int)((bits >> 52) & 0x7FF);
    if (biased == 0x7FF) return;
    const uint64_t mantissa = (bits & ((1ull << 52) - 1)) | (biased != 0 ? 1ull << 52 : 0);
    const int shift = (biased > 1 ? biased : 1) - 1075 + FRACTION_BITS;
    if (shift + 53 > CLAMP_LOG2) {
        out[2] = 1ull << (CLAMP_LOG2 - 128);
    } else if (shift >= 0) {
        const int limb = shift / 64, within = shift % 64;
        out[limb] = mantissa << within;
        if (within > 0 && limb + 1 < 3) out[limb + 1] = mantissa >> (64 - within);
    } else if (shift > -64) {
        out[0] = mantissa >> (-shift);
    }
    if (bits >> 63) {
        uint64_t carry = 1;
        for (int i = 0; i < 3; ++i) {
            const uint64_t s = ~out[i] + carry;
            carry = (carry && s == 0) ? 1 : 0;
            out[i] = s;
        }
    }
}

// acc += x (mod 2^192)
SPECKV_HD void add(uint64_t acc[3], const uint64_t x[3]) {
    uint64_t carry = 0;
    for (int i = 0; i < 3; ++i) {
        const uint64_t s1 = acc[i] + x[i];
        const uint64_t c1 = s1 < acc[i] ? 1 : 0;
        const uint64_t s2 = s1 + carry;
        const uint64_t c2 = s2 < s1 ? 1 : 0;
        acc[i] = s2;
        carry = c1 | c2;
    }
}

// The value at *p before adding v, atomically: the device's atomicAdd, or the compiler's
// atomic builtin on the host (the CPU tests run items on many threads with it).
SPECKV_HD uint64_t fetch_add(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
    return (uint64_t)atomicAdd((unsigned long long*)p, (unsigned long long)v);
#else
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

// *dst += x (mod 2^192) with other threads adding to the same sum: each limb's atomic add
// returns the value it added to, so the thread that wraps a limb carries into the next; all
// carries are counted once, and the final sum is exact whatever the interleaving.
SPECKV_HD void atomic_add(uint64_t* dst, const uint64_t x[3]) {
    uint64_t carry = 0;
    for (int i = 0; i < 3; ++i) {
        const uint64_t v = x[i] + carry;
        const uint64_t wrapped = v < carry ? 1 : 0;  // x[i] = 2^64 - 1 and a carry
        const uint64_t old = fetch_add(&dst[i], v);
        carry = wrapped + (old + v < old ? 1 : 0);
    }
}

// stats.rs: terms, in this order of float64 operations
SPECKV_HD void terms(float t, float p, float p8, float q, double scale, double out[3]) {
    const double value = (double)t;
    const double e = SPECKV_DSUB(value, (double)p);
    const double e8 = SPECKV_DSUB((double)q, SPECKV_DDIV((double)p8, scale));
    out[0] = value;
    out[1] = SPECKV_DMUL(e, e);
    out[2] = SPECKV_DMUL(e8, e8);
}

}  // namespace stats

// One item of the statistics kernel: channel `item % channels` ((head, dim) of a [batch,
// heads, tokens, dim] cache), rows (batch, token) `[g * rows_per_item, (g + 1) * rows_per_item)`
// with g = item / channels, summed in registers, then added to `sums` ([3][channels][3 limbs]).
SPECKV_HD void channel_sums_item(const float* t, const float* p, const float* p8, const float* q, double scale,
                                 uint64_t batch, uint64_t heads, uint64_t tokens, uint64_t dim,
                                 uint64_t rows_per_item, uint64_t* sums, uint64_t item) {
    const uint64_t channels = heads * dim, rows = batch * tokens;
    const uint64_t channel = item % channels, group = item / channels;
    const uint64_t h = channel / dim, d = channel % dim;
    uint64_t acc[3][3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
    const uint64_t first = group * rows_per_item;
    const uint64_t last = first + rows_per_item < rows ? first + rows_per_item : rows;
    for (uint64_t r = first; r < last; ++r) {
        const uint64_t b = r / tokens, token = r % tokens;
        const uint64_t i = ((b * heads + h) * tokens + token) * dim + d;
        double term[3];
        stats::terms(t[i], p[i], p8[i], q[i], scale, term);
        for (int k = 0; k < 3; ++k) {
            uint64_t x[3];
            stats::fixed(term[k], x);
            stats::add(acc[k], x);
        }
    }
    for (int k = 0; k < 3; ++k) stats::atomic_add(sums + (k * channels + channel) * 3, acc[k]);
}

}  // namespace speckv
