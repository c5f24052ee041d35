// The range coder of predicted streams, for the GPU: a cache's chunks coded where the cache
// lives, so that only coded bytes cross to the host (~0.8 byte per bf16 scalar instead of the
// 4 bytes of the target and its prediction). Byte for byte what the Rust encoder writes for
// the exact model (8- and 16-bit formats; with the joint model, speckv_joint.cuh computes each
// scalar's parameters first), so a stream coded here decodes anywhere and equals the CPU
// path's stream.
//
// One source for nvcc, NVRTC and the host compiler (see speckv_params.cuh; the CPU tests run
// this very code through host_shim.cpp and compare the bytes with the Rust encoder's). Four
// steps, each a kernel in speckv_coder.cu:
//   1. exact_symbol(): per scalar, the interval the exact model gives it (float64 work, every
//      operation correctly rounded, as the Rust core does it) or an escape. Independent per
//      scalar: one GPU thread each.
//   2. escape_symbols(): per chunk, in scalar order, the escape model's intervals for the
//      chunk's escapes (the one state the eight lanes share; the walk visits only the
//      escapes, which are rare).
//   3. code_lane(): per chunk and lane, that lane's range coder over its scalars (integer
//      work only): eight threads a chunk.
//   4. join_word(): a chunk's payload, lane lengths then lanes, a word at a time.
//
// Mirrors, each cited where it is used:
//   rust/speckv/src/exact.rs          setup, window, cum, encode_one / encode_slow
//   rust/speckv/src/model/mixture.rs  MixtureCdf::eval
//   rust/speckv/src/model/grid.rs     lower_edge, ordinal_toward_zero
//   rust/speckv/src/coder/encoder.rs  RangeEncoder::put, finish (coder invariants 1-5)
//   rust/speckv/src/model/adaptive.rs AdaptiveModel (the escape model's counters)
//   rust/speckv/src/model/raw.rs      RawPatternModel::encode
//   rust/speckv/src/codec.rs          join_lanes
#pragma once

#include "speckv_params.cuh"
#include "speckv_xxh3.cuh"

namespace speckv {

// Coders per chunk (chunk.rs: LANES, format version 2): scalar i of a chunk goes to lane i % 8.
constexpr uint32_t LANES = 8;

// A symbol word (step 1's output): cum in bits 0-31, freq in bits 32-62, and this flag when
// the scalar's raw pattern follows (an escape; freq 0: a non-finite mu, the pattern alone).
constexpr uint64_t SYMBOL_RAW = 1ull << 63;

// Everything fixed for a stream that coding reads, taken from the Rust core's own tables
// (speckv._speckv.exact_tables), so nothing here is recomputed with another libm.
struct ExactTables {
    const uint32_t* nodes;  // MixtureCdf nodes (with the repeated last one)
    const float* edges;     // ValueGrid lower edges, min_ordinal upwards, then the top edge
    const double* sigmas;   // SigmaTable: (sigma, 1 / sigma) per code SIGMA_CODE_MIN..=MAX
    double half_width;      // MixtureCdf::half_width
    double last;            // nodes.len() - 2: the highest grid position
    int64_t min_ordinal;
    int64_t max_ordinal;
    int64_t exponent_bias;
    uint32_t n_edges;
    uint32_t g_max;
    uint32_t precision;  // of the exact model's symbols (table_precision)
    uint32_t width;      // bits per pattern: 8 or 16
    uint32_t mantissa_bits;
    uint32_t max_magnitude;
    uint32_t adapt_increment;  // ModelParams: the escape model's counters
    uint32_t adapt_period;
    uint32_t adapt_shift;
};

// dtype.rs: ordinal_of, a signed integer that sorts like the values
SPECKV_HD int64_t ordinal_of(uint32_t bits, uint32_t width) {
    const int64_t b = (int64_t)bits;
    const int64_t sign = -((b >> (width - 1)) & 1);
    return (b & ((1ll << (width - 1)) - 1)) ^ sign;
}

// grid.rs: ValueGrid::lower_edge (out-of-range k clamped)
SPECKV_HD double lower_edge(const ExactTables& t, int64_t k) {
    int64_t i = k - t.min_ordinal;
    i = i < 0 ? 0 : (i > (int64_t)t.n_edges - 1 ? (int64_t)t.n_edges - 1 : i);
    return (double)t.edges[i];
}

// grid.rs: ValueGrid::ordinal_toward_zero, integer work on the bits of v
SPECKV_HD int64_t ordinal_toward_zero(const ExactTables& t, double v) {
    const uint64_t bits = f64_bits(v);
    const int64_t negative = (int64_t)(bits >> 63);
    const uint32_t m = t.mantissa_bits;
    const int64_t e64 = (int64_t)((bits >> 52) & 0x7FF);
    const uint64_t frac = bits & ((1ull << 52) - 1);
    uint64_t magnitude;
    if (e64 == 0x7FF) {
        magnitude = frac != 0 ? 0 : t.max_magnitude;
    } else {
        const int64_t e = e64 - 1023 + t.exponent_bias;
        if (e >= 1) {
            magnitude = ((uint64_t)e << m) | (frac >> (52 - m));
            magnitude = magnitude < t.max_magnitude ? magnitude : t.max_magnitude;
        } else {
            const int64_t shift = (int64_t)(52 - m) + (1 - e);
            magnitude = (shift >= 64 || e64 == 0) ? 0 : (frac | (1ull << 52)) >> shift;
        }
    }
    return (int64_t)magnitude ^ -negative;
}

// mixture.rs: MixtureCdf::eval, G(z) by linear interpolation in integers
SPECKV_HD uint32_t mixture_eval(const ExactTables& t, double z) {
    double pos = SPECKV_DMUL(SPECKV_DADD(z, t.half_width), 64.0);  // STEPS_PER_Z
    pos = pos < 0.0 ? 0.0 : pos;
    pos = pos > t.last ? t.last : pos;
    const int64_t fixed = (int64_t)SPECKV_DMUL(pos, 65536.0);  // FRACTION_BITS = 16; pos >= 0: a floor
    const int64_t i = fixed >> 16;
    const uint64_t fraction = (uint64_t)(fixed & 0xFFFF);
    const uint32_t a = t.nodes[i], b = t.nodes[i + 1];
    return a + (uint32_t)(((uint64_t)(b - a) * fraction) >> 16);
}

// exact.rs: Exact::cum, G at the pattern's lower edge plus one unit per pattern ("leak")
SPECKV_HD uint32_t exact_cum(const ExactTables& t, double mu, double inv_sigma, int64_t lo, int64_t k) {
    const double z = SPECKV_DMUL(SPECKV_DSUB(lower_edge(t, k), mu), inv_sigma);
    return mixture_eval(t, z) + (uint32_t)(k - lo);
}

// Step 1 (exact.rs: setup, window, encode_one / encode_slow): the symbol word of one scalar.
SPECKV_HD uint64_t exact_symbol(const ExactTables& t, uint32_t x_bits, float mu_f, int16_t code) {
    if ((f32_bits(mu_f) & 0x7F800000u) == 0x7F800000u) {
        return SYMBOL_RAW;  // a non-finite mu predicts nothing
    }
    int32_t c = code;
    c = c < SIGMA_CODE_MIN ? SIGMA_CODE_MIN : (c > SIGMA_CODE_MAX ? SIGMA_CODE_MAX : c);
    const double sigma = t.sigmas[2 * (c - SIGMA_CODE_MIN)];
    const double inv_sigma = t.sigmas[2 * (c - SIGMA_CODE_MIN) + 1];
    const double mu = (double)mu_f;  // exact
    int64_t lo, n;
    if (t.max_ordinal < 256) {
        // an 8-bit format's window is every finite pattern
        lo = t.min_ordinal;
        n = t.max_ordinal - t.min_ordinal + 1;
    } else {
        const double reach = SPECKV_DMUL(t.half_width, sigma);
        lo = ordinal_toward_zero(t, SPECKV_DSUB(mu, reach)) - 1;
        lo = lo > t.min_ordinal ? lo : t.min_ordinal;
        int64_t hi = ordinal_toward_zero(t, SPECKV_DADD(mu, reach)) + 1;
        hi = hi < t.max_ordinal ? hi : t.max_ordinal;
        n = hi - lo + 1;
    }
    const int64_t k = ordinal_of(x_bits, t.width);
    if (k >= lo && k < lo + n) {
        const uint32_t below = exact_cum(t, mu, inv_sigma, lo, k);
        const uint32_t above = exact_cum(t, mu, inv_sigma, lo, k + 1);
        return (uint64_t)below | ((uint64_t)(above - below) << 32);
    }
    const uint32_t escape = t.g_max + (uint32_t)n;
    return SYMBOL_RAW | escape | ((uint64_t)((1u << t.precision) - escape) << 32);
}

// encoder.rs: RangeEncoder (coder invariants 1-5 in rust/speckv/src/coder/mod.rs). `words`
// has room for every word the lane can write (the caller sizes it by `lane_capacity`).
struct RangeEncoder {
    uint64_t low;
    uint64_t range;
    uint32_t* words;
    uint32_t n;

    // invariant 3: a carry ripples into the words already written
    SPECKV_HD_MEMBER void add_to_low(uint64_t amount) {
        const uint64_t sum = low + amount;
        if (sum < low) {
            for (uint32_t j = n; j-- > 0;) {
                if (++words[j] != 0) break;
            }
        }
        low = sum;
    }

    SPECKV_HD_MEMBER void put(uint32_t cum, uint32_t freq, uint32_t precision) {
        const uint64_t r = range >> precision;
        add_to_low(r * cum);
        range = r * freq;
        if (range < (1ull << 32)) {
            words[n++] = (uint32_t)(low >> 32);
            low <<= 32;
            range <<= 32;
        }
    }

    // coder/mod.rs: SymbolSink::put_bits
    SPECKV_HD_MEMBER void put_bits(uint32_t value, uint32_t nbits) {
        if (nbits == 0) return;
        if (nbits <= 16) {
            put(value, 1, nbits);
        } else {
            put(value >> 16, 1, nbits - 16);
            put(value & 0xFFFF, 1, 16);
        }
    }

    // invariant 5 (RangeEncoder::finish): the final word, the point of the final interval
    // with the most trailing zero bits; returns the lane's length in bytes (its last word
    // loses up to three zero low bytes).
    SPECKV_HD_MEMBER uint32_t finish() {
        const uint64_t end_lo = low + range, end_hi = end_lo < low ? 1 : 0;
        uint32_t zeros = 32;
        while (zeros < 63) {
            const uint64_t mask = (1ull << (zeros + 1)) - 1;
            uint64_t up_lo = low + mask;
            const uint64_t up_hi = up_lo < low ? 1 : 0;
            up_lo &= ~mask;
            if (!(up_hi < end_hi || (up_hi == end_hi && up_lo < end_lo))) break;
            ++zeros;
        }
        const uint64_t round_up = (1ull << zeros) - 1;
        add_to_low(round_up);
        low &= ~round_up;
        words[n++] = (uint32_t)(low >> 32);
        uint32_t skip = (zeros - 32) / 8;
        skip = skip < 3 ? skip : 3;
        return 4 * n - skip;
    }
};

// Words a lane of `scalars` scalars may write: every scalar's symbols span at most 72 bits
// of precision (the exact model's 24, then on an escape 16 + 16 for the raw model's two
// adaptive symbols and at most 16 uniform bits), each symbol loses under 2^-8 of the range
// to truncation (invariant 4), and a word goes out per 32 bits consumed; plus the final word.
SPECKV_HD uint32_t lane_capacity(uint32_t scalars) { return (uint32_t)(((uint64_t)scalars * 73 + 31) / 32) + 2; }

// adaptive.rs: AdaptiveModel, counts and CDF in caller-provided arrays of n and n + 1.
struct AdaptiveModel {
    uint32_t* counts;
    uint32_t* cdf;
    uint32_t n;
    uint32_t min_freq;
    uint32_t increment;
    uint32_t period;
    uint32_t shift;
    uint32_t since_rebuild;

    SPECKV_HD_MEMBER void init(uint32_t symbols, uint32_t* count_store, uint32_t* cdf_store, const ExactTables& t) {
        counts = count_store;
        cdf = cdf_store;
        n = symbols;
        const uint32_t reserved = 16;  // RESERVED_FOR_OTHERS
        min_freq = (reserved + (n - 1) - 1) / (n - 1);
        min_freq = min_freq > 1 ? min_freq : 1;
        increment = t.adapt_increment;
        period = t.adapt_period;
        shift = t.adapt_shift;
        since_rebuild = 0;
        for (uint32_t i = 0; i < n; ++i) counts[i] = 1;
        rebuild();
    }

    SPECKV_HD_MEMBER void rebuild() {
        const uint64_t budget = (1ull << 16) - (uint64_t)n * min_freq;
        uint64_t sum = 0;
        for (uint32_t i = 0; i < n; ++i) sum += counts[i];
        const uint64_t scale = (budget << 32) / sum;
        uint32_t acc = 0, best = 0, best_count = 0;
        for (uint32_t i = 0; i < n; ++i) {
            cdf[i] = acc;
            acc += min_freq + (uint32_t)(((uint64_t)counts[i] * scale) >> 32);
            if (counts[i] > best_count) {
                best = i;
                best_count = counts[i];
            }
        }
        const uint32_t leftover = (1u << 16) - acc;
        for (uint32_t i = best + 1; i <= n; ++i) cdf[i] += leftover;
        cdf[n] = 1u << 16;
    }

    // adaptive.rs' encode without the coder: the symbol's interval, packed as an escape half
    // (its cum, then its freq - 1, 16 bits each: cum < 2^16 since freq >= 1, freq <= 2^16),
    // and the counters' update; code_lane() puts the interval into the lane's coder.
    SPECKV_HD_MEMBER uint32_t take(uint32_t symbol) {
        const uint32_t lo = cdf[symbol], freq = cdf[symbol + 1] - lo;
        counts[symbol] += increment;
        if (++since_rebuild == period) {
            since_rebuild = 0;
            for (uint32_t i = 0; i < n; ++i) counts[i] -= counts[i] >> shift;
            rebuild();
        }
        return lo | (freq - 1) << 16;
    }
};

// The adaptive models' precision (adaptive.rs: PRECISION).
constexpr uint32_t ADAPTIVE_PRECISION = 16;

// Largest alphabets of the raw model for 8- and 16-bit formats (bfloat16's sign + exponent,
// float16's eight modelled mantissa bits).
constexpr uint32_t MAX_HEAD_SYMBOLS = 512;
constexpr uint32_t MAX_MANTISSA_SYMBOLS = 256;

// The pattern of scalar i of an 8- or 16-bit tensor.
SPECKV_HD uint32_t word_at(const void* x, uint32_t width, uint64_t i) {
    return width == 8 ? (uint32_t)((const uint8_t*)x)[i] : (uint32_t)((const uint16_t*)x)[i];
}

// The raw model's split of an escaped pattern (raw.rs: RawPatternModel): sign + exponent,
// then the top MODELLED_MANTISSA_BITS of the mantissa (adaptive symbols), then the rest
// (uniform bits).
struct RawSplit {
    uint32_t m, uniform;
    SPECKV_HD_MEMBER explicit RawSplit(const ExactTables& t)
        : m(t.mantissa_bits), uniform(t.mantissa_bits - (t.mantissa_bits < 8 ? t.mantissa_bits : 8)) {}
    SPECKV_HD_MEMBER uint32_t head(uint32_t bits) const { return bits >> m; }
    SPECKV_HD_MEMBER uint32_t mantissa(uint32_t bits) const { return (bits & ((1u << m) - 1)) >> uniform; }
    SPECKV_HD_MEMBER uint32_t rest(uint32_t bits) const { return bits & ((1u << uniform) - 1); }
};

// Step 2 (raw.rs: RawPatternModel::encode, the intervals only): the escape model belongs to
// the chunk, not to a lane, and moves on at every escape in scalar order, so it is walked
// once per chunk before the lanes code; only the escapes are visited (`positions`, ascending:
// the chunk's escaped scalars, found beforehand), as they are rare. For each, `escapes[i]`
// gets its head interval (bits 0-31) and its mantissa interval (bits 32-63), each as
// AdaptiveModel::take packs it; other entries are not written.
SPECKV_HD void escape_symbols(const ExactTables& t, const void* x, const int64_t* positions, uint64_t count,
                              uint64_t* escapes) {
    const RawSplit split(t);
    uint32_t head_counts[MAX_HEAD_SYMBOLS], head_cdf[MAX_HEAD_SYMBOLS + 1];
    uint32_t mantissa_counts[MAX_MANTISSA_SYMBOLS], mantissa_cdf[MAX_MANTISSA_SYMBOLS + 1];
    AdaptiveModel head, mantissa;
    head.init(1u << (t.width - split.m), head_counts, head_cdf, t);
    mantissa.init(1u << (split.m - split.uniform), mantissa_counts, mantissa_cdf, t);
    for (uint64_t k = 0; k < count; ++k) {
        const uint64_t i = (uint64_t)positions[k];
        const uint32_t bits = word_at(x, t.width, i);
        const uint64_t h = head.take(split.head(bits));
        escapes[i] = h | (uint64_t)mantissa.take(split.mantissa(bits)) << 32;
    }
}

// Symbol words a lane's thread loads ahead (code_lane).
constexpr uint32_t LANE_GROUP = 8;

// Step 3 (chunk.rs: encode_predicted for the exact model, raw.rs for escapes): lane `lane` of
// a chunk of `n` scalars, whose symbol words, escape intervals (step 2) and patterns are
// `symbols`, `escapes` and `x`, coded into `words` (lane_capacity of the lane's scalars);
// returns the lane's length in bytes. Each lane's coder sees its own scalars in order, as in
// the Rust encoder, which hands them to the lanes in turn; the escape model's part was step 2.
//
// Runs: the Rust encoder hands the coder a chunk in runs, and each run starts again at lane
// 0 (its scalar k goes to lane k % 8). A plain stream's chunk is one run (`layer_scalars` 0); a
// jointly coded chunk is whole layers of `layer_scalars`, layer l of the chunk in runs of
// `runs[l]` (codec.rs: joint_runs: a channel's tokens, or the whole layer where it is coded
// plainly, J2), the last run of a layer ending with it.
SPECKV_HD uint32_t code_lane(const ExactTables& t, const void* x, const uint64_t* symbols, const uint64_t* escapes,
                             uint32_t n, uint32_t lane, uint32_t* words, uint32_t layer_scalars,
                             const uint32_t* runs) {
    const RawSplit split(t);
    RangeEncoder enc{0, ~0ull, words, 0};
    const uint32_t layer_len = layer_scalars ? layer_scalars : n;
    for (uint32_t layer_start = 0, layer = 0; layer_start < n; layer_start += layer_len, ++layer) {
        const uint32_t layer_end = n - layer_start < layer_len ? n : layer_start + layer_len;
        const uint32_t run = layer_scalars ? runs[layer] : n;
        for (uint32_t run_start = layer_start; run_start < layer_end; run_start += run) {
            const uint32_t run_end = layer_end - run_start < run ? layer_end : run_start + run;
            for (uint32_t first = run_start + lane; first < run_end; first += LANES * LANE_GROUP) {
                // the lane's next LANE_GROUP symbol words are loaded before any is coded: that
                // many loads in flight instead of one at a time (a GPU thread does not run ahead
                // of a load it waits on, and a chunk's eight threads are all a warp has of it)
                uint64_t group[LANE_GROUP];
                const uint32_t size = (run_end - first + LANES - 1) / LANES;
                const uint32_t count = size < LANE_GROUP ? size : LANE_GROUP;
                for (uint32_t g = 0; g < count; ++g) group[g] = symbols[first + g * LANES];
                for (uint32_t g = 0; g < count; ++g) {
                    const uint64_t s = group[g];
                    const uint32_t freq = (uint32_t)(s >> 32) & 0x7FFFFFFFu;
                    if (freq != 0) enc.put((uint32_t)s, freq, t.precision);
                    if (s & SYMBOL_RAW) {
                        const uint32_t i = first + g * LANES;
                        const uint64_t e = escapes[i];
                        for (uint32_t half = 0; half < 2; ++half) {
                            const uint32_t interval = (uint32_t)(e >> (32 * half));
                            enc.put(interval & 0xFFFFu, (interval >> 16) + 1, ADAPTIVE_PRECISION);
                        }
                        enc.put_bits(split.rest(word_at(x, t.width, i)), split.uniform);
                    }
                }
            }
        }
    }
    return enc.finish();
}

// A chunk's payload length (join_lanes' layout): its lanes' bytes and lanes 0-6's lengths as
// LEB128 varints.
SPECKV_HD uint32_t payload_length(const uint32_t* lane_bytes) {
    uint32_t payload = 0;
    for (uint32_t l = 0; l < LANES; ++l) {
        payload += lane_bytes[l];
        if (l + 1 < LANES) {
            for (uint32_t v = lane_bytes[l]; v >= 0x80; v >>= 7) ++payload;
            ++payload;
        }
    }
    return payload;
}

// Step 3 (codec.rs: join_lanes): the payload, lanes 0-6's byte lengths as LEB128 varints, then
// every lane's bytes (little-endian words, the last one without its `skip` low bytes). Word
// `w` of lane `l` is written on its own (a thread a word on the GPU: a chunk's payload is
// hundreds of kilobytes), its place found from the lanes' lengths; word 0 of lane 0 also
// writes the lengths.
SPECKV_HD void join_word(const uint32_t* words, const uint32_t* lane_bytes, uint32_t l, uint32_t w, uint8_t* out) {
    uint64_t at = 0;
    for (uint32_t k = 0; k + 1 < LANES; ++k) {
        uint32_t v = lane_bytes[k];
        for (; v >= 0x80; v >>= 7) {
            if (l == 0 && w == 0) out[at] = (uint8_t)(v | 0x80);
            ++at;
        }
        if (l == 0 && w == 0) out[at] = (uint8_t)v;
        ++at;
    }
    const uint32_t bytes = lane_bytes[l], n = (bytes + 3) / 4, skip = 4 * n - bytes;
    if (w >= n) return;
    for (uint32_t k = 0; k < l; ++k) at += lane_bytes[k];
    at += 4ull * w;
    const uint32_t word = words[w];
    for (uint32_t b = (w + 1 == n ? skip : 0); b < 4; ++b) out[at++] = (uint8_t)(word >> (8 * b));
}

// The kernels' work per item (speckv_coder.cu runs them over a grid, host_shim.cpp over a
// loop): chunk c holds scalars [c * chunk, min((c + 1) * chunk, n)); its lanes' words go to
// lane_words + c * 8 * capacity, their byte lengths to lane_bytes[8c..8c+8].

SPECKV_HD void symbols_item(const ExactTables& t, const void* x, const float* mu, const int16_t* codes,
                            uint64_t* symbols, uint64_t i) {
    symbols[i] = exact_symbol(t, word_at(x, t.width, i), mu[i], codes[i]);
}

// Chunk c's scalars, patterns and (jointly coded streams) runs.
struct ChunkSpan {
    uint64_t start;
    uint32_t n;
    const void* x;
    const uint32_t* runs;
    SPECKV_HD_MEMBER ChunkSpan(const ExactTables& t, const void* x_all, uint64_t n_all, uint64_t chunk,
                               uint32_t layer_scalars, const uint32_t* runs_all, uint64_t c)
        : start(c * chunk),
          n((uint32_t)((c + 1) * chunk < n_all ? chunk : n_all - c * chunk)),
          x(t.width == 8 ? (const void*)((const uint8_t*)x_all + start)
                         : (const void*)((const uint16_t*)x_all + start)),
          runs(layer_scalars ? runs_all + start / layer_scalars : runs_all) {}
};

// Chunk c's escapes are positions[bounds[c]..bounds[c + 1]] (ascending positions in the
// round's scalars, the round's scalars 0-based as x and escapes are).
SPECKV_HD void escapes_item(const ExactTables& t, const void* x, const int64_t* positions, const int64_t* bounds,
                            uint64_t* escapes, uint64_t c) {
    escape_symbols(t, x, positions + bounds[c], (uint64_t)(bounds[c + 1] - bounds[c]), escapes);
}

// Item `item` is lane item % 8 of chunk item / 8; its words go to
// lane_words + item * capacity, its byte length to lane_bytes[item]. `layer_scalars` and
// `runs` (per layer of the stream): see code_lane; a jointly coded stream's chunks hold whole
// layers.
SPECKV_HD void lanes_item(const ExactTables& t, const void* x, const uint64_t* symbols, const uint64_t* escapes,
                          uint64_t n, uint64_t chunk, uint32_t* lane_words, uint32_t capacity, uint32_t* lane_bytes,
                          uint32_t layer_scalars, const uint32_t* runs, uint64_t item) {
    const ChunkSpan span(t, x, n, chunk, layer_scalars, runs, item / LANES);
    lane_bytes[item] = code_lane(t, span.x, symbols + span.start, escapes + span.start, span.n,
                                 (uint32_t)(item % LANES), lane_words + item * capacity, layer_scalars, span.runs);
}

SPECKV_HD void payload_item(const uint32_t* lane_bytes, uint32_t* payload_bytes, uint64_t c) {
    payload_bytes[c] = payload_length(lane_bytes + c * LANES);
}

SPECKV_HD uint64_t chunk_fingerprint(const float* mu, const int16_t* codes, uint64_t n,
                                     const uint64_t* sums = nullptr);

// A chunk's fingerprint (below) is XXH3 over 6 bytes a scalar; its full blocks' sums
// (xxh3::block_sums) come first, `per_chunk` slots a chunk (a whole chunk's
// xxh3::long_blocks; a shorter last chunk uses fewer). Item `i` is block i % per_chunk of chunk
// i / per_chunk, its 8 sums at sums + 8 * i.
SPECKV_HD uint64_t fingerprint_blocks(uint64_t chunk) { return xxh3::long_blocks(6 * chunk); }

SPECKV_HD void fingerprint_blocks_item(const float* mu, const int16_t* codes, uint64_t n, uint64_t chunk,
                                       uint64_t per_chunk, uint64_t* sums, uint64_t i) {
    const uint64_t c = i / per_chunk, b = i % per_chunk;
    const uint64_t start = c * chunk, len = (start + chunk < n ? start + chunk : n) - start;
    if (b >= fingerprint_blocks(len)) return;
    const xxh3::Input in{(const uint8_t*)(mu + start), 4 * len, (const uint8_t*)(codes + start), 6 * len};
    xxh3::block_sums(in, b, sums + 8 * i);
}

// Chunk c's fingerprint from its blocks' sums (fingerprint_blocks_item; none with per_chunk 0).
SPECKV_HD void fingerprints_item(const float* mu, const int16_t* codes, uint64_t n, uint64_t chunk,
                                 uint64_t per_chunk, const uint64_t* sums, uint64_t* out, uint64_t c) {
    const uint64_t start = c * chunk, stop = start + chunk < n ? start + chunk : n;
    out[c] = chunk_fingerprint(mu + start, codes + start, stop - start, per_chunk ? sums + 8 * c * per_chunk : nullptr);
}

// Item `i` is word i % capacity of lane (i / capacity) % 8 of chunk i / (8 * capacity);
// `offsets[c]`: where chunk c's payload starts in `out` (the prefix sum of payload_bytes).
SPECKV_HD void join_item(const uint32_t* lane_words, uint32_t capacity, const uint32_t* lane_bytes,
                         const uint64_t* offsets, uint8_t* out, uint64_t i) {
    const uint64_t lane = i / capacity, c = lane / LANES;
    join_word(lane_words + lane * capacity, lane_bytes + c * LANES, (uint32_t)(lane % LANES), (uint32_t)(i % capacity),
              out + offsets[c]);
}

// prediction.rs: codes_and_fingerprint, a chunk's fingerprint: XXH3 over its mu's bytes then
// its sigma codes' bytes (little-endian, as both are in memory on the host and the device).
SPECKV_HD uint64_t chunk_fingerprint(const float* mu, const int16_t* codes, uint64_t n, const uint64_t* sums) {
    return xxh3_64((const uint8_t*)mu, 4 * n, (const uint8_t*)codes, 2 * n, sums);
}

}  // namespace speckv
