// XXH3-64 (seed 0, default secret) of two byte strings one after the other: a chunk's
// prediction fingerprint is XXH3 over its mu's bytes then its sigma codes' bytes
// (rust/speckv/src/prediction.rs: codes_and_fingerprint, through the xxhash-rust crate), and
// the GPU computes it where mu and the codes are, so they never cross to the host.
//
// One source for nvcc, NVRTC and the host compiler (see speckv_params.cuh); integer
// arithmetic only. Input is read a byte at a time: the device cannot load unaligned words,
// and the two parts meet at any offset. Follows the reference algorithm's paths by length
// (0-16, 17-128, 129-240, longer), each cited by the xxhash-rust function it mirrors.
#pragma once

#include "speckv_params.cuh"

namespace speckv {
namespace xxh3 {

constexpr uint64_t PRIME32_1 = 0x9E3779B1ull;
constexpr uint64_t PRIME32_2 = 0x85EBCA77ull;
constexpr uint64_t PRIME32_3 = 0xC2B2AE3Dull;
constexpr uint64_t PRIME64_1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t PRIME64_2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t PRIME64_3 = 0x165667B19E3779F9ull;
constexpr uint64_t PRIME64_4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t PRIME64_5 = 0x27D4EB2F165667C5ull;

constexpr uint32_t SECRET_SIZE = 192;  // DEFAULT_SECRET_SIZE
constexpr uint32_t STRIPE_LEN = 64;
constexpr uint32_t SECRET_CONSUME_RATE = 8;
constexpr uint32_t SECRET_MERGEACCS_START = 11;
constexpr uint32_t SECRET_LASTACC_START = 7;
constexpr uint32_t SECRET_SIZE_MIN = 136;

// xxh3_common.rs: DEFAULT_SECRET
#if defined(__CUDA_ARCH__)
__device__
#endif
    static const uint8_t SECRET[SECRET_SIZE] = {
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
        0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
        0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
        0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
        0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
        0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
        0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
        0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
        0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
        0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
        0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
        0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

// The input: `a` then `b`, read little-endian at any byte offset.
struct Input {
    const uint8_t* a;
    uint64_t na;
    const uint8_t* b;
    uint64_t len;  // na + bytes of b

    SPECKV_HD_MEMBER uint8_t byte(uint64_t at) const { return at < na ? a[at] : b[at - na]; }
    SPECKV_HD_MEMBER uint64_t read64(uint64_t at) const {
        uint64_t v = 0;
        for (int i = 7; i >= 0; --i) v = (v << 8) | byte(at + (uint64_t)i);
        return v;
    }
    SPECKV_HD_MEMBER uint32_t read32(uint64_t at) const {
        uint32_t v = 0;
        for (int i = 3; i >= 0; --i) v = (v << 8) | byte(at + (uint64_t)i);
        return v;
    }
};

SPECKV_HD uint64_t secret64(uint32_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | SECRET[at + (uint32_t)i];
    return v;
}

SPECKV_HD uint32_t secret32(uint32_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | SECRET[at + (uint32_t)i];
    return v;
}

// xxh3_common.rs: mul128_fold64, the low and high halves of the 128-bit product xored
SPECKV_HD uint64_t mul128_fold64(uint64_t x, uint64_t y) {
#if defined(__CUDA_ARCH__)
    return (x * y) ^ __umul64hi(x, y);
#else
    const unsigned __int128 p = (unsigned __int128)x * y;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}

SPECKV_HD uint64_t rotl64(uint64_t x, uint32_t r) { return (x << r) | (x >> (64 - r)); }

SPECKV_HD uint32_t swap32(uint32_t x) {
    return (x >> 24) | ((x >> 8) & 0xFF00u) | ((x << 8) & 0xFF0000u) | (x << 24);
}

SPECKV_HD uint64_t swap64(uint64_t x) { return ((uint64_t)swap32((uint32_t)x) << 32) | swap32((uint32_t)(x >> 32)); }

// xxh3_common.rs: avalanche
SPECKV_HD uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}

// xxh3_common.rs: strong_avalanche
SPECKV_HD uint64_t strong_avalanche(uint64_t h, uint64_t len) {
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= 0x9FB21C651E98DF25ull;
    h ^= (h >> 35) + len;
    h *= 0x9FB21C651E98DF25ull;
    return h ^ (h >> 28);
}

// xxh64.rs: avalanche
SPECKV_HD uint64_t xxh64_avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= PRIME64_2;
    h ^= h >> 29;
    h *= PRIME64_3;
    return h ^ (h >> 32);
}

// xxh3.rs: mix16_b (seed 0)
SPECKV_HD uint64_t mix16(const Input& in, uint64_t at, uint32_t secret) {
    return mul128_fold64(in.read64(at) ^ secret64(secret), in.read64(at + 8) ^ secret64(secret + 8));
}

// xxh3.rs: xxh3_64_0to16
SPECKV_HD uint64_t hash_0to16(const Input& in) {
    const uint64_t len = in.len;
    if (len > 8) {
        const uint64_t lo = in.read64(0) ^ (secret64(24) ^ secret64(32));
        const uint64_t hi = in.read64(len - 8) ^ (secret64(40) ^ secret64(48));
        return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
    }
    if (len >= 4) {
        const uint64_t input64 = (uint64_t)in.read32(len - 4) + ((uint64_t)in.read32(0) << 32);
        return strong_avalanche(input64 ^ (secret64(8) ^ secret64(16)), len);
    }
    if (len > 0) {
        const uint32_t combo = ((uint32_t)in.byte(0) << 16) | ((uint32_t)in.byte(len >> 1) << 24) |
                               (uint32_t)in.byte(len - 1) | ((uint32_t)len << 8);
        return xxh64_avalanche((uint64_t)combo ^ (uint64_t)(secret32(0) ^ secret32(4)));
    }
    return xxh64_avalanche(secret64(56) ^ secret64(64));
}

// xxh3.rs: xxh3_64_7to128 (17..=128 bytes here)
SPECKV_HD uint64_t hash_17to128(const Input& in) {
    const uint64_t len = in.len;
    uint64_t acc = len * PRIME64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in, 48, 96);
                acc += mix16(in, len - 64, 112);
            }
            acc += mix16(in, 32, 64);
            acc += mix16(in, len - 48, 80);
        }
        acc += mix16(in, 16, 32);
        acc += mix16(in, len - 32, 48);
    }
    acc += mix16(in, 0, 0);
    acc += mix16(in, len - 16, 16);
    return avalanche(acc);
}

// xxh3.rs: xxh3_64_129to240
SPECKV_HD uint64_t hash_129to240(const Input& in) {
    const uint64_t len = in.len;
    uint64_t acc = len * PRIME64_1;
    const uint32_t rounds = (uint32_t)(len / 16);
    for (uint32_t i = 0; i < 8; ++i) acc += mix16(in, 16ull * i, 16 * i);
    acc = avalanche(acc);
    for (uint32_t i = 8; i < rounds; ++i) acc += mix16(in, 16ull * i, 16 * (i - 8) + 3);
    acc += mix16(in, len - 16, SECRET_SIZE_MIN - 17);
    return avalanche(acc);
}

// xxh3.rs: accumulate_512_scalar
SPECKV_HD void accumulate_512(uint64_t acc[8], const Input& in, uint64_t at, uint32_t secret) {
    for (uint32_t i = 0; i < 8; ++i) {
        const uint64_t value = in.read64(at + 8ull * i);
        const uint64_t key = value ^ secret64(secret + 8 * i);
        acc[i ^ 1] += value;
        acc[i] += (key & 0xFFFFFFFFull) * (key >> 32);
    }
}

// xxh3.rs: scramble_acc_scalar
SPECKV_HD void scramble(uint64_t acc[8]) {
    for (uint32_t i = 0; i < 8; ++i) {
        const uint64_t key = secret64(SECRET_SIZE - STRIPE_LEN + 8 * i);
        acc[i] = ((acc[i] ^ (acc[i] >> 47)) ^ key) * PRIME32_1;
    }
}

// A long input's full blocks (of STRIPES_PER_BLOCK stripes), each ended by a scramble;
// the stripes after the last one are the tail.
constexpr uint32_t STRIPES_PER_BLOCK = (SECRET_SIZE - STRIPE_LEN) / SECRET_CONSUME_RATE;
constexpr uint64_t BLOCK_LEN = (uint64_t)STRIPE_LEN * STRIPES_PER_BLOCK;

// Full blocks of an input of `len` bytes (none where the input is not long).
SPECKV_HD uint64_t long_blocks(uint64_t len) { return len > 240 ? (len - 1) / BLOCK_LEN : 0; }

// What block `b`'s stripes add to the accumulators. accumulate_512 only adds (mod 2^64), so
// the block's additions summed apart, in any order, then added to the accumulators before the
// block's scramble give the same accumulators as adding them one stripe at a time: the blocks
// of an input are summed in parallel (speckv_fingerprint_blocks) and only the scrambles chain.
SPECKV_HD void block_sums(const Input& in, uint64_t b, uint64_t sums[8]) {
    for (uint32_t i = 0; i < 8; ++i) sums[i] = 0;
    for (uint32_t s = 0; s < STRIPES_PER_BLOCK; ++s)
        accumulate_512(sums, in, b * BLOCK_LEN + (uint64_t)s * STRIPE_LEN, s * SECRET_CONSUME_RATE);
}

// xxh3.rs: xxh3_64_long_impl and hash_long_internal_loop (more than 240 bytes). `sums`: each
// full block's block_sums, 8 a block, computed beforehand; nullptr computes them here.
SPECKV_HD uint64_t hash_long(const Input& in, const uint64_t* sums) {
    const uint64_t len = in.len;
    uint64_t acc[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    const uint64_t blocks = long_blocks(len);
    for (uint64_t b = 0; b < blocks; ++b) {
        uint64_t own[8];
        const uint64_t* add = sums != nullptr ? sums + 8 * b : own;
        if (sums == nullptr) block_sums(in, b, own);
        for (uint32_t i = 0; i < 8; ++i) acc[i] += add[i];
        scramble(acc);
    }
    const uint32_t stripes = (uint32_t)(((len - 1) - BLOCK_LEN * blocks) / STRIPE_LEN);
    for (uint32_t s = 0; s < stripes; ++s)
        accumulate_512(acc, in, blocks * BLOCK_LEN + (uint64_t)s * STRIPE_LEN, s * SECRET_CONSUME_RATE);
    accumulate_512(acc, in, len - STRIPE_LEN, SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START);
    uint64_t result = len * PRIME64_1;
    for (uint32_t i = 0; i < 4; ++i) {
        const uint32_t s = SECRET_MERGEACCS_START + 16 * i;
        result += mul128_fold64(acc[2 * i] ^ secret64(s), acc[2 * i + 1] ^ secret64(s + 8));
    }
    return avalanche(result);
}

}  // namespace xxh3

// XXH3-64 of `a` (na bytes) followed by `b` (nb bytes): what xxhash-rust's streaming Xxh3
// digests after update(a), update(b). `sums`: the input's xxh3::block_sums, 8 for each of its
// xxh3::long_blocks, or nullptr to compute them here.
SPECKV_HD uint64_t xxh3_64(const uint8_t* a, uint64_t na, const uint8_t* b, uint64_t nb,
                           const uint64_t* sums = nullptr) {
    const xxh3::Input in{a, na, b, na + nb};
    if (in.len <= 16) return xxh3::hash_0to16(in);
    if (in.len <= 128) return xxh3::hash_17to128(in);
    if (in.len <= 240) return xxh3::hash_129to240(in);
    return xxh3::hash_long(in, sums);
}

}  // namespace speckv
