// speckv coding parameters: the arithmetic that turns a target cache, a prediction and a
// calibration into exactly the integers the Rust coder reads (stored target words, float32
// mu bit patterns, int16 sigma codes).
//
// One source for two compilers: nvcc builds it into the device kernels (speckv_params.cu),
// the host C++ compiler builds it into the CPU test library (host_shim.cpp), and the tests
// compare the latter with the Rust path bit for bit. So every function here is SPECKV_HD and
// uses only integer operations and correctly rounded float32 operations spelled through the
// SPECKV_* macros below: nvcc would otherwise contract a*b+c into one fused multiply-add,
// which rounds once instead of twice and breaks bit-identity with the CPU (Rust never fuses).
//
// Mirrors, each cited where it is used:
//   rust/speckv/src/model/ladder.rs      sigma_code (bit-only round(8 log2 sigma))
//   rust/speckv-py/src/lib.rs            relative_sigma_codes (sqrt(s^2 + (r mu)^2))
//   python/speckv/hf/calibration.py      fp8_quantize (x / scale, saturated, to e4m3fn)
//   c10/util/Float8_e4m3fn.h (PyTorch)   fp8_e4m3fn_from_fp32_value, what torch rounds with
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (the just-in-time path, speckv/hf/cuda/module.py) has no C library headers
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#define INT16_MIN (-32768)
#else
#include <stdint.h>
#endif

#if defined(__CUDACC__)
#define SPECKV_HD __host__ __device__ __forceinline__
#define SPECKV_HD_MEMBER __host__ __device__ __forceinline__
#else
#define SPECKV_HD static inline
#define SPECKV_HD_MEMBER inline
#endif

#if defined(__CUDA_ARCH__)
#define SPECKV_ADD(a, b) __fadd_rn((a), (b))
#define SPECKV_MUL(a, b) __fmul_rn((a), (b))
#define SPECKV_DIV(a, b) __fdiv_rn((a), (b))
#define SPECKV_SQRT(a) __fsqrt_rn(a)
#define SPECKV_DADD(a, b) __dadd_rn((a), (b))
#define SPECKV_DSUB(a, b) __dadd_rn((a), -(b))
#define SPECKV_DMUL(a, b) __dmul_rn((a), (b))
#define SPECKV_DDIV(a, b) __ddiv_rn((a), (b))
#else
#include <math.h>
#include <string.h>
// the host build is compiled with -ffp-contract=off (see host_shim.cpp's build line)
#define SPECKV_ADD(a, b) ((a) + (b))
#define SPECKV_MUL(a, b) ((a) * (b))
#define SPECKV_DIV(a, b) ((a) / (b))
#define SPECKV_SQRT(a) sqrtf(a)
#define SPECKV_DADD(a, b) ((a) + (b))
#define SPECKV_DSUB(a, b) ((a) - (b))
#define SPECKV_DMUL(a, b) ((a) * (b))
#define SPECKV_DDIV(a, b) ((a) / (b))
#endif

namespace speckv {

// Sigma codes are clamped to the ladder's ends (rust: SIGMA_CODE_MIN / SIGMA_CODE_MAX).
constexpr int32_t SIGMA_CODE_MIN = -8 * 127;
constexpr int32_t SIGMA_CODE_MAX = 8 * 128;
// Returned for a sigma that is not positive and finite (rust: an InvalidArgument error); it
// lies outside the ladder, so a caller can find it with one comparison.
constexpr int16_t SIGMA_CODE_INVALID = INT16_MIN;

SPECKV_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
#endif
}

SPECKV_HD uint64_t f64_bits(double d) {
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t b;
    memcpy(&b, &d, 8);
    return b;
#endif
}

SPECKV_HD float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, 4);
    return f;
#endif
}

// round(8 log2 sigma) from the bits of a positive finite float32 (ladder.rs: sigma_code and
// MANTISSA_THRESHOLDS, ceil(2^23 (2^((2i+1)/16) - 1))); subnormals clamp to the ladder's
// bottom.
SPECKV_HD int16_t sigma_code(float sigma) {
    const uint32_t thresholds[8] = {371396u, 1164244u, 2028851u, 2971711u,
                                    3999908u, 5121165u, 6343903u, 7677310u};
    const uint32_t bits = f32_bits(sigma);
    const int32_t exponent = (int32_t)(bits >> 23);  // includes the sign bit: > 255 if negative
    if (exponent == 0) {
        return (bits & 0x7FFFFFu) == 0 ? SIGMA_CODE_INVALID : (int16_t)SIGMA_CODE_MIN;
    }
    if (exponent >= 255) {
        return SIGMA_CODE_INVALID;  // negative (sign bit), infinite or NaN
    }
    const uint32_t mantissa = bits & 0x7FFFFFu;
    int32_t step = 0;
    for (int i = 0; i < 8; ++i) {
        step += mantissa >= thresholds[i] ? 1 : 0;
    }
    int32_t code = 8 * (exponent - 127) + step;
    code = code < SIGMA_CODE_MIN ? SIGMA_CODE_MIN : code;
    code = code > SIGMA_CODE_MAX ? SIGMA_CODE_MAX : code;
    return (int16_t)code;
}

// The sigma code of sqrt(s^2 + (r mu)^2), every step one correctly rounded float32 operation
// in this order (lib.rs: relative_sigma_codes).
SPECKV_HD int16_t relative_sigma_code(float mu, float s, float r) {
    const float scaled = SPECKV_MUL(r, mu);
    return sigma_code(SPECKV_SQRT(SPECKV_ADD(SPECKV_MUL(s, s), SPECKV_MUL(scaled, scaled))));
}

// Largest finite float8_e4m3fn value (calibration.py: FP8_MAX).
constexpr float FP8_MAX = 448.0f;

// float32 -> float8_e4m3fn bits, rounding to nearest even; NaN and magnitudes >= 480 become
// NaN (0x7F with the sign), as PyTorch's fp8_e4m3fn_from_fp32_value does.
SPECKV_HD uint8_t e4m3fn_from_f32(float f) {
    const uint32_t fp8_max = 1087u << 20;     // 480.0f: rounds past the largest finite value
    const uint32_t denorm_mask = 141u << 23;  // 2^14: aligns e4m3's subnormal grid to f32's ulp
    uint32_t bits = f32_bits(f);
    const uint32_t sign = bits & 0x80000000u;
    bits ^= sign;
    uint8_t result;
    if (bits >= fp8_max) {
        result = 0x7F;
    } else if (bits < (121u << 23)) {
        // below e4m3's smallest normal (2^-6): one float addition rounds onto its grid
        bits = f32_bits(SPECKV_ADD(f32_from_bits(bits), f32_from_bits(denorm_mask)));
        result = (uint8_t)(bits - denorm_mask);
    } else {
        const uint32_t mantissa_odd = (bits >> 20) & 1u;
        bits += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu;
        bits += mantissa_odd;
        result = (uint8_t)(bits >> 20);
    }
    return (uint8_t)(result | (uint8_t)(sign >> 24));
}

SPECKV_HD bool is_nan(float f) { return (f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// What a CPU's arithmetic makes of a NaN operand: the same NaN, quieted (x86 and Arm propagate
// the first NaN operand; a GPU would return its canonical NaN and lose the sign and payload).
SPECKV_HD float quiet_nan(float f) { return f32_from_bits(f32_bits(f) | 0x00400000u); }

// The cache as stored in fp8 (calibration.py: fp8_quantize): x / scale, clamped to
// +-FP8_MAX (NaN stays NaN, keeping its sign), rounded to e4m3fn.
SPECKV_HD uint8_t fp8_quantize(float x, float scale) {
    if (is_nan(x)) {
        return e4m3fn_from_f32(x);
    }
    float v = SPECKV_DIV(x, scale);
    v = v > FP8_MAX ? FP8_MAX : (v < -FP8_MAX ? -FP8_MAX : v);
    return e4m3fn_from_f32(v);
}

// The prediction in the stored dtype's units (codec.py: _mu): for fp8, pred / scale; then,
// with the joint model, times the channel's gain (1.0 without: multiplying by one is exact).
// Gains and scales are finite and positive (calibration), so only `pred` can be NaN.
SPECKV_HD float coding_mu(float pred, float fp8_scale, bool fp8, float gain) {
    if (is_nan(pred)) {
        return quiet_nan(pred);  // NaN payloads reach the coder's fingerprint: keep the CPU's
    }
    const float mu = fp8 ? SPECKV_DIV(pred, fp8_scale) : pred;
    return SPECKV_MUL(mu, gain);
}

}  // namespace speckv
