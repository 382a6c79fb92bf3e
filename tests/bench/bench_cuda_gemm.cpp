// bench_cuda_gemm: the op layer's GEMM on cuda tensors (commtrace::gemm: dispatch, a fresh output
// from the caching allocator, the CUDA backend's cuBLAS call) against cublasGemmEx called
// directly on the same shapes and dtype, each timed over the same number of calls with one
// synchronize at the end. Prints TFLOP/s of both and their ratio per shape; exits 77 without a
// CUDA device (nothing measured, nothing faked).
// Usage: bench_cuda_gemm [ITERS]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/backend.h"
#include "parallel/tensor/ops.h"
#include "parallel/tensor/tensor.h"

using namespace commtrace;

namespace {

struct GemmShape {
  std::int64_t m, n, k;  // (m, k) @ (k, n)
  DType dt;
};

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::Backend, std::string(what) + ": " + cudaGetErrorString(e));
}
void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorCode::Backend, std::string(what) + ": cuBLAS status " + std::to_string(s));
  }
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds per call of the op layer's gemm(a, b) (zeros: no denormals or overflow timed).
double op_layer(const GemmShape& s, int iters) {
  const Tensor a = Tensor::zeros({s.m, s.k}, s.dt, Device::CUDA);
  const Tensor b = Tensor::zeros({s.k, s.n}, s.dt, Device::CUDA);
  const Kernels& k = kernels_for(Device::CUDA);
  for (int i = 0; i < 3; ++i) (void)gemm(a, b);
  k.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) (void)gemm(a, b);
  k.synchronize();
  return seconds(t0) / iters;
}

// Seconds per call of cublasGemmEx on its own handle and stream: row-major C = A @ B computed as
// column-major Cᵀ = Bᵀ Aᵀ, f32 accumulation (TF32 off).
double direct(const GemmShape& s, int iters) {
  const cudaDataType_t ty = s.dt == DType::BF16  ? CUDA_R_16BF
                            : s.dt == DType::F64 ? CUDA_R_64F
                                                 : CUDA_R_32F;
  const cublasComputeType_t compute = s.dt == DType::F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const std::size_t es = dtype_size(s.dt);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check_cuda(cudaMalloc(&a, std::size_t(s.m * s.k) * es), "cudaMalloc");
  check_cuda(cudaMalloc(&b, std::size_t(s.k * s.n) * es), "cudaMalloc");
  check_cuda(cudaMalloc(&c, std::size_t(s.m * s.n) * es), "cudaMalloc");
  check_cuda(cudaMemset(a, 0, std::size_t(s.m * s.k) * es), "cudaMemset");
  check_cuda(cudaMemset(b, 0, std::size_t(s.k * s.n) * es), "cudaMemset");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasHandle_t h = nullptr;
  check_blas(cublasCreate(&h), "cublasCreate");
  check_blas(cublasSetStream(h, stream), "cublasSetStream");
  const float alpha_f = 1, beta_f = 0;
  const double alpha_d = 1, beta_d = 0;
  const void* alpha = s.dt == DType::F64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = s.dt == DType::F64 ? static_cast<const void*>(&beta_d) : &beta_f;
  auto call = [&] {
    check_blas(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), alpha, b, ty,
                            int(s.n), a, ty, int(s.k), beta, c, ty, int(s.n), compute,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  };
  for (int i = 0; i < 3; ++i) call();
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const double per = seconds(t0) / iters;
  cublasDestroy(h);
  cudaStreamDestroy(stream);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return per;
}

}  // namespace

int main(int argc, char** argv) {
  if (!has_kernels(Device::CUDA)) {
    std::printf("bench_cuda_gemm: skipped: %s\n", kernels_unavailable_reason(Device::CUDA).c_str());
    return 77;
  }
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  if (iters < 1) {
    std::fprintf(stderr, "bench_cuda_gemm: ITERS must be >= 1\n");
    return 2;
  }
  // The shapes: a large square-ish bf16 GEMM and the TP shapes of a dim-4096 layer split
  // 8 ways (a column-parallel and a row-parallel projection of 2048 tokens).
  const GemmShape shapes[] = {
      {8192, 4096, 4096, DType::BF16},
      {2048, 512, 4096, DType::BF16},
      {2048, 4096, 512, DType::BF16},
      {8192, 4096, 4096, DType::F32},
  };
  try {
    std::printf("%-22s %-5s %12s %12s %8s\n", "m x n x k", "dtype", "op TFLOP/s", "cuBLAS TFLOP/s",
                "op/cuBLAS");
    for (const GemmShape& s : shapes) {
      const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
      const double op = op_layer(s, iters), cb = direct(s, iters);
      const std::string dims =
          std::to_string(s.m) + " x " + std::to_string(s.n) + " x " + std::to_string(s.k);
      std::printf("%-22s %-5s %12.1f %12.1f %8.3f\n", dims.c_str(), dtype_name(s.dt),
                  flops / op / 1e12, flops / cb / 1e12, cb / op);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_cuda_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
