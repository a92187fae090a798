// The two compilers behind jit_compile: NVRTC in process (default: no process spawn, no
// nvcc needed at run time) and nvcc as a subprocess (fallback, and the reference toolchain).
// Both produce an sm_90a cubin plus the full log, ptxas diagnostics included.
#include <fcntl.h>
#include <nvrtc.h>
#include <xxhash.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "comfuse/jit.h"
#include "field_hash.h"
#include "kernels_dir.h"

namespace fs = std::filesystem;

namespace comfuse {
namespace {

// Split a path list ("a:b", as CMakeLists.txt joins the CUDA include directories) into its items.
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ':');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : dflt;
}

// -I paths every kernel gets: CUTLASS/CuTe, then CCCL, then the toolkit. NVRTC has no
// implicit include path, and CuTe under __CUDACC_RTC__ takes <cuda/std/...> from CCCL,
// which CUDA 13 keeps in include/cccl: without that path NVRTC stops at cute/config.hpp.
std::vector<std::string> toolkit_include_dirs() {
  // Build-time paths, overridable for a relocated install (e.g. the tree copied to a GPU host).
  std::vector<std::string> dirs = {env_or("COMFUSE_CUTLASS_INCLUDE", COMFUSE_CUTLASS_INCLUDE)};
  std::vector<std::string> cuda = split_list(env_or("COMFUSE_CUDA_INCLUDE", COMFUSE_CUDA_INCLUDE));
  for (const std::string& d : cuda)
    if (fs::exists(fs::path(d) / "cccl" / "cuda" / "std")) dirs.push_back(d + "/cccl");
  for (const std::string& d : cuda) dirs.push_back(d);
  return dirs;
}

// Flags both compilers share, in key order. -DNDEBUG is not optional: CUTLASS's device
// asserts are extern calls inside the wgmma pipeline and make ptxas serialize every wgmma.
// C++20: the kernel takes its KernelConfig (kernels/comfuse/config.cuh) as a class-type
// template argument, written with designated initializers.
// --ptxas-options=-v: ptxas reports each function's stack frame and spills in the log
// (CompiledKernel::stack_bytes, spill_bytes: a kernel that overran its registers is slow).
std::vector<std::string> common_flags(const KernelSource& src, const JitOptions& opt) {
  std::vector<std::string> f = {"-std=c++20", "-DNDEBUG", "--ptxas-options=-v"};
  if (opt.fast_math) f.push_back("--use_fast_math");
  f.push_back("-I" + jit_detail::kernels_dir_of(opt).string());
  for (const std::string& d : toolkit_include_dirs()) f.push_back("-I" + d);
  f.insert(f.end(), src.flags.begin(), src.flags.end());
  return f;
}

// What ptxas said about the code it made, from the log: C7510 and C7520 = "wgmma.mma_async
// instructions are serialized" (C7520: because of a warpgroup arrive it had to insert in a
// divergent path), correct but slow code; and -v's "N bytes stack frame, S bytes spill stores,
// L bytes spill loads" (the largest frame and all spills, over the functions it lists).
void read_ptxas_report(CompileOutput& out) {
  out.wgmma_serialized = out.log.find("C7510") != std::string::npos || out.log.find("C7520") != std::string::npos;
  static const std::regex usage(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  for (std::sregex_iterator it(out.log.begin(), out.log.end(), usage), end; it != end; ++it) {
    out.stack_bytes = std::max(out.stack_bytes, std::stoi((*it)[1].str()));
    out.spill_bytes = std::max(out.spill_bytes, 0) + std::stoi((*it)[2].str()) + std::stoi((*it)[3].str());
  }
}


struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr interleaved
};

// fork/exec with an argv (no shell: paths with spaces or quotes stay intact), stdout+stderr
// into a pipe, cwd set in the child. Between fork and exec only async-signal-safe calls.
ProcessResult run_process(const std::vector<std::string>& argv, const fs::path& cwd) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::string cwd_s = cwd.string();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("jit: pipe() failed");
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    throw Error("jit: fork() failed");
  }
  if (pid == 0) {
    dup2(fds[1], 1);  // dup2 clears O_CLOEXEC on the new descriptors
    dup2(fds[1], 2);
    if (!cwd_s.empty() && chdir(cwd_s.c_str()) != 0) _exit(126);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  ProcessResult r;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (r.exit_code == 127) r.output += fmt::format("\n(could not execute {})", argv[0]);
  return r;
}

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_text(const fs::path& p, std::string_view text) {
  std::ofstream out(p, std::ios::binary);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) throw Error(fmt::format("jit: cannot write {}", p.string()));
}

// ---------------------------------------------------------------------------------------
// One nvrtcCompileProgram: the program (for its outputs), the status and the log.
struct NvrtcRun {
  std::unique_ptr<_nvrtcProgram, void (*)(_nvrtcProgram*)> prog{nullptr, [](_nvrtcProgram* p) { nvrtcDestroyProgram(&p); }};
  nvrtcResult rc = NVRTC_ERROR_INTERNAL_ERROR;
  std::string log;
};

NvrtcRun run_nvrtc(const std::string& source, const std::string& file_name, const std::vector<std::string>& flags) {
  NvrtcRun r;
  nvrtcProgram prog = nullptr;
  nvrtcResult rc = nvrtcCreateProgram(&prog, source.c_str(), file_name.c_str(), 0, nullptr, nullptr);
  if (rc != NVRTC_SUCCESS) throw Error(fmt::format("nvrtcCreateProgram: {}", nvrtcGetErrorString(rc)));
  r.prog.reset(prog);  // destroyed on every path out of here
  std::vector<const char*> argv;
  for (const std::string& f : flags) argv.push_back(f.c_str());
  r.rc = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  if (log_size > 1) {
    r.log.resize(log_size);
    nvrtcGetProgramLog(prog, r.log.data());
    r.log.resize(log_size - 1);  // drop the terminating NUL
  }
  return r;
}

// ---- precompiled headers (PchRequest in jit.h) ------------------------------------------
// Measured on the project's kernels (CUDA 13.0, 2 cores; bench/NOTES.md): the #include block
// takes ~1.1 s of a 2.5-3.2 s compile; its PCH is ~225 MB and takes ~2 s to make; a compile
// that uses it saves the parse but pays ~0.4-0.8 s of page faults mapping the PCH into
// NVRTC's heap (64 KB mmaps of the file), so it gains ~0.3-0.6 s per later kernel of the same
// #include block in the same process. Off by default for that reason (JitOptions::pch).

// PCH warnings, silenced on both sides (the flags of the compile that uses a PCH must equal
// those that made it): 626 invalid PCH, 629 options differ, 630 directives differ, 2226
// incomplete PCH, 20282 made by another process. A PCH counts as used only when NVRTC says
// "using precompiled header file".
const char* const kPchDiagSuppress = "-diag-suppress=626,629,630,2226,20282";
constexpr size_t kPchHeapBytes = size_t(1) << 30;  // address space only; the project's PCH needs ~300 MB

// The source's leading preprocessor directives, comment and blank lines skipped: what NVRTC
// puts in a PCH made from them. Empty when the source starts with code or a block comment.
std::string leading_directives(const std::string& source) {
  std::string out;
  std::istringstream in(source);
  bool continued = false;
  for (std::string line; std::getline(in, line);) {
    size_t b = line.find_first_not_of(" \t\r");
    std::string_view t = b == std::string::npos ? std::string_view() : std::string_view(line).substr(b);
    if (continued || (!t.empty() && t[0] == '#')) {
      out += line + "\n";
      continued = !line.empty() && line.back() == '\\';
    } else if (!(t.empty() || t.substr(0, 2) == "//")) {
      break;
    }
  }
  return out;
}

struct PchRegistry {
  enum class State { Building, Ready, Failed };
  struct Entry {
    State state = State::Building;
    fs::path file;
  };
  std::mutex mu;
  std::map<std::string, Entry> entries;  // by key
  bool heap_sized = false;
  JitPchStats stats;
};

PchRegistry& pch_registry() {
  static PchRegistry r;
  return r;
}

void pch_failed(const std::string& key) {
  PchRegistry& reg = pch_registry();
  std::lock_guard lock(reg.mu);
  reg.entries[key].state = PchRegistry::State::Failed;
  ++reg.stats.failed;
}

// NVRTC's log minus its "using precompiled header file" line: a kernel's log (kept in its
// cache entry) reads the same with and without a PCH.
std::string strip_pch_message(std::string log, bool* used) {
  size_t at = log.find("\": using precompiled header file \"");
  *used = at != std::string::npos;
  if (!*used) return log;
  size_t begin = log.rfind('\n', at), end = log.find('\n', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  end = end == std::string::npos ? log.size() : end + 1;
  if (end < log.size() && log[end] == '\n') ++end;  // and the blank line after it
  return log.erase(begin, end - begin);
}

class NvrtcCompiler final : public Compiler {
 public:
  NvrtcCompiler() {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    identity_ = fmt::format("nvrtc-{}.{}", major, minor);
  }
  CompilerKind kind() const override { return CompilerKind::Nvrtc; }
  const std::string& identity() const override { return identity_; }

  std::vector<std::string> flags(const KernelSource& src, const JitOptions& opt) const override {
    // -default-device: CUTLASS has unannotated constexpr helpers that NVRTC would otherwise
    // reject as host functions. Side effect: namespace-scope constexpr variables get device
    // storage, so the cubin is larger than nvcc's (the kernel code is the same).
    std::vector<std::string> f = {"-arch=" + opt.arch, "-default-device"};
    std::vector<std::string> c = common_flags(src, opt);
    f.insert(f.end(), c.begin(), c.end());
    return f;
  }

  CompileOutput compile(const KernelSource& src, const std::vector<std::string>& flags, const fs::path& work_dir,
                        bool want_ptx, const PchRequest& pch) const override {
    auto t0 = std::chrono::steady_clock::now();
    std::string file_name = (src.name.empty() ? "kernel" : src.name) + ".cu";
    NvrtcRun run;
    bool pch_used = false;
    if (std::string key, file; !pch.dir.empty() && !(file = ready_pch(src, flags, pch, key)).empty()) {
      std::vector<std::string> f = flags;
      f.insert(f.end(), {kPchDiagSuppress, "--use-pch=" + file});
      run = run_nvrtc(src.source, file_name, f);
      run.log = strip_pch_message(run.log, &pch_used);
      if (run.rc != NVRTC_SUCCESS) {
        // A source error, or a PCH NVRTC cannot read (a truncated file stops the compile): the
        // plain compile tells which, and its log is the one to report.
        run = run_nvrtc(src.source, file_name, flags);
        if (run.rc == NVRTC_SUCCESS) {
          spdlog::debug("jit: the compile of '{}' failed with PCH {} and not without it; no PCH for its #include "
                        "block from now on", src.name, file);
          pch_failed(key);
        }
        pch_used = false;
      } else if (!pch_used) {  // NVRTC skipped the PCH and compiled without it
        spdlog::debug("jit: NVRTC did not use PCH {} for '{}'; no PCH for its #include block from now on", file,
                      src.name);
        pch_failed(key);
      } else {
        std::lock_guard lock(pch_registry().mu);
        ++pch_registry().stats.used;
      }
    } else {
      run = run_nvrtc(src.source, file_name, flags);
    }
    nvrtcProgram prog = run.prog.get();
    CompileOutput out;
    out.log = std::move(run.log);
    out.pch_used = pch_used;
    if (run.rc != NVRTC_SUCCESS)
      throw Error(fmt::format("{}\n{}", nvrtcGetErrorString(run.rc), out.log));
    size_t cubin_size = 0;
    if (nvrtcGetCUBINSize(prog, &cubin_size) != NVRTC_SUCCESS || cubin_size == 0)
      throw Error("NVRTC produced no cubin (is the arch a real sm_XX, not compute_XX?)\n" + out.log);
    out.cubin.resize(cubin_size);
    nvrtcGetCUBIN(prog, out.cubin.data());
    if (want_ptx) {
      size_t ptx_size = 0;
      if (nvrtcGetPTXSize(prog, &ptx_size) == NVRTC_SUCCESS && ptx_size > 1) {
        out.ptx.resize(ptx_size);
        nvrtcGetPTX(prog, out.ptx.data());
        out.ptx.resize(ptx_size - 1);
      }
    }
    read_ptxas_report(out);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

 private:
  // The PCH for src's #include block, made now if this is the first compile that needs it;
  // empty when there is none to use (no directives, being made by another thread, failed).
  // key: the registry's key, for pch_failed.
  std::string ready_pch(const KernelSource& src, const std::vector<std::string>& flags, const PchRequest& req,
                        std::string& key) const {
    const std::string prefix = leading_directives(src.source);
    if (prefix.empty()) return {};
    jit_detail::FieldHash hash;
    hash.field(identity_);
    for (const std::string& f : flags) hash.field(f);
    hash.field(prefix);
    hash.field(req.salt);
    key = hash.hex();

    PchRegistry& reg = pch_registry();
    {
      std::lock_guard lock(reg.mu);
      auto [it, inserted] = reg.entries.try_emplace(key);
      if (!inserted) return it->second.state == PchRegistry::State::Ready ? it->second.file.string() : std::string();
      if (!reg.heap_sized) {  // before the first PCH exists: resizing the heap invalidates PCHs
        size_t heap = 0;
        if (nvrtcGetPCHHeapSize(&heap) == NVRTC_SUCCESS && heap < kPchHeapBytes) nvrtcSetPCHHeapSize(kPchHeapBytes);
        reg.heap_sized = true;
      }
    }
    // This thread makes it; others compile without it meanwhile (waiting would cost them
    // more than the PCH saves).
    auto t0 = std::chrono::steady_clock::now();
    std::error_code ec;
    fs::create_directories(req.dir, ec);
    const fs::path file = req.dir / (key + ".pch");
    const fs::path tmp = req.dir / (key + ".tmp");  // one maker per key, one process per dir
    std::string why;
    try {
      std::vector<std::string> f = flags;
      f.insert(f.end(), {kPchDiagSuppress, "--create-pch=" + tmp.string()});
      NvrtcRun run = run_nvrtc(prefix, "comfuse_pch.cu", f);
      nvrtcResult status = nvrtcGetPCHCreateStatus(run.prog.get());
      if (run.rc != NVRTC_SUCCESS) {
        why = fmt::format("{}: {}", nvrtcGetErrorString(run.rc), run.log);
      } else if (status != NVRTC_SUCCESS) {
        size_t need = 0;
        nvrtcGetPCHHeapSizeRequired(run.prog.get(), &need);
        why = fmt::format("{} (heap needed {} MB)", nvrtcGetErrorString(status), need >> 20);
      } else if (!fs::is_regular_file(tmp, ec) || ::rename(tmp.c_str(), file.c_str()) != 0) {
        why = "no PCH file written";
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fs::remove(tmp, ec);
    std::lock_guard lock(reg.mu);
    reg.stats.create_seconds += secs;
    if (!why.empty()) {
      spdlog::debug("jit: no PCH for the #include block of '{}': {}", src.name, why);
      reg.entries[key].state = PchRegistry::State::Failed;
      ++reg.stats.failed;
      return {};
    }
    spdlog::debug("jit: made PCH {} ({} MB) for the #include block of '{}' in {:.2f} s", file.string(),
                  fs::file_size(file, ec) >> 20, src.name, secs);
    reg.entries[key] = {PchRegistry::State::Ready, file};
    ++reg.stats.created;
    return file.string();
  }

  std::string identity_;
};

// ---------------------------------------------------------------------------------------
class NvccCompiler final : public Compiler {
 public:
  NvccCompiler() : nvcc_(env_or("COMFUSE_NVCC", COMFUSE_NVCC)) {}
  CompilerKind kind() const override { return CompilerKind::Nvcc; }

  // Asked lazily: a process that never falls back to nvcc never spawns `nvcc --version`.
  const std::string& identity() const override {
    std::call_once(once_, [this] {
      if (!fs::exists(nvcc_)) throw Error(fmt::format("jit: nvcc not found at '{}' (set COMFUSE_NVCC)", nvcc_));
      ProcessResult r = run_process({nvcc_, "--version"}, {});
      std::smatch m;
      if (r.exit_code != 0 || !std::regex_search(r.output, m, std::regex(R"(V(\d+\.\d+\.\d+))")))
        throw Error(fmt::format("jit: '{} --version' failed:\n{}", nvcc_, r.output));
      identity_ = "nvcc-" + m[1].str();
    });
    return identity_;
  }

  std::vector<std::string> flags(const KernelSource& src, const JitOptions& opt) const override {
    std::string arch = opt.arch.rfind("sm_", 0) == 0 ? opt.arch.substr(3) : opt.arch;
    std::vector<std::string> f = {fmt::format("-gencode=arch=compute_{0},code=sm_{0}", arch), "-O3",
                                  "--expt-relaxed-constexpr"};
    std::vector<std::string> c = common_flags(src, opt);
    f.insert(f.end(), c.begin(), c.end());
    return f;
  }

  CompileOutput compile(const KernelSource& src, const std::vector<std::string>& flags, const fs::path& work_dir,
                        bool want_ptx, const PchRequest&) const override {
    identity();  // throws a clear error when nvcc is missing
    auto t0 = std::chrono::steady_clock::now();
    // Name the file like NVRTC does ("<name>.cu") so both compilers' logs read alike.
    std::string stem = src.name.empty() ? "kernel" : src.name;
    for (char& c : stem)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
    fs::path cu = work_dir / (stem + ".cu"), cubin = work_dir / "nvcc_output.cubin";
    write_text(cu, src.source);
    auto command = [&](const char* mode, const std::vector<std::string>& f, const fs::path& out) {
      std::vector<std::string> argv = {nvcc_, mode};
      argv.insert(argv.end(), f.begin(), f.end());
      argv.insert(argv.end(), {"-o", out.string(), cu.string()});
      return argv;
    };
    // cwd = the scratch dir, so files in the caller's cwd cannot shadow headers.
    ProcessResult r = run_process(command("-cubin", flags, cubin), work_dir);
    if (r.exit_code != 0) throw Error(fmt::format("nvcc exited with {}\n{}", r.exit_code, r.output));
    CompileOutput out;
    out.log = r.output;
    out.cubin = read_bytes(cubin);
    if (out.cubin.empty()) throw Error("nvcc produced an empty cubin\n" + r.output);
    if (want_ptx) {
      // "-gencode=arch=compute_X,code=sm_X" cannot emit PTX: ask for the virtual arch alone.
      std::vector<std::string> ptx_flags = flags;
      for (std::string& f : ptx_flags) {
        std::smatch m;
        if (std::regex_search(f, m, std::regex(R"(^-gencode=arch=(compute_\w+),)"))) f = "-arch=" + m[1].str();
      }
      fs::path ptx = work_dir / "nvcc_output.ptx";
      if (run_process(command("-ptx", ptx_flags, ptx), work_dir).exit_code == 0) {
        std::vector<char> p = read_bytes(ptx);
        out.ptx.assign(p.begin(), p.end());
      }
    }
    read_ptxas_report(out);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

 private:
  std::string nvcc_;
  mutable std::once_flag once_;
  mutable std::string identity_;
};

}  // namespace

JitPchStats jit_pch_stats() {
  PchRegistry& reg = pch_registry();
  std::lock_guard lock(reg.mu);
  return reg.stats;
}

const Compiler& nvrtc_compiler() {
  static NvrtcCompiler c;
  return c;
}

const Compiler& nvcc_compiler() {
  static NvccCompiler c;
  return c;
}

const Compiler& compiler_for(CompilerKind kind) {
  // The environment's choice is read once: a process never mixes compilers by accident.
  static const CompilerKind env_kind = [] {
    std::string v = env_or("COMFUSE_JIT_COMPILER", "nvrtc");
    if (v == "nvcc") return CompilerKind::Nvcc;
    if (v != "nvrtc") spdlog::warn("jit: COMFUSE_JIT_COMPILER='{}' is not nvrtc|nvcc; using nvrtc", v);
    return CompilerKind::Nvrtc;
  }();
  if (kind == CompilerKind::Auto) kind = env_kind;
  return kind == CompilerKind::Nvcc ? nvcc_compiler() : nvrtc_compiler();
}

namespace jit_detail {

fs::path kernels_dir_of(const JitOptions& opt) {
  const char* env = std::getenv("COMFUSE_KERNELS_DIR");
  const bool from_env = opt.kernels_dir.empty() && env && *env;
  const fs::path dir = !opt.kernels_dir.empty() ? fs::path(opt.kernels_dir)
                       : from_env               ? fs::path(env)
                                                : fs::path(COMFUSE_KERNELS_DIR);
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::is_directory(st)) {
    const std::string what = fs::exists(st) ? "is not a directory"
                             : ec && ec != std::errc::no_such_file_or_directory
                                 ? fmt::format("cannot be read ({})", ec.message())
                                 : "does not exist";
    throw Error(fmt::format("jit: the kernel headers' directory '{}' (from {}) {}: it should be the project's "
                            "kernels/ directory (the one holding comfuse/config.cuh)",
                            dir.string(),
                            !opt.kernels_dir.empty() ? "JitOptions::kernels_dir"
                            : from_env              ? "$COMFUSE_KERNELS_DIR"
                                                    : "the build's kernels/ path",
                            what));
  }
  return dir;
}

}  // namespace jit_detail
}  // namespace comfuse
