#pragma once
// A CUDA tool (cuobjdump, nvdisasm, ...): beside the nvcc the build found, else on PATH; an empty
// path where neither has it. The JIT's dump and the SASS tests look tools up the same way.
#include <filesystem>

namespace comfuse::jit_detail {

std::filesystem::path find_tool(const char* name);

}  // namespace comfuse::jit_detail
