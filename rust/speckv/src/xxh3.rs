//! XXH3-64 (seed 0, the default secret) of long inputs with the stripes accumulated in
//! AVX-512 or AVX2 registers, chosen at run time: the same 64 bits as `xxhash_rust`'s XXH3
//! (which this crate builds for baseline x86-64, where it takes the scalar or SSE2 loop), at
//! several times its speed. Every chunk a decoder reads is hashed twice (its checksum, and
//! the fingerprint of its `mu` and sigma codes: 7 bytes a scalar), which took 13-17% of a
//! predicted stream's decode before.
//!
//! `pair(a, b)` hashes `a` then `b` as one input, without copying them together: what
//! `xxhash_rust`'s streaming `Xxh3` digests after `update(a)`, `update(b)`. Inputs of at
//! most 240 bytes go to `xxhash_rust` itself. The long path follows `xxh3_64_long_impl` and
//! `hash_long_internal_loop` of `xxhash_rust::xxh3` (and `cuda/speckv_xxh3.cuh`, which
//! mirrors the same): stripes of 64 bytes added to eight 64-bit accumulators, a scramble
//! every 16 stripes, the last stripe at `len - 64`, the accumulators merged.

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

const SECRET_SIZE: usize = 192;
const STRIPE: usize = 64;
const CONSUME_RATE: usize = 8;
const STRIPES_PER_BLOCK: usize = (SECRET_SIZE - STRIPE) / CONSUME_RATE;
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;
const MERGE_START: usize = 11;
const LAST_START: usize = 7;
/// Longest input of the short paths (`xxhash_rust` takes those).
const MID_MAX: usize = 240;

/// `xxh3_common.rs`: DEFAULT_SECRET.
const SECRET: [u8; SECRET_SIZE] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d,
    0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0,
    0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0,
    0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b,
    0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac,
    0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51,
    0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34,
    0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49,
    0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8,
    0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b,
    0x40, 0x7e,
];

/// XXH3-64 of `a` followed by `b`.
pub fn pair(a: &[u8], b: &[u8]) -> u64 {
    let len = a.len() + b.len();
    if len <= MID_MAX {
        let mut joined = [0u8; MID_MAX];
        joined[..a.len()].copy_from_slice(a);
        joined[a.len()..len].copy_from_slice(b);
        return xxhash_rust::xxh3::xxh3_64(&joined[..len]);
    }
    let input = Input { a, b };
    #[cfg(target_arch = "x86_64")]
    {
        if avx512() {
            // SAFETY: `avx512()` checked at run time that this CPU has AVX-512F, the feature
            // `long_avx512` is compiled for.
            return unsafe { long_avx512(&input) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: checked just above that this CPU has AVX2, `long_avx2`'s feature.
            return unsafe { long_avx2(&input) };
        }
    }
    long_scalar(&input)
}

/// XXH3-64 of `bytes` (`pair` with nothing after).
pub fn one(bytes: &[u8]) -> u64 {
    pair(bytes, &[])
}

/// The input, `a` then `b`.
struct Input<'a> {
    a: &'a [u8],
    b: &'a [u8],
}

impl Input<'_> {
    fn len(&self) -> usize {
        self.a.len() + self.b.len()
    }

    /// The 64 bytes at `at`: in `a`, in `b`, or across both (copied into `scratch`).
    #[inline(always)]
    fn stripe<'s>(&'s self, at: usize, scratch: &'s mut [u8; STRIPE]) -> &'s [u8; STRIPE] {
        let na = self.a.len();
        if at + STRIPE <= na {
            self.a[at..at + STRIPE].try_into().unwrap()
        } else if at >= na {
            self.b[at - na..at - na + STRIPE].try_into().unwrap()
        } else {
            let head = na - at;
            scratch[..head].copy_from_slice(&self.a[at..]);
            scratch[head..].copy_from_slice(&self.b[..STRIPE - head]);
            scratch
        }
    }
}

fn read64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// `xxh3.rs`: accumulate_512_scalar, stripe by stripe; secret offset `secret`.
#[inline(always)]
fn accumulate_scalar(acc: &mut [u64; 8], stripe: &[u8; STRIPE], secret: usize) {
    for i in 0..8 {
        let value = read64(stripe, 8 * i);
        let key = value ^ read64(&SECRET, secret + 8 * i);
        acc[i ^ 1] = acc[i ^ 1].wrapping_add(value);
        acc[i] = acc[i].wrapping_add((key & 0xFFFF_FFFF).wrapping_mul(key >> 32));
    }
}

/// `xxh3.rs`: scramble_acc_scalar.
#[inline(always)]
fn scramble_scalar(acc: &mut [u64; 8]) {
    for (i, a) in acc.iter_mut().enumerate() {
        let key = read64(&SECRET, SECRET_SIZE - STRIPE + 8 * i);
        *a = ((*a ^ (*a >> 47)) ^ key).wrapping_mul(PRIME32_1);
    }
}

fn mul128_fold64(x: u64, y: u64) -> u64 {
    let p = x as u128 * y as u128;
    (p as u64) ^ ((p >> 64) as u64)
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

/// `xxh3_64_long_impl` with the scalar stripe operations (the portable build's).
fn long_scalar(input: &Input) -> u64 {
    let accumulate = |mut acc: [u64; 8], stripe: &[u8; STRIPE], secret: usize| {
        accumulate_scalar(&mut acc, stripe, secret);
        acc
    };
    let scramble = |mut acc: [u64; 8]| {
        scramble_scalar(&mut acc);
        acc
    };
    walk(input, INIT, accumulate, scramble, |acc, out| *out = acc)
}

#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f"))
}

/// The accumulators' starting values.
const INIT: [u64; 8] = [PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1];

/// `long`'s walk over the stripes with the accumulators held by the caller's kernel, `W`
/// holding them in registers between stripes; returns the merged hash.
#[inline(always)]
fn walk<W: Copy>(
    input: &Input,
    mut acc: W,
    accumulate: impl Fn(W, &[u8; STRIPE], usize) -> W,
    scramble: impl Fn(W) -> W,
    store: impl Fn(W, &mut [u64; 8]),
) -> u64 {
    let len = input.len();
    let mut scratch = [0u8; STRIPE];
    let blocks = (len - 1) / BLOCK;
    for b in 0..blocks {
        for s in 0..STRIPES_PER_BLOCK {
            acc = accumulate(acc, input.stripe(b * BLOCK + s * STRIPE, &mut scratch), s * CONSUME_RATE);
        }
        acc = scramble(acc);
    }
    let stripes = ((len - 1) - BLOCK * blocks) / STRIPE;
    for s in 0..stripes {
        acc = accumulate(acc, input.stripe(blocks * BLOCK + s * STRIPE, &mut scratch), s * CONSUME_RATE);
    }
    acc = accumulate(acc, input.stripe(len - STRIPE, &mut scratch), SECRET_SIZE - STRIPE - LAST_START);
    let mut out = [0u64; 8];
    store(acc, &mut out);
    merge(len, &out)
}

/// `xxh3_64_long_impl`'s last step: the accumulators merged with the secret.
fn merge(len: usize, acc: &[u64; 8]) -> u64 {
    let mut result = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let s = MERGE_START + 16 * i;
        result = result
            .wrapping_add(mul128_fold64(acc[2 * i] ^ read64(&SECRET, s), acc[2 * i + 1] ^ read64(&SECRET, s + 8)));
    }
    avalanche(result)
}

/// `long` with the accumulators in one AVX-512 register (`xxh3.rs`: accumulate_512_avx512
/// and scramble_acc_avx512's operations: the same sums and products, lane by lane).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn long_avx512(input: &Input) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY (every load and store below): unaligned, of 64 bytes from 64-byte arrays or
    // from the secret at `secret + 64 <= SECRET_SIZE` (every offset `walk` passes).
    let init = _mm512_loadu_si512(INIT.as_ptr() as *const __m512i);
    let scramble_key = _mm512_loadu_si512(SECRET[SECRET_SIZE - STRIPE..].as_ptr() as *const __m512i);
    let prime = _mm512_set1_epi64(PRIME32_1 as i64);
    let accumulate = |acc: __m512i, stripe: &[u8; STRIPE], secret: usize| {
        let data = _mm512_loadu_si512(stripe.as_ptr() as *const __m512i);
        let key = _mm512_loadu_si512(SECRET[secret..].as_ptr() as *const __m512i);
        let data_key = _mm512_xor_si512(data, key);
        let product = _mm512_mul_epu32(data_key, _mm512_srli_epi64::<32>(data_key));
        // each 64-bit lane's neighbour in its pair: acc[i ^ 1] += value
        let swapped = _mm512_shuffle_epi32::<0b01_00_11_10>(data);
        _mm512_add_epi64(acc, _mm512_add_epi64(swapped, product))
    };
    let scramble = |acc: __m512i| {
        let mixed = _mm512_xor_si512(_mm512_xor_si512(acc, _mm512_srli_epi64::<47>(acc)), scramble_key);
        let lo = _mm512_mul_epu32(mixed, prime);
        let hi = _mm512_mul_epu32(_mm512_srli_epi64::<32>(mixed), prime);
        _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(hi))
    };
    let store = |acc: __m512i, out: &mut [u64; 8]| _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, acc);
    walk(input, init, accumulate, scramble, store)
}

/// `long` with the accumulators in two AVX2 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn long_avx2(input: &Input) -> u64 {
    use std::arch::x86_64::*;
    // SAFETY (every load and store below): unaligned, of 32 bytes at offsets 0 and 32 of
    // 64-byte arrays or of the secret's 64 bytes at `secret + 64 <= SECRET_SIZE`.
    let init = [0, 4].map(|h| _mm256_loadu_si256(INIT[h..].as_ptr() as *const __m256i));
    let keys = [0, 32].map(|h| _mm256_loadu_si256(SECRET[SECRET_SIZE - STRIPE + h..].as_ptr() as *const __m256i));
    let prime = _mm256_set1_epi64x(PRIME32_1 as i64);
    let accumulate = |acc: [__m256i; 2], stripe: &[u8; STRIPE], secret: usize| {
        [0, 1].map(|h| {
            let data = _mm256_loadu_si256(stripe[32 * h..].as_ptr() as *const __m256i);
            let key = _mm256_loadu_si256(SECRET[secret + 32 * h..].as_ptr() as *const __m256i);
            let data_key = _mm256_xor_si256(data, key);
            let product = _mm256_mul_epu32(data_key, _mm256_srli_epi64::<32>(data_key));
            let swapped = _mm256_shuffle_epi32::<0b01_00_11_10>(data);
            _mm256_add_epi64(acc[h], _mm256_add_epi64(swapped, product))
        })
    };
    let scramble = |acc: [__m256i; 2]| {
        [0, 1].map(|h| {
            let mixed = _mm256_xor_si256(_mm256_xor_si256(acc[h], _mm256_srli_epi64::<47>(acc[h])), keys[h]);
            let lo = _mm256_mul_epu32(mixed, prime);
            let hi = _mm256_mul_epu32(_mm256_srli_epi64::<32>(mixed), prime);
            _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi))
        })
    };
    let store = |acc: [__m256i; 2], out: &mut [u64; 8]| {
        for (h, a) in acc.iter().enumerate() {
            _mm256_storeu_si256(out[4 * h..].as_mut_ptr() as *mut __m256i, *a);
        }
    };
    walk(input, init, accumulate, scramble, store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    /// Every length path and block boundary, the two parts split anywhere (across a stripe,
    /// at one, inside the last stripe), against `xxhash_rust`'s one-shot and streaming hashes;
    /// each kernel this CPU has.
    #[test]
    fn pair_is_xxhash_rusts_xxh3() {
        let lengths =
            [0, 1, 16, 17, 128, 129, 240, 241, 255, 256, 1023, 1024, 1025, 1088, 2047, 2048, 2049, 5000, 70_001];
        for (k, &n) in lengths.iter().enumerate() {
            let data = bytes(n, k as u64);
            let want = xxhash_rust::xxh3::xxh3_64(&data);
            for split in [0, 1, n / 3, n.saturating_sub(70), n.saturating_sub(64), n.saturating_sub(1), n] {
                let split = split.min(n);
                let (a, b) = data.split_at(split);
                assert_eq!(pair(a, b), want, "length {n}, split at {split}");
                let mut streaming = xxhash_rust::xxh3::Xxh3::new();
                streaming.update(a);
                streaming.update(b);
                assert_eq!(streaming.digest(), want);
                if n > MID_MAX {
                    let input = Input { a, b };
                    assert_eq!(long_scalar(&input), want, "scalar, {n}");
                    #[cfg(target_arch = "x86_64")]
                    if is_x86_feature_detected!("avx2") {
                        // SAFETY: the CPU has AVX2 (checked).
                        assert_eq!(unsafe { long_avx2(&input) }, want, "avx2, {n}");
                    }
                    #[cfg(target_arch = "x86_64")]
                    if avx512() {
                        // SAFETY: the CPU has AVX-512F (checked).
                        assert_eq!(unsafe { long_avx512(&input) }, want, "avx512, {n}");
                    }
                }
            }
            assert_eq!(one(&data), want);
        }
    }
}
