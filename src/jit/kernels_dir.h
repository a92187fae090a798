#pragma once
// Where the JIT finds the kernel headers (kernels/comfuse/...): JitOptions::kernels_dir, else
// $COMFUSE_KERNELS_DIR (a relocated install), else the build's own kernels/. The compilers'
// include path and the cache key's header hashes both read it; a directory that does not exist
// is refused here, by name, before a compiler reports a missing include.
#include <filesystem>

#include "comfuse/jit.h"

namespace comfuse::jit_detail {

std::filesystem::path kernels_dir_of(const JitOptions& opt);

}  // namespace comfuse::jit_detail
