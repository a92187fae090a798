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
#include "jit/find_tool.h"
#include "temp_dir.h"

namespace comfuse {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = COMFUSE_SOURCE_DIR;

// nvdisasm: COMFUSE_NVDISASM (an error if it names no file), else the pinned wheel in the test
// venv (python/requirements-ci.txt: nvidia-cuda-nvdisasm), else beside nvcc or on PATH (the JIT's
// lookup); empty where none is found.
fs::path find_nvdisasm() {
  if (const char* e = std::getenv("COMFUSE_NVDISASM")) {
    if (!fs::exists(e)) ADD_FAILURE() << "COMFUSE_NVDISASM names no file: " << e;
    return e;
  }
  std::error_code ec;
  for (const auto& lib : fs::directory_iterator(kRoot / "build/pyvenv/lib", ec)) {
    const fs::path p = lib.path() / "site-packages/nvidia/cu13/bin/nvdisasm";
    if (fs::exists(p)) return p;
  }
  return jit_detail::find_tool("nvdisasm");
}

// The SASS instructions of a cubin, one string each (nvdisasm -c: code only, "/*offset*/ INSTR ;"
// lines), the listing kept in `sass`; empty, with nvdisasm's output in `error`, where it fails.
std::vector<std::string> disassemble(const fs::path& tool, const std::vector<char>& cubin, const fs::path& sass,
                                     std::string& error) {
  const fs::path in = fs::path(sass).replace_extension(".cubin");
  std::ofstream(in, std::ios::binary).write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  const std::string cmd = fmt::format("'{}' -c '{}' > '{}' 2>&1", tool.string(), in.string(), sass.string());
  const int rc = std::system(cmd.c_str());
  std::ifstream f(sass);
  std::vector<std::string> ins;
  static const std::regex line(R"(^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;)");
  std::smatch m;
  std::string all;
  for (std::string l; std::getline(f, l);) {
    all += l + "\n";
    if (std::regex_search(l, m, line)) ins.push_back(m[1].str());
  }
  if (rc != 0 || ins.empty()) {
    error = fmt::format("{} (exit {}):\n{}", cmd, rc, all.substr(0, 2000));
    return {};
  }
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
  static const std::regex slow(R"(\b(S2R|S2UR|I2F\S*|F2I\S*)\s)");  // I2F also matches I2FP
  std::vector<int> lens;
  for (size_t w = 0; w + 1 < waits.size(); ++w) {
    const size_t a = waits[w], b = waits[w + 1];
    if (b - a >= 200) continue;  // not a k-block: a stretch of other code between two waits
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

class ProducerSass : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("comfuse-producer-sass"); }
  // The listings stay behind for a failure to be read.
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(ProducerSass, SteadyLoopReadsNoSpecialRegisterAndStaysShort) {
  const fs::path tool = find_nvdisasm();
  if (tool.empty())
    GTEST_SKIP() << "nvdisasm not found (COMFUSE_NVDISASM, build/pyvenv's nvidia-cuda-nvdisasm, beside nvcc, PATH)";
  struct Case {
    const char* example;
    int64_t m, n, k;
    int cluster_m;     // the plan this case stands for (checked: a planner change must not move it off)
    bool short_a_box;  // A's TMA box of fewer rows than the tile (decode)
    int max_median;    // instructions a k-block; 53-56 at two TMA loads, 73 at three (gated)
  };
  // 64x128 in clusters of 2 along M (B multicast: the rank a k-block was the regression), a
  // decode plan's short A box, 64x64 split-K tiles in clusters of 1, the gated decode GEMM (three
  // loads a k-block), and a 128x256 cooperative plan in clusters of 2.
  for (const Case& c : {Case{"gemm_softmax", 256, 4096, 4096, 2, false, 64},
                        Case{"gemm_layernorm", 8, 4096, 4096, 1, true, 64},
                        Case{"gemm_bias_gelu", 64, 1024, 3072, 1, false, 64},
                        Case{"gemm_swiglu", 1, 14336, 4096, 1, true, 80},
                        Case{"gemm_layernorm", 8192, 4096, 4096, 2, false, 64}}) {
    const std::string what = fmt::format("{}_{}x{}x{}", c.example, c.m, c.n, c.k);
    SCOPED_TRACE(what);
    const FusionSpec spec =
        lower(parse_graph_file((kRoot / "examples" / (std::string(c.example) + ".cf")).string())).regions.at(0).spec;
    CompileOptions opt;
    opt.jit.cache_dir = dir_ / "cache";
    opt.plan.gpu = Gpu::H100;
    opt.jit.compiler = CompilerKind::Nvrtc;
    opt.jit.nvcc_fallback = false;
    Plan plan;
    const CompiledKernel k = compile_only(spec, Problem{c.m, c.n, c.k, DType::BF16}, opt, nullptr, &plan);
    EXPECT_EQ(plan.kernel.cluster_m, c.cluster_m);
    EXPECT_EQ(plan.kernel.a_box_rows > 0, c.short_a_box);
    const fs::path sass = dir_ / (what + ".sass");
    std::string error;
    const std::vector<std::string> ins = disassemble(tool, k.cubin, sass, error);
    ASSERT_FALSE(ins.empty()) << error;
    const ProducerLoop loop = read_producer_loop(ins);
    ASSERT_GE(loop.spans, 2) << "no producer loop found in " << sass.string();
    EXPECT_LE(loop.median, c.max_median) << "instructions a k-block in the producer's steady loop: " << sass.string();
    // The k-loop is unrolled (4 copies and a remainder today); the spans that run into it from
    // its set-up or out past its exit read the shared window's base (SR_CgaCtaId), the k-blocks
    // inside it nothing of the kind. (Read by spans, the check depends on that unroll: a much
    // shorter one would leave few spans and fail here for the wrong reason; see the listing.)
    EXPECT_LT(2 * loop.slow_spans, loop.spans) << loop.slow_spans << " of " << loop.spans
                                               << " k-block spans read a special register or convert: "
                                               << fmt::format("{}", fmt::join(loop.slow, "; ")) << " ("
                                               << sass.string() << ")";
  }
}

}  // namespace
}  // namespace comfuse
