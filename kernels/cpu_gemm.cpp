// CPU GEMM: C = alpha * op(A) @ op(B) + beta * C on row-major buffers through OpenBLAS cblas.
// Zero-sized products never reach cblas: k == 0 leaves C = beta * C, m or n == 0 does nothing.
#include <cblas.h>

#include <limits>

#include "kernels/cpu.h"

namespace commtrace::cpu {
namespace {

blasint to_blas(i64 v, const char* what) {
  COMMTRACE_CHECK(v >= 0 && v <= std::numeric_limits<blasint>::max(), ErrorCode::Unsupported,
                  "gemm: {} = {} is out of range [0, {}] of the BLAS integer", what, v,
                  std::numeric_limits<blasint>::max());
  return static_cast<blasint>(v);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, float alpha,
               const float* a, blasint lda, const float* b, blasint ldb, float beta, float* c,
               blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
               double alpha, const double* a, blasint lda, const double* b, blasint ldb,
               double beta, double* c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda, const T* b,
          i64 ldb, T beta, T* c, i64 ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS semantics: beta == 0 does not read C.
    for (i64 i = 0; i < m; ++i) {
      for (i64 j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
            to_blas(m, "m"), to_blas(n, "n"), to_blas(k, "k"), alpha, a, to_blas(lda, "lda"), b,
            to_blas(ldb, "ldb"), beta, c, to_blas(ldc, "ldc"));
}

template void gemm<float>(bool, bool, i64, i64, i64, float, const float*, i64, const float*, i64,
                          float, float*, i64);
template void gemm<double>(bool, bool, i64, i64, i64, double, const double*, i64, const double*,
                           i64, double, double*, i64);

}  // namespace commtrace::cpu
