// Cold JIT compile times of kernel sources in one process: the cost of each compile after the
// first, with and without the NVRTC precompiled header (JitOptions::pch), sequentially or from
// several threads (as the Python frontend's precompile does). Each run uses a fresh cache
// directory, so every compile is a miss. Sources: kernel.cu files that COMFUSE_JIT_DUMP wrote.
//   jit_bench [--pch] [--threads T] [--flag F]... [--keep-cubins DIR] NAME=FILE.cu ...
// --flag adds a compiler flag to every kernel (e.g. --split-compile=2); COMFUSE_KERNELS_DIR
// compiles them against another kernels/ tree.
// NAME is the kernel's name (its dump folder's prefix, e.g. region0_acc): NVRTC derives
// internal symbol names from it, so the same name gives the cubin the CLI builds.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <atomic>
#include <vector>

#include "comfuse/jit.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  comfuse::JitOptions opt;
  opt.compiler = comfuse::CompilerKind::Nvrtc;
  opt.nvcc_fallback = false;
  opt.pch = false;
  int threads = 1;
  fs::path keep;
  std::vector<std::string> extra;
  std::vector<comfuse::KernelSource> srcs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pch") opt.pch = true;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--keep-cubins" && i + 1 < argc) keep = argv[++i];
    else if (a == "--flag" && i + 1 < argc) extra.push_back(argv[++i]);
    else if (size_t eq = a.find('='); eq != std::string::npos) {
      std::ifstream in(a.substr(eq + 1));
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in) return std::fprintf(stderr, "cannot read %s\n", a.substr(eq + 1).c_str()), 2;
      srcs.push_back({a.substr(0, eq), ss.str(), "", {}});
    } else {
      return std::fprintf(stderr, "usage: jit_bench [--pch] [--threads T] [--flag F]... [--keep-cubins DIR] NAME=FILE.cu ...\n"), 2;
    }
  }
  for (comfuse::KernelSource& s : srcs) s.flags = extra;
  char tmpl[] = "/tmp/comfuse-jit-bench-XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  opt.cache_dir = tmpl;
  std::vector<comfuse::CompiledKernel> out(srcs.size());
  std::vector<double> start(srcs.size());
  auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<std::thread> pool;
  std::atomic<size_t> next{0};
  for (int t = 0; t < std::max(threads, 1); ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < srcs.size();) {
        start[i] = since();
        out[i] = comfuse::jit_compile(srcs[i], opt);
      }
    });
  for (auto& t : pool) t.join();
  double total = since();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  for (size_t i = 0; i < srcs.size(); ++i) {
    std::printf("%-16s start %6.2f s  compile %6.2f s  pch %s  cubin %zu bytes\n", srcs[i].name.c_str(), start[i],
                out[i].compile_seconds, out[i].pch_used ? "used" : "-", out[i].cubin.size());
    if (!keep.empty()) {
      fs::create_directories(keep);
      std::ofstream(keep / (std::to_string(i) + "-" + srcs[i].name + ".cubin"), std::ios::binary)
          .write(out[i].cubin.data(), static_cast<std::streamsize>(out[i].cubin.size()));
    }
  }
  comfuse::JitPchStats st = comfuse::jit_pch_stats();
  std::printf("total %.2f s wall, %.2f s user, %.2f s sys; PCH made %d (%.2f s), used %d, failed %d\n", total,
              ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6,
              st.created, st.create_seconds, st.used, st.failed);
  fs::remove_all(tmpl);
}
