// The CPU build of speckv_params.cuh and speckv_coder.cuh, for the tests: the very code the
// kernels run, looped over arrays behind a C ABI that ctypes can call. Build
// (tests/test_cuda_source.py does it):
//   c++ -O2 -std=c++17 -ffp-contract=off -shared -fPIC cuda/host_shim.cpp -o libspeckv_params.so
// -ffp-contract=off keeps the compiler from fusing a*b+c (the Rust core never does).
#include "speckv_coder.cuh"
#include "speckv_params.cuh"

#include <stddef.h>

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

void speckv_exact_symbols(const speckv::ExactTables* t, const void* x, const float* mu, const int16_t* codes,
                          uint64_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = speckv::exact_symbol(*t, speckv::word_at(x, t->width, i), mu[i], codes[i]);
}

// The four kernels of speckv_coder.cu one after another, as cuda.py's encode launches them:
// every chunk's payload back to back in `out` (its length per chunk in `payload_bytes`) and
// its fingerprint. Returns the bytes written, or 0 when `capacity` is too small.
size_t speckv_encode_chunks(const speckv::ExactTables* t, const void* x, const float* mu, const int16_t* codes,
                            size_t n, size_t chunk, uint8_t* out, size_t capacity, uint32_t* payload_bytes,
                            uint64_t* fingerprints) {
    const size_t chunks = (n + chunk - 1) / chunk;
    std::vector<uint64_t> symbols(n);
    speckv_exact_symbols(t, x, mu, codes, symbols.data(), n);
    const uint32_t lane = speckv::lane_capacity((uint32_t)((chunk + speckv::LANES - 1) / speckv::LANES));
    std::vector<uint32_t> words((size_t)speckv::LANES * lane), lane_bytes(speckv::LANES);
    size_t at = 0;
    for (size_t c = 0; c < chunks; ++c) {
        const size_t start = c * chunk, stop = start + chunk < n ? start + chunk : n;
        const void* xs = t->width == 8 ? (const void*)((const uint8_t*)x + start) : (const void*)((const uint16_t*)x + start);
        payload_bytes[c] = speckv::code_chunk(*t, xs, symbols.data() + start, (uint32_t)(stop - start), words.data(),
                                              lane, lane_bytes.data());
        if (at + payload_bytes[c] > capacity) return 0;
        speckv::join_lanes(words.data(), lane, lane_bytes.data(), out + at);
        at += payload_bytes[c];
        fingerprints[c] = speckv::chunk_fingerprint(mu + start, codes + start, stop - start);
    }
    return at;
}

}  // extern "C"
