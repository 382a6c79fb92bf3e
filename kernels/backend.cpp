// kernels_for: the device seam's one factory, picking the backend of a device type, and
// acc_dtype. The backends themselves are internal to their files.
#include "kernels/backend.h"

#include <dlfcn.h>

#include <utility>

namespace commtrace {

// Defined in cpu_backend.cpp and meta_backend.cpp; reached only through kernels_for().
const Kernels& cpu_backend();
const Kernels& meta_backend();
#if COMMTRACE_WITH_CUDA
const Kernels& cuda_backend();  // cuda_backend.cpp; throws Unsupported without a device
std::string cuda_unavailable_reason();
#endif

DType acc_dtype(DType dt) { return dt == DType::F64 ? DType::F64 : DType::F32; }

void Kernels::set_current_ordinal(int ordinal) const {
  COMMTRACE_CHECK(ordinal == 0, ErrorCode::InvalidArgument,
                  "{}:{}: this device type has one device, {}:0", device_name(device()), ordinal,
                  device_name(device()));
}

const Kernels& kernels_for(Device d) {
  switch (d) {
    case Device::CPU:
      return cpu_backend();
    case Device::Meta:
      return meta_backend();
    case Device::CUDA:
#if COMMTRACE_WITH_CUDA
      return cuda_backend();
#else
      throw Error(ErrorCode::Unsupported,
                  "cuda: this build has no CUDA backend (configure with nvcc present and "
                  "-DCOMMTRACE_WITH_CUDA=ON)");
#endif
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("kernels_for: unknown device {}", int(d)));
}

bool has_kernels(Device d) {
#if COMMTRACE_WITH_CUDA
  if (d == Device::CUDA) return cuda_unavailable_reason().empty();
#endif
  return d == Device::CPU || d == Device::Meta;
}

std::string kernels_unavailable_reason(Device d) {
  if (has_kernels(d)) return "";
#if COMMTRACE_WITH_CUDA
  return cuda_unavailable_reason();
#else
  return "this build has no CUDA backend";
#endif
}

LoadedLibrary::LoadedLibrary(std::initializer_list<const char*> paths, std::string who,
                             std::string name, std::string_view hint)
    : who_(std::move(who)), name_(std::move(name)) {
  std::string tried;
  for (const char* path : paths) {
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle_) return;
    tried += fmt::format("{}{}", tried.empty() ? "" : "; ", dlerror());
  }
  throw Error(ErrorCode::Unsupported,
              fmt::format("{}: cannot load {} ({}); {}", who_, name_, tried, hint));
}

void* LoadedLibrary::raw_symbol(const char* s) const {
  void* f = dlsym(handle_, s);
  COMMTRACE_CHECK(f != nullptr, ErrorCode::Unsupported, "{}: the {} library has no {}", who_, name_,
                  s);
  return f;
}

}  // namespace commtrace
