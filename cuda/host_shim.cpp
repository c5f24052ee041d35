// The CPU build of speckv_params.cuh and speckv_coder.cuh, for the tests: the very code the
// kernels run, looped over arrays behind a C ABI that ctypes can call. Build
// (tests/cuda/test_cuda_source.py does it):
//   c++ -O2 -std=c++17 -ffp-contract=off -shared -fPIC -pthread cuda/host_shim.cpp -o libspeckv_params.so
// -ffp-contract=off keeps the compiler from fusing a*b+c (the Rust core never does).
#include "speckv_coder.cuh"
#include "speckv_joint.cuh"
#include "speckv_params.cuh"
#include "speckv_stats.cuh"

#include <stddef.h>

#include <thread>
#include <vector>


extern "C" {

void speckv_sigma_codes(const float* sigma, int16_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = speckv::sigma_code(sigma[i]);
}

// mu [rows, dim] against per-channel s and r of one head ([dim] each)
void speckv_relative_sigma_codes(const float* mu, const float* s, const float* r, int16_t* out, size_t rows,
                                 size_t dim) {
    for (size_t row = 0; row < rows; ++row)
        for (size_t d = 0; d < dim; ++d)
            out[row * dim + d] = speckv::relative_sigma_code(mu[row * dim + d], s[d], r[d]);
}

void speckv_fp8_quantize(const float* x, float scale, uint8_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = speckv::fp8_quantize(x[i], scale);
}

void speckv_coding_mu(const float* pred, float fp8_scale, int fp8, const float* gain, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = speckv::coding_mu(pred[i], fp8_scale, fp8 != 0, gain[i]);
}

uint64_t speckv_xxh3(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
    return speckv::xxh3_64(a, na, b, nb);
}

// The kernels of speckv_coder.cu with the same parameters, each running its items in a loop
// instead of a grid: python/speckv/cuda.py's encode drives them in the tests exactly as it
// drives the GPU (tests/conftest.py: a CUDA driver stand-in whose cuLaunchKernel calls these).
// The kernels of speckv_params.cu with the same parameters (items in a loop).
void host_speckv_sigma_codes(const float* sigma, int16_t* out, unsigned long long n) {
    for (unsigned long long i = 0; i < n; ++i) out[i] = speckv::sigma_code(sigma[i]);
}

void host_speckv_relative_sigma_codes(const float* mu, const float* s, const float* r, int16_t* out,
                                      unsigned long long rows, unsigned long long dim) {
    for (unsigned long long i = 0; i < rows * dim; ++i) out[i] = speckv::relative_sigma_code(mu[i], s[i % dim], r[i % dim]);
}

void host_speckv_fp8_quantize(const float* x, float scale, uint8_t* out, unsigned long long n) {
    for (unsigned long long i = 0; i < n; ++i) out[i] = speckv::fp8_quantize(x[i], scale);
}

void host_speckv_coding_mu(const float* pred, float fp8_scale, int fp8, const float* gain, unsigned long long channels,
                           float* out, unsigned long long n) {
    for (unsigned long long i = 0; i < n; ++i) out[i] = speckv::coding_mu(pred[i], fp8_scale, fp8 != 0, gain[i % channels]);
}

void host_speckv_joint_params(speckv::JointModel j, const void* x, const float* mu, const int16_t* codes,
                              float* mu_out, int16_t* codes_out, float* own, unsigned long long items) {
    for (unsigned long long i = 0; i < items; ++i) speckv::joint_item(j, x, mu, codes, mu_out, codes_out, own, i);
}

void host_speckv_exact_symbols(speckv::ExactTables t, const void* x, const float* mu, const int16_t* codes,
                               uint64_t* symbols, unsigned long long n) {
    for (unsigned long long i = 0; i < n; ++i) speckv::symbols_item(t, x, mu, codes, symbols, i);
}

void host_speckv_escapes(speckv::ExactTables t, const void* x, const int64_t* positions, const int64_t* bounds,
                         uint64_t* escapes, unsigned long long chunks) {
    for (unsigned long long c = 0; c < chunks; ++c) speckv::escapes_item(t, x, positions, bounds, escapes, c);
}

void host_speckv_code_lanes(speckv::ExactTables t, const void* x, const uint64_t* symbols, const uint64_t* escapes,
                            unsigned long long n, unsigned long long chunk, uint32_t* lane_words,
                            unsigned int capacity, uint32_t* lane_bytes, unsigned int layer_scalars,
                            const uint32_t* runs, unsigned long long items) {
    for (unsigned long long i = 0; i < items; ++i)
        speckv::lanes_item(t, x, symbols, escapes, n, chunk, lane_words, capacity, lane_bytes, layer_scalars, runs, i);
}

void host_speckv_payload_lengths(const uint32_t* lane_bytes, uint32_t* payload_bytes, unsigned long long chunks) {
    for (unsigned long long c = 0; c < chunks; ++c) speckv::payload_item(lane_bytes, payload_bytes, c);
}

void host_speckv_fingerprint_blocks(const float* mu, const int16_t* codes, unsigned long long n,
                                    unsigned long long chunk, unsigned long long per_chunk, uint64_t* sums,
                                    unsigned long long items) {
    for (unsigned long long i = 0; i < items; ++i)
        speckv::fingerprint_blocks_item(mu, codes, n, chunk, per_chunk, sums, i);
}

void host_speckv_fingerprints(const float* mu, const int16_t* codes, unsigned long long n, unsigned long long chunk,
                              unsigned long long per_chunk, const uint64_t* sums, uint64_t* out,
                              unsigned long long chunks) {
    for (unsigned long long c = 0; c < chunks; ++c)
        speckv::fingerprints_item(mu, codes, n, chunk, per_chunk, sums, out, c);
}

void host_speckv_join_lanes(const uint32_t* lane_words, unsigned int capacity, const uint32_t* lane_bytes,
                            const uint64_t* offsets, uint8_t* out, unsigned long long items) {
    for (unsigned long long i = 0; i < items; ++i) speckv::join_item(lane_words, capacity, lane_bytes, offsets, out, i);
}

// The kernel of speckv_stats.cu with the same parameters.
void host_speckv_channel_sums(const float* t, const float* p, const float* p8, const float* q, double scale,
                              unsigned long long batch, unsigned long long heads, unsigned long long tokens,
                              unsigned long long dim, unsigned long long rows_per_item, uint64_t* sums,
                              unsigned long long items) {
    for (unsigned long long i = 0; i < items; ++i)
        speckv::channel_sums_item(t, p, p8, q, scale, batch, heads, tokens, dim, rows_per_item, sums, i);
}

// The same kernel's items spread over `threads` host threads as a grid spreads them (item i on
// thread i % threads), all adding to one set of sums: exercises the atomic carries.
void host_speckv_channel_sums_threaded(const float* t, const float* p, const float* p8, const float* q, double scale,
                                       unsigned long long batch, unsigned long long heads, unsigned long long tokens,
                                       unsigned long long dim, unsigned long long rows_per_item, uint64_t* sums,
                                       unsigned long long items, int threads) {
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w)
        pool.emplace_back([=] {
            for (unsigned long long i = (unsigned long long)w; i < items; i += (unsigned long long)threads)
                speckv::channel_sums_item(t, p, p8, q, scale, batch, heads, tokens, dim, rows_per_item, sums, i);
        });
    for (auto& worker : pool) worker.join();
}

}  // extern "C"
