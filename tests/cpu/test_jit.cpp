// jit layer on a machine without a GPU: NVRTC and nvcc both produce cubins without a
// device, so compiling, caching, corruption recovery and process races are all testable.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <functional>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "comfuse/jit.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace comfuse;

namespace {

const char* kTrivial = R"(
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

// A CuTe wgmma (64x64x16 bf16 -> f32, both operands from swizzled SMEM). Checks that NVRTC
// digests the CuTe/CUTLASS headers for sm_90a. With CHECK defined, a printf sits after the
// wgmma: an extern call that makes ptxas serialize the pipeline (C7510), as an assert would
// without -DNDEBUG (a source-level #undef NDEBUG does not bring assert back under NVRTC).
const char* kCute = R"(
#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
using namespace cute;
extern "C" __global__ void __launch_bounds__(128) wgmma_probe(cutlass::bfloat16_t const* a,
                                                             cutlass::bfloat16_t const* b, float* out) {
  using T = cutlass::bfloat16_t;
  __shared__ alignas(1024) T sA[64 * 64];
  __shared__ alignas(1024) T sB[64 * 64];
  for (int i = threadIdx.x; i < 64 * 64; i += 128) { sA[i] = a[i]; sB[i] = b[i]; }
  __syncthreads();
  auto layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, make_shape(Int<64>{}, Int<64>{}));
  auto mma = make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{});
  auto thr = mma.get_thread_slice(threadIdx.x);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(make_tensor(make_smem_ptr(sA), layout)));
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(make_tensor(make_smem_ptr(sB), layout)));
  Tensor acc = partition_fragment_C(mma, Shape<Int<64>, Int<64>>{});
  clear(acc);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  gemm(mma, tCrA, tCrB, acc);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
#ifdef CHECK
  if (acc(0) != acc(0)) printf("nan\\n");
#endif
  Tensor gC = make_tensor(make_gmem_ptr(out), make_layout(make_shape(Int<64>{}, Int<64>{}), LayoutRight{}));
  Tensor tCgC = thr.partition_C(gC);
  for (int i = 0; i < size(acc); ++i) tCgC(i) = acc(i);
}
)";

KernelSource trivial(std::string name = "axpy") { return {name, kTrivial, "axpy", {}}; }

class Jit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("comfuse-test-jit");
    opt_.cache_dir = dir_ / "cache";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Finished entries: the 32-hex-digit directories directly under the cache root.
  std::vector<fs::path> entries() const {
    std::vector<fs::path> out;
    if (!fs::exists(opt_.cache_dir)) return out;
    for (const auto& e : fs::directory_iterator(opt_.cache_dir))
      if (e.is_directory() && std::regex_match(e.path().filename().string(), std::regex("[0-9a-f]{32}")))
        out.push_back(e.path());
    return out;
  }
  size_t tmp_leftovers() const {
    fs::path t = opt_.cache_dir / "tmp";
    return fs::exists(t) ? std::distance(fs::directory_iterator(t), fs::directory_iterator()) : 0;
  }

  fs::path dir_;
  JitOptions opt_;
};

void expect_valid(const CompiledKernel& k, const std::string& entry) {
  EXPECT_TRUE(is_cubin_elf(k.cubin));
  ASSERT_GE(k.cubin.size(), 4u);
  EXPECT_EQ(std::string(k.cubin.data(), 4), "\x7f" "ELF");
  auto syms = cubin_symbols(k.cubin);
  EXPECT_NE(std::find(syms.begin(), syms.end(), entry), syms.end()) << "entry " << entry << " missing";
  EXPECT_EQ(k.key.size(), 32u);
}

TEST_F(Jit, NvrtcCompilesTrivialKernel) {
  opt_.compiler = CompilerKind::Nvrtc;
  CompiledKernel k = jit_compile(trivial(), opt_);
  expect_valid(k, "axpy");
  EXPECT_FALSE(k.cache_hit);
  EXPECT_FALSE(k.wgmma_serialized);
  EXPECT_EQ(k.compiler.rfind("nvrtc-", 0), 0u) << k.compiler;
  std::cout << "[ timing ] NVRTC trivial kernel: " << k.compile_seconds << " s\n";
}

TEST_F(Jit, NvccCompilesTrivialKernel) {
  opt_.compiler = CompilerKind::Nvcc;
  CompiledKernel k = jit_compile(trivial(), opt_);
  expect_valid(k, "axpy");
  EXPECT_EQ(k.compiler.rfind("nvcc-", 0), 0u) << k.compiler;
  std::cout << "[ timing ] nvcc trivial kernel: " << k.compile_seconds << " s\n";
}

// ptxas's report reaches CompiledKernel, from both compilers and through the cache: no stack for
// axpy; a stack frame (no spill) for a per-thread array indexed at run time, which lives in local
// memory.
TEST_F(Jit, PtxasUsageReported) {
  const char* kLocal = R"(
extern "C" __global__ void local_array(const float* x, float* y) {
  float a[64];
  for (int i = 0; i < 64; ++i) a[i] = x[i * blockDim.x + threadIdx.x];
  for (int i = 0; i < 64; ++i) a[(i * 5 + threadIdx.x) % 64] += x[i];  // stores at run-time indices
  y[threadIdx.x] = a[threadIdx.x % 64] + a[(threadIdx.x * 7) % 64];
}
)";
  for (CompilerKind kind : {CompilerKind::Nvrtc, CompilerKind::Nvcc}) {
    opt_.compiler = kind;
    CompiledKernel k = jit_compile(trivial(), opt_);
    EXPECT_EQ(k.stack_bytes, 0) << k.log;
    EXPECT_EQ(k.spill_bytes, 0) << k.log;
    CompiledKernel l = jit_compile({"local_array", kLocal, "local_array", {}}, opt_);
    EXPECT_GE(l.stack_bytes, 256) << l.log;  // 64 floats
    EXPECT_EQ(l.spill_bytes, 0) << l.log;
    CompiledKernel hit = jit_compile({"local_array", kLocal, "local_array", {}}, opt_);
    EXPECT_TRUE(hit.cache_hit);
    EXPECT_EQ(hit.stack_bytes, l.stack_bytes);
    EXPECT_EQ(hit.spill_bytes, l.spill_bytes);
  }
}

// What an NVRTC compile of the trivial kernel with `opt` throws ("(compiled)" if nothing).
std::string nvrtc_error(JitOptions opt) {
  opt.compiler = CompilerKind::Nvrtc;
  try {
    jit_compile(trivial(), opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "(compiled)";
}

// A cache root this process cannot write: the error names it and where it came from.
TEST_F(Jit, UnwritableCacheDirIsNamed) {
  opt_.cache_dir = "/etc/hostname/comfuse-cache";  // under a regular file: never creatable
  const std::string what = nvrtc_error(opt_);
  EXPECT_NE(what.find("the JIT cache directory '/etc/hostname/comfuse-cache' (from JitOptions::cache_dir) is not "
                      "writable"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("Not a directory"), std::string::npos) << what;
}

// A kernels directory that does not exist: named before any compiler reports a missing include.
TEST_F(Jit, MissingKernelHeadersAreNamed) {
  opt_.kernels_dir = dir_ / "no-kernels-here";
  const std::string what = nvrtc_error(opt_);
  EXPECT_NE(what.find(fmt::format("the kernel headers' directory '{}' (from JitOptions::kernels_dir) does not exist",
                                  opt_.kernels_dir.string())),
            std::string::npos)
      << what;
}

TEST_F(Jit, MangledEntryIsFound) {
  KernelSource s{"tmpl", "template <int N> __global__ void scale(float* p) { p[threadIdx.x] *= N; }\n"
                         "template __global__ void scale<3>(float*);\n",
                 "_Z5scaleILi3EEvPf", {}};
  expect_valid(jit_compile(s, opt_), "_Z5scaleILi3EEvPf");
}

TEST_F(Jit, WrongEntryNameIsAnError) {
  KernelSource s = trivial();
  s.entry = "axpy_typo";
  try {
    jit_compile(s, opt_);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("axpy_typo"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("axpy"), std::string::npos);  // lists the real ones
  }
}

TEST_F(Jit, SecondCompileIsACacheHit) {
  CompiledKernel a = jit_compile(trivial(), opt_);
  CompiledKernel b = jit_compile(trivial(), opt_);
  EXPECT_FALSE(a.cache_hit);
  EXPECT_TRUE(b.cache_hit);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.cubin, b.cubin);
  EXPECT_EQ(b.compile_seconds, a.compile_seconds);  // meta remembers the original build
  EXPECT_LT(b.elapsed_seconds * 10, a.elapsed_seconds) << "hit " << b.elapsed_seconds << " s";
  ASSERT_EQ(entries().size(), 1u);
  EXPECT_TRUE(fs::exists(entries()[0] / "kernel.cu"));
  EXPECT_TRUE(fs::exists(entries()[0] / "meta.json"));
  EXPECT_EQ(tmp_leftovers(), 0u);
  std::cout << "[ timing ] miss " << a.elapsed_seconds << " s, hit " << b.elapsed_seconds * 1e3 << " ms\n";
}

TEST_F(Jit, KeyCoversEveryInput) {
  std::string base = jit_cache_key(trivial(), opt_);
  EXPECT_EQ(base, jit_cache_key(trivial(), opt_));  // deterministic
  KernelSource s = trivial();
  s.source += "// one more comment\n";
  EXPECT_NE(base, jit_cache_key(s, opt_));
  s = trivial();
  s.flags = {"-DTILE=128"};
  EXPECT_NE(base, jit_cache_key(s, opt_));
  EXPECT_NE(base, jit_cache_key(trivial("other_name"), opt_));
  JitOptions o = opt_;
  o.fast_math = true;
  EXPECT_NE(base, jit_cache_key(trivial(), o));
  o = opt_;
  o.arch = "sm_90";
  EXPECT_NE(base, jit_cache_key(trivial(), o));
  o = opt_;
  o.compiler = CompilerKind::Nvcc;
  JitOptions o2 = opt_;
  o2.compiler = CompilerKind::Nvrtc;
  EXPECT_NE(jit_cache_key(trivial(), o), jit_cache_key(trivial(), o2));
  o = opt_;
  o.cache_dir = dir_ / "elsewhere";  // where the cache lives is not an input
  EXPECT_EQ(base, jit_cache_key(trivial(), o));
}

TEST_F(Jit, EditingAnIncludedProjectHeaderChangesTheKey) {
  fs::path k = dir_ / "kernels";
  fs::create_directories(k / "comfuse" / "epilogue");
  std::ofstream(k / "comfuse" / "epilogue" / "a.h") << "#pragma once\n#include \"b.h\"\n#include <cute/tensor.hpp>\n";
  std::ofstream(k / "comfuse" / "epilogue" / "b.h") << "#pragma once\n#define SCALE 2.0f\n";
  std::ofstream(k / "comfuse" / "unused.h") << "#pragma once\n";
  opt_.kernels_dir = k;
  KernelSource s{"hdr", "#include <comfuse/epilogue/a.h>\n"
                        "extern \"C\" __global__ void f(float* p) { p[0] *= SCALE; }\n", "f", {}};
  auto headers = project_headers(s.source, k);
  ASSERT_EQ(headers.size(), 2u);  // a.h and b.h; not unused.h, not CuTe
  EXPECT_EQ(headers[0].first, "comfuse/epilogue/a.h");
  EXPECT_EQ(headers[1].first, "comfuse/epilogue/b.h");
  std::string before = jit_cache_key(s, opt_);
  std::ofstream(k / "comfuse" / "unused.h") << "#pragma once\nint x;\n";
  EXPECT_EQ(before, jit_cache_key(s, opt_)) << "a header the kernel does not include changed the key";
  std::ofstream(k / "comfuse" / "epilogue" / "b.h") << "#pragma once\n#define SCALE 3.0f\n";
  EXPECT_NE(before, jit_cache_key(s, opt_));
  opt_.compiler = CompilerKind::Nvrtc;  // the kernels dir is really on the include path
  expect_valid(jit_compile(s, opt_), "f");
}

// ---- NVRTC precompiled header (JitOptions::pch) ----------------------------------------
// Kernels that share their #include block, as generated kernels do (a comment header, then
// the kernel header): a small project header keeps the PCH at a few MB.
KernelSource pch_kernel(const std::string& name, const std::string& header, int scale) {
  return {name,
          fmt::format("// kernel {}\n#include <comfuse/{}>\n\n"
                      "extern \"C\" __global__ void {}(float* p) {{ p[threadIdx.x] = Scale<{}>::apply(p[threadIdx.x]); }}\n",
                      name, header, name, scale),
          name, {}};
}

class JitPch : public Jit {
 protected:
  void SetUp() override {
    Jit::SetUp();
    fs::path k = dir_ / "kernels";
    fs::create_directories(k / "comfuse");
    for (const char* h : {"scale.cuh", "scale2.cuh", "scale3.cuh"})
      std::ofstream(k / "comfuse" / h)
          << "#pragma once\ntemplate <int N> struct Scale { static __device__ float apply(float x) { return x * N; } };\n";
    opt_.kernels_dir = k;
    opt_.compiler = CompilerKind::Nvrtc;
    opt_.nvcc_fallback = false;
    opt_.pch = true;
  }
  // The same kernel without a PCH and without the cache: the reference cubin.
  std::vector<char> plain_cubin(const KernelSource& s) const {
    JitOptions o = opt_;
    o.pch = false;
    o.use_cache = false;
    return jit_compile(s, o).cubin;
  }
  std::vector<fs::path> pch_files() const {
    std::vector<fs::path> out;
    if (fs::exists(opt_.cache_dir / "pch"))
      for (const auto& e : fs::recursive_directory_iterator(opt_.cache_dir / "pch"))
        if (e.path().extension() == ".pch") out.push_back(e.path());
    return out;
  }
};

TEST_F(JitPch, SecondKernelWithTheSameIncludesUsesTheFirstOnesPch) {
  const JitPchStats before = jit_pch_stats();
  CompiledKernel a = jit_compile(pch_kernel("ka", "scale.cuh", 2), opt_);
  EXPECT_TRUE(a.pch_used) << a.log;
  EXPECT_EQ(jit_pch_stats().created, before.created + 1);
  ASSERT_EQ(pch_files().size(), 1u) << "the PCH lives under <cache>/pch/<this process>/";
  EXPECT_NE(pch_files()[0].parent_path().filename().string().find(std::to_string(getpid()) + "."), std::string::npos);

  KernelSource sb = pch_kernel("kb", "scale.cuh", 3);
  CompiledKernel b = jit_compile(sb, opt_);
  EXPECT_TRUE(b.pch_used) << b.log;
  EXPECT_FALSE(b.cache_hit);
  const JitPchStats after = jit_pch_stats();
  EXPECT_EQ(after.created, before.created + 1) << "the second kernel made a PCH of its own";
  EXPECT_EQ(after.used, before.used + 2);
  EXPECT_EQ(after.failed, before.failed);
  EXPECT_EQ(pch_files().size(), 1u);

  // Same cubin, same key, same log as without the PCH: a cache entry does not record it.
  EXPECT_EQ(b.cubin, plain_cubin(sb));
  JitOptions off = opt_;
  off.pch = false;
  EXPECT_EQ(b.key, jit_cache_key(sb, off));
  EXPECT_EQ(b.log.find("precompiled"), std::string::npos) << b.log;
  EXPECT_FALSE(jit_compile(sb, opt_).pch_used) << "a cache hit compiles nothing";

  // Other flags: another PCH (NVRTC refuses a PCH made with different options).
  KernelSource sc = pch_kernel("kc", "scale.cuh", 4);
  sc.flags = {"-DOTHER=1"};
  EXPECT_TRUE(jit_compile(sc, opt_).pch_used);
  EXPECT_EQ(jit_pch_stats().created, before.created + 2);
}

// A PCH that NVRTC cannot use costs a plain compile, never a failure, and is not tried again.
// Truncated, NVRTC stops with a catastrophic error (the compile is redone without it);
// overwritten with noise, NVRTC skips it (warning 626, silenced).
TEST_F(JitPch, UnusablePchFallsBackToAPlainCompile) {
  struct Damage {
    const char* header;
    std::function<void(const fs::path&)> apply;
  };
  const Damage damages[] = {
      {"scale2.cuh", [](const fs::path& p) { fs::resize_file(p, 4096); }},
      {"scale3.cuh",
       [](const fs::path& p) {
         std::ofstream out(p, std::ios::binary | std::ios::trunc);
         for (int i = 0; i < (1 << 20); ++i) out.put(static_cast<char>(i * 2654435761u >> 24));
       }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.header);
    ASSERT_TRUE(jit_compile(pch_kernel("first", d.header, 2), opt_).pch_used);
    std::vector<fs::path> files = pch_files();
    ASSERT_FALSE(files.empty());
    for (const fs::path& f : files) d.apply(f);

    const JitPchStats before = jit_pch_stats();
    KernelSource s = pch_kernel("second", d.header, 5);
    CompiledKernel k = jit_compile(s, opt_);
    EXPECT_FALSE(k.pch_used);
    EXPECT_EQ(k.cubin, plain_cubin(s));
    EXPECT_EQ(k.log.find("precompiled"), std::string::npos) << k.log;
    EXPECT_EQ(jit_pch_stats().failed, before.failed + 1);

    CompiledKernel again = jit_compile(pch_kernel("third", d.header, 6), opt_);
    EXPECT_FALSE(again.pch_used);
    EXPECT_EQ(jit_pch_stats().failed, before.failed + 1) << "the unusable PCH was tried again";
    EXPECT_EQ(jit_pch_stats().created, before.created) << "nor remade";
    for (const fs::path& f : files) fs::remove(f);
  }
}

// A source that does not start with directives has no PCH, and a source error stays an error
// (reported once, from the plain compile's log).
TEST_F(JitPch, NoIncludeBlockNoPch) {
  const JitPchStats before = jit_pch_stats();
  EXPECT_FALSE(jit_compile(trivial(), opt_).pch_used);
  KernelSource bad = pch_kernel("bad", "scale.cuh", 2);
  bad.source += "int broken = ;\n";
  EXPECT_THROW(jit_compile(bad, opt_), Error);
  EXPECT_EQ(jit_pch_stats().failed, before.failed);
}

void corrupt_and_rebuild(Jit& t, const JitOptions& opt, const std::function<void(const fs::path&)>& damage) {
  CompiledKernel a = jit_compile(trivial(), opt);
  damage(opt.cache_dir / a.key);
  CompiledKernel b = jit_compile(trivial(), opt);
  EXPECT_FALSE(b.cache_hit) << "a damaged entry was served";
  EXPECT_EQ(a.cubin, b.cubin);
  CompiledKernel c = jit_compile(trivial(), opt);
  EXPECT_TRUE(c.cache_hit) << "the rebuilt entry was not published";
}

TEST_F(Jit, FlippedCubinBytesAreRebuilt) {
  corrupt_and_rebuild(*this, opt_, [](const fs::path& e) {
    std::fstream f(e / "kernel.cubin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("\xde\xad\xbe\xef", 4);
  });
  EXPECT_EQ(entries().size(), 1u);
  EXPECT_EQ(tmp_leftovers(), 0u);
}

TEST_F(Jit, DeletedMetaIsRebuilt) {
  corrupt_and_rebuild(*this, opt_, [](const fs::path& e) { fs::remove(e / "meta.json"); });
}

TEST_F(Jit, UnparsableMetaIsRebuilt) {
  corrupt_and_rebuild(*this, opt_, [](const fs::path& e) { std::ofstream(e / "meta.json") << "{ not json"; });
}

TEST_F(Jit, TruncatedCubinIsRebuilt) {
  corrupt_and_rebuild(*this, opt_, [](const fs::path& e) { fs::resize_file(e / "kernel.cubin", 10); });
}

// Four processes compile the same kernel at the same moment into one cache: all succeed,
// all get the same cubin, and exactly one entry remains (the rename race has one winner).
TEST_F(Jit, ConcurrentProcessesLeaveOneEntry) {
  constexpr int kProcs = 4;
  int gate[2];
  ASSERT_EQ(pipe(gate), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(gate[1]);
      char c;
      while (read(gate[0], &c, 1) > 0) {
      }  // EOF once the parent closes its end: everyone starts together
      int rc = 0;
      try {
        CompiledKernel k = jit_compile(trivial(), opt_);
        std::ofstream(dir_ / ("child" + std::to_string(i))) << k.key << " " << k.cubin.size() << " " << k.cache_hit;
        rc = is_cubin_elf(k.cubin) ? 0 : 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
        rc = 1;
      }
      _exit(rc);
    }
    kids.push_back(pid);
  }
  close(gate[0]);
  close(gate[1]);
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  std::set<std::string> keys;
  int hits = 0;
  for (int i = 0; i < kProcs; ++i) {
    std::ifstream in(dir_ / ("child" + std::to_string(i)));
    std::string key;
    size_t size = 0;
    int hit = 0;
    ASSERT_TRUE(in >> key >> size >> hit);
    keys.insert(key);
    hits += hit;
  }
  EXPECT_EQ(keys.size(), 1u);
  EXPECT_EQ(entries().size(), 1u);
  EXPECT_EQ(tmp_leftovers(), 0u);
  EXPECT_TRUE(jit_compile(trivial(), opt_).cache_hit);
  std::cout << "[ race ] " << hits << " of " << kProcs << " children hit the cache\n";
}

TEST_F(Jit, StaleBuildDirsAreSwept) {
  fs::path old_dir = opt_.cache_dir / "tmp" / "deadbeef.123.abc.0", fresh = opt_.cache_dir / "tmp" / "live.1";
  fs::create_directories(old_dir);
  fs::create_directories(fresh);
  std::ofstream(old_dir / "kernel.cubin") << "half written";
  fs::last_write_time(old_dir, fs::file_time_type::clock::now() - std::chrono::hours(2));
  jit_compile(trivial(), opt_);
  EXPECT_FALSE(fs::exists(old_dir));
  EXPECT_TRUE(fs::exists(fresh)) << "a build dir that may still be in use was removed";
}

TEST(JitEnv, DefaultCacheDirFollowsEnvironment) {
  auto save = [](const char* n) { return std::getenv(n) ? std::optional<std::string>(std::getenv(n)) : std::nullopt; };
  auto restore = [](const char* n, const std::optional<std::string>& v) {
    if (v) setenv(n, v->c_str(), 1); else unsetenv(n);
  };
  auto cache = save("COMFUSE_CACHE_DIR"), xdg = save("XDG_CACHE_HOME");
  setenv("COMFUSE_CACHE_DIR", "/tmp/x-comfuse", 1);
  EXPECT_EQ(default_cache_dir(), fs::path("/tmp/x-comfuse"));
  unsetenv("COMFUSE_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(default_cache_dir(), fs::path("/tmp/xdg/comfuse"));
  unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(default_cache_dir(), fs::path(home) / ".cache" / "comfuse");
  }
  restore("COMFUSE_CACHE_DIR", cache);
  restore("XDG_CACHE_HOME", xdg);
}

void expect_syntax_error(JitOptions opt, CompilerKind kind) {
  opt.compiler = kind;
  opt.nvcc_fallback = false;
  KernelSource s{"broken", "extern \"C\" __global__ void k(float* p) { p[0] = undeclared_thing + ; }\n", "k", {}};
  try {
    jit_compile(s, opt);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("undeclared_thing"), std::string::npos) << msg;  // the compiler's own words
    EXPECT_NE(msg.find("error"), std::string::npos) << msg;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(msg, m, std::regex(R"(source kept at (\S+\.cu))"))) << msg;
    EXPECT_TRUE(fs::exists(m[1].str()));
    fs::remove(m[1].str());
    fs::remove(fs::path(m[1].str()).replace_extension(".log"));
  }
}

TEST_F(Jit, SyntaxErrorNvrtc) { expect_syntax_error(opt_, CompilerKind::Nvrtc); }
TEST_F(Jit, SyntaxErrorNvcc) { expect_syntax_error(opt_, CompilerKind::Nvcc); }

// NVRTC has no C++ standard library headers; nvcc does. Such a kernel still compiles.
TEST_F(Jit, NvrtcFailureFallsBackToNvcc) {
  opt_.compiler = CompilerKind::Nvrtc;
  KernelSource s{"needs_host_headers",
                 "#include <cassert>\nextern \"C\" __global__ void k(int* p) { p[0] = 1; }\n", "k", {}};
  CompiledKernel k = jit_compile(s, opt_);
  EXPECT_EQ(k.compiler.rfind("nvcc-", 0), 0u) << k.compiler;
  expect_valid(k, "k");
}

TEST_F(Jit, DumpWritesSourcePtxAndCubin) {
  opt_.dump_dir = dir_ / "dump";
  for (CompilerKind kind : {CompilerKind::Nvrtc, CompilerKind::Nvcc}) {
    opt_.compiler = kind;
    CompiledKernel k = jit_compile(trivial(), opt_);
    fs::path d = opt_.dump_dir / ("axpy-" + k.key.substr(0, 12));
    EXPECT_TRUE(fs::exists(d / "kernel.cu"));
    EXPECT_TRUE(fs::exists(d / "kernel.cubin"));
    EXPECT_TRUE(fs::exists(d / "kernel.sass"));  // or a note that cuobjdump is missing
    std::ifstream ptx(d / "kernel.ptx");
    std::string text((std::istreambuf_iterator<char>(ptx)), {});
    EXPECT_NE(text.find(".entry axpy"), std::string::npos) << k.compiler;
  }
}

// CuTe's sm_90a wgmma through both compilers: the flags and include paths are right, no
// wgmma serialization under -DNDEBUG; timings printed for the design notes.
TEST_F(Jit, CuteWgmmaCompilesWithBothCompilers) {
  opt_.use_cache = false;
  for (CompilerKind kind : {CompilerKind::Nvrtc, CompilerKind::Nvcc}) {
    opt_.compiler = kind;
    opt_.nvcc_fallback = false;
    CompiledKernel k = jit_compile({"cute_wgmma", kCute, "wgmma_probe", {}}, opt_);
    expect_valid(k, "wgmma_probe");
    EXPECT_FALSE(k.wgmma_serialized) << k.log;
    EXPECT_TRUE(k.entry_dir.empty());
    std::cout << "[ timing ] " << k.compiler << " CuTe wgmma kernel: " << k.compile_seconds << " s, cubin "
              << k.cubin.size() << " bytes\n";
  }
}

TEST_F(Jit, WgmmaSerializationIsReported) {
  opt_.compiler = CompilerKind::Nvrtc;
  opt_.nvcc_fallback = false;
  CompiledKernel k = jit_compile({"cute_serialized", kCute, "wgmma_probe", {"-DCHECK"}}, opt_);
  EXPECT_TRUE(k.wgmma_serialized) << k.log;
  EXPECT_NE(k.log.find("C7510"), std::string::npos);
  EXPECT_TRUE(jit_compile({"cute_serialized", kCute, "wgmma_probe", {"-DCHECK"}}, opt_).wgmma_serialized)
      << "a cache hit must still report it";
}

}  // namespace
