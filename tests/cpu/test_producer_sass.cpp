// The mainloop's producer in SASS: one thread issues every k-block's TMA loads, and at 64-row
// tiles its instructions a k-block pace the tensor cores (a 64x128x64 k-block is ~256 cycles at
// peak). A special-register read and a float division a k-block made M = 256 LayerNorm and
// softmax 10-16% slower (bench/NOTES.md Stop 58), which only a GPU could see. This test
// disassembles planner kernels (NVRTC, no GPU) and reads the producer's steady loop: the
// instructions between two of its ring-slot waits that issue a TMA load.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "comfuse/jit.h"
#include "comfuse/lower.h"
#include "comfuse/runtime.h"
#include "comfuse/text.h"

namespace comfuse {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = COMFUSE_SOURCE_DIR;

// nvdisasm: COMFUSE_NVDISASM, else on PATH, else the pinned wheel in the test venv
// (python/requirements-ci.txt: nvidia-cuda-nvdisasm); empty where none is found.
fs::path find_nvdisasm() {
  if (const char* e = std::getenv("COMFUSE_NVDISASM"); e && fs::exists(e)) return e;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty() && fs::exists(fs::path(d) / "nvdisasm")) return fs::path(d) / "nvdisasm";
  }
  std::error_code ec;
  for (const auto& lib : fs::directory_iterator(kRoot / "build/pyvenv/lib", ec)) {
    const fs::path p = lib.path() / "site-packages/nvidia/cu13/bin/nvdisasm";
    if (fs::exists(p)) return p;
  }
  return {};
}

// The SASS instructions of a cubin, one string each (nvdisasm's "/*offset*/ INSTR ;" lines).
std::vector<std::string> disassemble(const fs::path& tool, const std::vector<char>& cubin, const fs::path& dir) {
  const fs::path in = dir / "kernel.cubin", out = dir / "kernel.sass";
  std::ofstream(in, std::ios::binary).write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  const std::string cmd = fmt::format("'{}' '{}' > '{}' 2>&1", tool.string(), in.string(), out.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<std::string> ins;
  static const std::regex line(R"(^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;)");
  std::ifstream f(out);
  std::smatch m;
  for (std::string l; std::getline(f, l);)
    if (std::regex_search(l, m, line)) ins.push_back(m[1].str());
  return ins;
}

struct ProducerLoop {
  int spans = 0, median = 0;
  int slow_spans = 0;             // spans with a special-register read or a conversion
  std::vector<std::string> slow;  // those instructions
};

// After the producer warp group gives its registers back (USETMAXREG.DEALLOC): the spans between
// consecutive ring-slot waits (SYNCS.PHASECHK.TRANS64.TRYWAIT) that issue a TMA load (UTMALDG).
ProducerLoop read_producer_loop(const std::vector<std::string>& ins) {
  ProducerLoop r;
  size_t start = 0;
  while (start < ins.size() && ins[start].find("USETMAXREG.DEALLOC") == std::string::npos) ++start;
  std::vector<size_t> waits;
  for (size_t i = start; i < ins.size(); ++i)
    if (ins[i].find("SYNCS.PHASECHK.TRANS64.TRYWAIT") != std::string::npos) waits.push_back(i);
  static const std::regex slow(R"(\b(S2R|S2UR|I2F\S*|F2I\S*|I2FP\S*)\s)");
  std::vector<int> lens;
  for (size_t w = 0; w + 1 < waits.size(); ++w) {
    const size_t a = waits[w], b = waits[w + 1];
    if (b - a >= 200) continue;  // not a k-block: the loop's exit, the epilogue's slots
    const auto tma = [](const std::string& s) { return s.find("UTMALDG") != std::string::npos; };
    if (std::none_of(ins.begin() + a, ins.begin() + b, tma)) continue;
    lens.push_back(static_cast<int>(b - a));
    bool any = false;
    for (size_t i = a; i < b; ++i)
      if (std::regex_search(ins[i], slow)) r.slow.push_back(ins[i]), any = true;
    r.slow_spans += any;
  }
  r.spans = static_cast<int>(lens.size());
  if (!lens.empty()) {
    std::sort(lens.begin(), lens.end());
    r.median = lens[lens.size() / 2];
  }
  return r;
}

TEST(ProducerSass, SteadyLoopReadsNoSpecialRegisterAndStaysShort) {
  const fs::path tool = find_nvdisasm();
  if (tool.empty()) GTEST_SKIP() << "nvdisasm not found (COMFUSE_NVDISASM, PATH, or build/pyvenv's nvidia-cuda-nvdisasm)";
  const fs::path dir = fs::temp_directory_path() / ("comfuse-producer-sass-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Case {
    const char* example;
    int64_t m, n, k;
    int max_median;  // instructions a k-block; 53-56 at two TMA loads, 73 at three (gated)
  };
  // 64x128 in clusters of 2 along M (B multicast: the rank a k-block was the regression), a
  // decode plan's short A box, 64x64 split-K tiles in clusters of 1, the gated decode GEMM (three
  // loads a k-block), and a 128x256 cooperative plan.
  for (const Case& c : {Case{"gemm_softmax", 256, 4096, 4096, 64}, Case{"gemm_layernorm", 8, 4096, 4096, 64},
                        Case{"gemm_bias_gelu", 64, 1024, 3072, 64}, Case{"gemm_swiglu", 1, 14336, 4096, 80},
                        Case{"gemm_layernorm", 8192, 4096, 4096, 64}}) {
    const std::string what = fmt::format("{} {}x{}x{}", c.example, c.m, c.n, c.k);
    SCOPED_TRACE(what);
    const FusionSpec spec =
        lower(parse_graph_file((kRoot / "examples" / (std::string(c.example) + ".cf")).string())).regions.at(0).spec;
    CompileOptions opt;
    opt.jit.cache_dir = dir / "cache";
    opt.plan.gpu = Gpu::H100;
    opt.jit.compiler = CompilerKind::Nvrtc;
    opt.jit.nvcc_fallback = false;
    const CompiledKernel k = compile_only(spec, Problem{c.m, c.n, c.k, DType::BF16}, opt);
    const ProducerLoop loop = read_producer_loop(disassemble(tool, k.cubin, dir));
    ASSERT_GE(loop.spans, 2) << "no producer loop found in the SASS (" << (dir / "kernel.sass").string() << ")";
    EXPECT_LE(loop.median, c.max_median) << "instructions a k-block in the producer's steady loop";
    // A job's first and last k-blocks may read the shared window's base (SR_CgaCtaId); the
    // steady ones, most of the unrolled spans, read nothing of the kind.
    EXPECT_LT(2 * loop.slow_spans, loop.spans) << loop.slow_spans << " of " << loop.spans
                                               << " k-block spans read a special register or convert: "
                                               << fmt::format("{}", fmt::join(loop.slow, "; "));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace comfuse
