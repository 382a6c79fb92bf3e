// kernels_for: the device seam's one factory, picking the backend of a device type, and
// acc_dtype. The backends themselves are internal to their files.
#include "kernels/backend.h"

namespace commtrace {

// Defined in cpu_backend.cpp and meta_backend.cpp; reached only through kernels_for().
const Kernels& cpu_backend();
const Kernels& meta_backend();

DType acc_dtype(DType dt) { return dt == DType::F64 ? DType::F64 : DType::F32; }

const Kernels& kernels_for(Device d) {
  switch (d) {
    case Device::CPU:
      return cpu_backend();
    case Device::Meta:
      return meta_backend();
    case Device::CUDA:
      throw Error(ErrorCode::Unsupported,
                  "cuda: this build has no CUDA kernels yet (the CUDA backend is a later issue)");
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("kernels_for: unknown device {}", int(d)));
}

bool has_kernels(Device d) { return d == Device::CPU || d == Device::Meta; }

}  // namespace commtrace
