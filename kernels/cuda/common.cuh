// Device helpers shared by the kernel files: launch shapes, block reductions in double, bf16 bits
// (the same rounding as kernels/base.h, so both devices store the same bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/math.h"

namespace commtrace::cuda {

inline constexpr int kThreads = 256;

// Grid of a grid-stride loop over n elements (at least 1 block, at most 4096).
inline unsigned grid_for(i64 n) {
  const i64 blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks);
}

// One block per row: rows up to 2^31 - 1 in x.
inline unsigned grid_rows(i64 rows) { return unsigned(rows < 1 ? 1 : rows); }

#define COMMTRACE_GRID_STRIDE(i, n)                                 \
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += i64(gridDim.x) * blockDim.x)

// Sum of v over the block (kThreads threads); every thread gets the result.
__device__ inline double block_sum(double v) {
  __shared__ double part[32];
  __shared__ double total;
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // part/total may still be read from a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? part[lane] : 0.0;
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// Max of v over the block; every thread gets the result.
__device__ inline double block_max(double v) {
  __shared__ double part[32];
  __shared__ double total;
  for (int o = 16; o > 0; o /= 2) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? part[lane] : -INFINITY;
    for (int o = 16; o > 0; o /= 2) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// A bf16 element in a kernel's buffers (its bits; arithmetic goes through float).
struct Bf16 {
  std::uint16_t bits;
};

__host__ __device__ inline float bf16_bits_to_float(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

__host__ __device__ inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return std::uint16_t((u >> 16) | 0x40u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

}  // namespace commtrace::cuda
