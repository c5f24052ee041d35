// Device kernels over speckv_params.cuh: one thread per scalar, grid-stride loops, no
// reductions (so nothing depends on scheduling). Each writes exactly what the Rust coder
// reads; only these integer arrays need to cross to the host.
#include "speckv_params.cuh"

extern "C" __global__ void speckv_sigma_codes(const float* __restrict__ sigma, int16_t* __restrict__ out,
                                              unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = speckv::sigma_code(sigma[i]);
}

// mu [rows, dim] against one head's per-channel s and r ([dim] each)
extern "C" __global__ void speckv_relative_sigma_codes(const float* __restrict__ mu, const float* __restrict__ s,
                                                       const float* __restrict__ r, int16_t* __restrict__ out,
                                                       unsigned long long rows, unsigned long long dim) {
    const unsigned long long n = rows * dim;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = speckv::relative_sigma_code(mu[i], s[i % dim], r[i % dim]);
}

// A cache (as float32: bf16 and fp16 convert exactly) as the fp8 mode stores it: the target
// words the coder reads.
extern "C" __global__ void speckv_fp8_quantize(const float* __restrict__ x, float scale, uint8_t* __restrict__ out,
                                               unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = speckv::fp8_quantize(x[i], scale);
}

// A prediction (float32) as the coder's mu: for fp8 divided by the scale, then times the
// channel's gain (`gain` [channels]; scalar i is in channel i % channels).
extern "C" __global__ void speckv_coding_mu(const float* __restrict__ pred, float fp8_scale, int fp8,
                                            const float* __restrict__ gain, unsigned long long channels,
                                            float* __restrict__ out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = speckv::coding_mu(pred[i], fp8_scale, fp8 != 0, gain[i % channels]);
}
