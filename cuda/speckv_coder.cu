// Device kernels over speckv_coder.cuh: a predicted stream's chunks coded on the GPU. The
// host launches them in this order on one stream (python/speckv/cuda/coder.py: encode):
//   speckv_joint_params    jointly coded streams only (speckv_joint.cuh): one thread per
//                          (layer, token), each scalar's conditional mu and sigma code
//   speckv_exact_symbols   one thread per scalar: each scalar's symbol word
//   speckv_escapes         one thread per chunk: the escape model's intervals, in scalar order
//                          (the escapes' positions found between the launches)
//   speckv_code_lanes      one thread per chunk and lane (eight a chunk): the lane's coder
//   speckv_payload_lengths one thread per chunk: its payload's length
//   speckv_fingerprint_blocks one thread per 1 KiB block of a chunk's mu and sigma codes: the
//                          block's XXH3 sums (long chunks only)
//   speckv_fingerprints    one thread per chunk: XXH3 of the chunk's mu and sigma codes, its
//                          blocks' scrambles chained over their sums
//   speckv_join_lanes      one thread per lane word: the payload at its offset (a prefix sum
//                          of the payload lengths, computed between the launches)
// Nothing depends on scheduling: every output is written by exactly one thread. Each kernel's
// work per item is a function of speckv_coder.cuh, which host_shim.cpp runs on the CPU.
#include "speckv_coder.cuh"
#include "speckv_joint.cuh"

#define SPECKV_GRID_STRIDE(i, n)                                                             \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

extern "C" __global__ void speckv_joint_params(speckv::JointModel joint, const void* __restrict__ x,
                                               const float* __restrict__ mu, const int16_t* __restrict__ codes,
                                               float* __restrict__ mu_out, int16_t* __restrict__ codes_out,
                                               float* __restrict__ own, unsigned long long items) {
    SPECKV_GRID_STRIDE(i, items) { speckv::joint_item(joint, x, mu, codes, mu_out, codes_out, own, i); }
}

extern "C" __global__ void speckv_exact_symbols(speckv::ExactTables tables, const void* __restrict__ x,
                                                const float* __restrict__ mu, const int16_t* __restrict__ codes,
                                                uint64_t* __restrict__ symbols, unsigned long long n) {
    SPECKV_GRID_STRIDE(i, n) { speckv::symbols_item(tables, x, mu, codes, symbols, i); }
}

extern "C" __global__ void speckv_escapes(speckv::ExactTables tables, const void* __restrict__ x,
                                          const int64_t* __restrict__ positions, const int64_t* __restrict__ bounds,
                                          uint64_t* __restrict__ escapes, unsigned long long chunks) {
    SPECKV_GRID_STRIDE(c, chunks) { speckv::escapes_item(tables, x, positions, bounds, escapes, c); }
}

extern "C" __global__ void speckv_code_lanes(speckv::ExactTables tables, const void* __restrict__ x,
                                             const uint64_t* __restrict__ symbols,
                                             const uint64_t* __restrict__ escapes, unsigned long long n,
                                             unsigned long long chunk, uint32_t* __restrict__ lane_words,
                                             unsigned int capacity, uint32_t* __restrict__ lane_bytes,
                                             unsigned int layer_scalars, const uint32_t* __restrict__ runs,
                                             unsigned long long items) {
    SPECKV_GRID_STRIDE(i, items) {
        speckv::lanes_item(tables, x, symbols, escapes, n, chunk, lane_words, capacity, lane_bytes, layer_scalars,
                           runs, i);
    }
}

extern "C" __global__ void speckv_payload_lengths(const uint32_t* __restrict__ lane_bytes,
                                                  uint32_t* __restrict__ payload_bytes, unsigned long long chunks) {
    SPECKV_GRID_STRIDE(c, chunks) { speckv::payload_item(lane_bytes, payload_bytes, c); }
}

extern "C" __global__ void speckv_fingerprint_blocks(const float* __restrict__ mu,
                                                     const int16_t* __restrict__ codes, unsigned long long n,
                                                     unsigned long long chunk, unsigned long long per_chunk,
                                                     uint64_t* __restrict__ sums, unsigned long long items) {
    SPECKV_GRID_STRIDE(i, items) { speckv::fingerprint_blocks_item(mu, codes, n, chunk, per_chunk, sums, i); }
}

extern "C" __global__ void speckv_fingerprints(const float* __restrict__ mu, const int16_t* __restrict__ codes,
                                               unsigned long long n, unsigned long long chunk,
                                               unsigned long long per_chunk, const uint64_t* __restrict__ sums,
                                               uint64_t* __restrict__ out, unsigned long long chunks) {
    SPECKV_GRID_STRIDE(c, chunks) { speckv::fingerprints_item(mu, codes, n, chunk, per_chunk, sums, out, c); }
}

extern "C" __global__ void speckv_join_lanes(const uint32_t* __restrict__ lane_words, unsigned int capacity,
                                             const uint32_t* __restrict__ lane_bytes,
                                             const uint64_t* __restrict__ offsets,
                                             uint8_t* __restrict__ out, unsigned long long items) {
    SPECKV_GRID_STRIDE(i, items) { speckv::join_item(lane_words, capacity, lane_bytes, offsets, out, i); }
}
