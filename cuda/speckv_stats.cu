// The calibration statistics kernel over speckv_stats.cuh (python/speckv/cuda/params.py:
// channel_sums): one thread per (channel, group of rows), exact sums added atomically. The
// sums must be zero before the launch.
#include "speckv_stats.cuh"

extern "C" __global__ void speckv_channel_sums(const float* __restrict__ t, const float* __restrict__ p,
                                               const float* __restrict__ p8, const float* __restrict__ q,
                                               double scale, unsigned long long batch, unsigned long long heads,
                                               unsigned long long tokens, unsigned long long dim,
                                               unsigned long long rows_per_item, uint64_t* __restrict__ sums,
                                               unsigned long long items) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < items;
         i += (unsigned long long)gridDim.x * blockDim.x)
        speckv::channel_sums_item(t, p, p8, q, scale, batch, heads, tokens, dim, rows_per_item, sums, i);
}
