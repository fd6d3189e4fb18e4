#include "kernels/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <string>

namespace mt::kernels::gpu {
namespace {

// Its soname for the toolkit meshtrain was built with (found on the loader's path, as a linked library would be),
// then the file CMake found at build time (MESHTRAIN_CUBLASLT_PATH), for a toolkit outside that path.
void* open_library(std::string& tried) {
  const std::string names[] = {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR),
#ifdef MESHTRAIN_CUBLASLT_PATH
                               MESHTRAIN_CUBLASLT_PATH
#endif
  };
  for (const std::string& name : names) {
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    tried += fmt::format("\n  {}: {}", name, dlerror());
  }
  return nullptr;
}

CublasLt load() {
  std::string tried;
  void* lib = open_library(tried);  // never closed: the handles it creates live until the process ends
  CHECK(lib, "the CUDA backend's matmuls need cuBLASLt, which could not be opened (install the CUDA toolkit's "
             "cuBLAS, or put its folder on LD_LIBRARY_PATH):{}", tried);
  CublasLt f;
#define MT_CUBLASLT_RESOLVE(name)                                                                    \
  f.name = reinterpret_cast<decltype(f.name)>(dlsym(lib, #name));                                    \
  CHECK(f.name, "cuBLASLt lacks {} (a library older than the toolkit meshtrain was built with?)", #name);
  MT_CUBLASLT_FUNCTIONS(MT_CUBLASLT_RESOLVE)
#undef MT_CUBLASLT_RESOLVE
  return f;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt functions = load();
  return functions;
}

}  // namespace mt::kernels::gpu
