// The CPU build of speckv_params.cuh, for the tests: the very arithmetic the kernels run,
// looped over arrays behind a C ABI that ctypes can call. Build (tests/test_cuda_source.py
// does it):
//   c++ -O2 -std=c++17 -ffp-contract=off -shared -fPIC cuda/host_shim.cpp -o libspeckv_params.so
// -ffp-contract=off keeps the compiler from fusing a*b+c (the Rust core never does).
#include "speckv_params.cuh"

#include <stddef.h>

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

}  // extern "C"
