// The joint residual model's coding parameters, for the GPU coder: every scalar of a jointly
// coded layer gets the conditional mu' it is coded against (invariant J1) and, with the token
// scale, its scaled sigma code (invariant J3), exactly as the Rust encoder computes them
// channel by channel. The encoder knows every value, so where the decoder must walk a token's
// channels in order, the encoder's tokens are independent: one GPU thread per (layer, token)
// walks that token's channels; the symbols kernel then codes (x, mu', code') as usual, the
// lanes restarting at every channel's run of tokens (speckv_coder.cuh: code_chunk's runs).
//
// Mirrors, each cited where it is used:
//   rust/speckv/src/joint.rs        the layout, J1 (conditional), J2 (plain layers), residual
//   rust/speckv/src/token_scale.rs  J3 (TokenEnergy::codes, TokenEnergy::add)
//   rust/speckv/src/codec.rs        joint_runs (the order of the steps for one channel)
#pragma once

#include "speckv_params.cuh"

namespace speckv {

// One stream's joint model (joint.rs: Joint), arrays on the device.
struct JointModel {
    const float* coef;     // layers x C x (E + C)
    const float* offset;   // layers x C
    const float* outside;  // layers x E x T residuals from outside the stream (E = 0: unused)
    const uint8_t* plain;  // per layer: 1 where coefficients and offsets are all zero (J2)
    const float* values;   // every pattern's value as float32, NaN where not finite
    const double* sigmas;  // (sigma, 1 / sigma) per sigma code (speckv_coder.cuh: ExactTables)
    uint32_t channels;     // C
    uint32_t tokens;       // T
    uint32_t outside_channels;  // E
    uint32_t width;        // bits per pattern: 8 or 16
    uint32_t prior;        // token scale (token_scale.rs: TokenScale); 0: none
    uint32_t clamp;
};

// joint.rs: residual, v - m or 0 where that is not finite
SPECKV_HD float joint_residual(float v, float m) {
    const float r = SPECKV_ADD(v, -m);
    return (f32_bits(r) & 0x7F800000u) == 0x7F800000u ? 0.0f : r;
}

SPECKV_HD float f32_from_f64(double d) {
#if defined(__CUDA_ARCH__)
    return __double2float_rn(d);
#else
    return (float)d;  // round to nearest even, as Rust's `as f32`
#endif
}

// One (layer, token): for each channel i in order, mu'[i] and the code it is coded with, and
// the token's residuals against the plain mu (`own`, what later channels condition on; also
// the outside residuals a values stream reads from its keys' stream). All arrays are the
// stream's, channel-major: scalar (layer, i, token) at (layer * C + i) * T + token.
SPECKV_HD void joint_item(const JointModel& j, const void* x, const float* mu, const int16_t* codes, float* mu_out,
                          int16_t* codes_out, float* own, uint64_t item) {
    const uint64_t T = j.tokens, C = j.channels, E = j.outside_channels;
    const uint64_t layer = item / T, token = item % T;
    const uint64_t base = layer * C * T + token;
    const bool plain = j.plain[layer] != 0;
    const float prior = (float)j.prior, clamp = (float)j.clamp;
    float energy = 0.0f;
    for (uint64_t i = 0; i < C; ++i) {
        const uint64_t at = base + i * T;
        const uint32_t bits = j.width == 8 ? (uint32_t)((const uint8_t*)x)[at] : (uint32_t)((const uint16_t*)x)[at];
        const float value = j.values[bits];
        own[at] = joint_residual(value, mu[at]);
        if (plain) {
            // J2: against mu itself, with the calibrated sigma, no token scale
            mu_out[at] = mu[at];
            codes_out[at] = codes[at];
            continue;
        }
        // J1: acc = offset, + a * o over the outside channels, + a * e over channels 0..i
        const float* row = j.coef + (layer * C + i) * (E + C);
        float acc = j.offset[layer * C + i];
        for (uint64_t k = 0; k < E; ++k) {
            const float a = row[k];
            if (a != 0.0f) acc = SPECKV_ADD(acc, SPECKV_MUL(a, j.outside[(layer * E + k) * T + token]));
        }
        for (uint64_t k = 0; k < i; ++k) {
            const float a = row[E + k];
            if (a != 0.0f) acc = SPECKV_ADD(acc, SPECKV_MUL(a, own[base + k * T]));
        }
        const float corrected = SPECKV_ADD(mu[at], acc);
        mu_out[at] = corrected;
        const int16_t code = codes[at];
        if (j.prior == 0) {
            codes_out[at] = code;
            continue;
        }
        // J3 (TokenEnergy::codes): ratio = (prior + E) * (1 / (prior + i)), a normal float
        const float inverse = SPECKV_DIV(1.0f, SPECKV_ADD(prior, (float)i));
        const int32_t shift = sigma_code(SPECKV_SQRT(SPECKV_MUL(SPECKV_ADD(prior, energy), inverse)));
        int32_t scaled = (int32_t)code + shift;
        scaled = scaled < SIGMA_CODE_MIN ? SIGMA_CODE_MIN : (scaled > SIGMA_CODE_MAX ? SIGMA_CODE_MAX : scaled);
        codes_out[at] = (int16_t)scaled;
        // J3 (TokenEnergy::add): the standardised residual against mu', squared, clamped
        int32_t c = code;
        c = c < SIGMA_CODE_MIN ? SIGMA_CODE_MIN : (c > SIGMA_CODE_MAX ? SIGMA_CODE_MAX : c);
        const float inverse_sigma = f32_from_f64(j.sigmas[2 * (c - SIGMA_CODE_MIN) + 1]);
        const float z = SPECKV_MUL(joint_residual(value, corrected), inverse_sigma);
        const float squared = SPECKV_MUL(z, z);
        energy = SPECKV_ADD(energy, squared < clamp ? squared : clamp);
    }
}

}  // namespace speckv
