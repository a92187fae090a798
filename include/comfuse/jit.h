#pragma once
// jit layer: CUDA C++ text -> sm_90a cubin, through NVRTC (in process) or nvcc (subprocess),
// behind a content-addressed disk cache that is safe under concurrent processes.
//
// Environment:
//   COMFUSE_JIT_COMPILER=nvrtc|nvcc  what JitOptions::compiler=Auto means (default nvrtc; read once)
//   COMFUSE_CACHE_DIR                cache root; else $XDG_CACHE_HOME/comfuse, else ~/.cache/comfuse
//   COMFUSE_JIT_DUMP=dir             also write source, PTX, cubin and SASS of each kernel to dir
//   COMFUSE_NVCC                     nvcc binary (default: the toolkit's, fixed at build time; read once)
//   COMFUSE_KERNELS_DIR, COMFUSE_CUTLASS_INCLUDE, COMFUSE_CUDA_INCLUDE
//                                    override the build-time header paths (a relocated tree)
//   COMFUSE_LOG=debug|info|...       spdlog level, set on the first jit_compile (compile times and
//                                    cache hits log at debug)
//   COMFUSE_JIT_PCH=1                what JitOptions::pch unset means (default 0: no precompiled header)
// Failed sources are kept in $TMPDIR/comfuse-jit-failed/<name>-<key>.cu (+ .log).
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comfuse/error.h"

namespace comfuse {

// One kernel translation unit as the emit layer renders it.
struct KernelSource {
  std::string name;                // human label: logs, dump folder, failure file names
  std::string source;              // the full CUDA C++ text (it is part of the cache key)
  std::string entry;               // symbol to launch: extern "C" name or mangled name;
                                   // checked against the cubin's symbol table when not empty
  std::vector<std::string> flags;  // extra compiler flags, e.g. "-DTILE_N=256", "-lineinfo"
};

enum class CompilerKind { Auto, Nvrtc, Nvcc };

struct JitOptions {
  CompilerKind compiler = CompilerKind::Auto;  // Auto: COMFUSE_JIT_COMPILER, else NVRTC
  std::string arch = "sm_90a";                 // wgmma/TMA/clusters need the "a" variant
  bool fast_math = false;                      // --use_fast_math
  bool use_cache = true;                       // false: always compile, never touch the cache
  bool nvcc_fallback = true;                   // NVRTC failed: retry with nvcc before throwing
  std::filesystem::path cache_dir;             // empty: default_cache_dir()
  std::filesystem::path kernels_dir;           // empty: the project's kernels/ (an include path
                                               // whose headers are content-hashed into the key)
  std::filesystem::path dump_dir;              // empty: $COMFUSE_JIT_DUMP (may be empty: no dump)
  // NVRTC precompiled header of the source's leading #include block (jit_pch_stats below says
  // what it costs and saves). Unset: $COMFUSE_JIT_PCH. Never changes the cubin or the key.
  std::optional<bool> pch;
};

struct CompiledKernel {
  std::string key;                  // 32 hex digits, xxh3-128 of every compile input
  std::vector<char> cubin;          // ELF, load with cuModuleLoadData / cuLibraryLoadData
  std::string kernel_name;          // KernelSource::entry
  std::string compiler;             // identity, e.g. "nvrtc-13.0" or "nvcc-13.0.88"
  double compile_seconds = 0;       // time the compiler took when the entry was built
  double elapsed_seconds = 0;       // time this jit_compile call took (hit: load + verify)
  bool cache_hit = false;           // true: loaded from disk without compiling
  bool wgmma_serialized = false;    // ptxas C7510/C7520: wgmma serialized, the kernel will be slow
  // ptxas -v's function properties (-1: not reported): the largest stack frame of the functions
  // it lists (the entry and what it calls), and the bytes they spill to and reload from their
  // stacks (a register budget the kernel overran).
  int stack_bytes = -1;
  int spill_bytes = -1;
  bool pch_used = false;            // this call compiled against a precompiled header
  std::string log;                  // compiler log (ptxas diagnostics included)
  std::filesystem::path entry_dir;  // <cache>/<key>, empty when use_cache is false
};

// Compile (or load from the cache). Throws comfuse::Error on a compile failure, with the
// compiler's log and the path of a copy of the source kept for inspection.
CompiledKernel jit_compile(const KernelSource& src, const JitOptions& opt = {});

// The key jit_compile would use, without compiling (hashes the included project headers).
std::string jit_cache_key(const KernelSource& src, const JitOptions& opt = {});

std::filesystem::path default_cache_dir();

// Precompiled headers (NVRTC only). An NVRTC PCH can only be used by the process that made
// it (it is a dump of NVRTC's PCH heap, whose address differs per process), so each process
// keeps its own under <cache>/pch/<pid>.<salt>/ and removes them at exit. The PCH covers the
// source's leading preprocessor directives (its #include block: CuTe/CUTLASS and the kernel
// headers); it is made once per (directives, flags, project headers' contents) from a source
// holding only those directives, then every compile with the same block uses it. A PCH that
// cannot be made or used costs one plain compile, never a failure.
struct PchRequest {
  std::filesystem::path dir;  // this process's PCH directory; empty: no PCH
  std::string salt;           // folded into the PCH's key: the included project headers' hashes
};

struct JitPchStats {
  int created = 0;         // PCH files made
  int used = 0;            // compiles that used one
  int failed = 0;          // creations or uses that failed (the compile ran without a PCH)
  double create_seconds = 0;  // total time spent making them
};
JitPchStats jit_pch_stats();  // this process's, since it started

// Result of one compiler run, before caching.
struct CompileOutput {
  std::vector<char> cubin;
  std::string ptx;  // only when asked for (dumps)
  std::string log;
  bool wgmma_serialized = false;
  int stack_bytes = -1, spill_bytes = -1;  // CompiledKernel's
  bool pch_used = false;
  double seconds = 0;  // a PCH made for this compile included
};

// One abstract compiler, two implementations; jit_compile picks one per call from
// JitOptions::compiler, and Auto resolves once per process from the environment.
class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual CompilerKind kind() const = 0;
  // Name + version; part of the cache key, so a toolkit upgrade recompiles everything.
  virtual const std::string& identity() const = 0;
  // Every flag that changes the output, in order (extra flags last). Part of the key.
  virtual std::vector<std::string> flags(const KernelSource& src, const JitOptions& opt) const = 0;
  // Compile src with exactly `flags`. work_dir is an existing private scratch directory.
  // Throws Error (message = compiler log) when the compiler reports a failure. `pch`: where
  // this process's precompiled headers live (NVRTC uses it; nvcc ignores it).
  virtual CompileOutput compile(const KernelSource& src, const std::vector<std::string>& flags,
                                const std::filesystem::path& work_dir, bool want_ptx,
                                const PchRequest& pch) const = 0;
};

// Process-wide instances (created on first use; identity queries the toolkit once).
const Compiler& nvrtc_compiler();
const Compiler& nvcc_compiler();
const Compiler& compiler_for(CompilerKind kind);  // Auto -> the environment's choice

// Cubin helpers (ELF64 parsing, no CUDA driver needed).
bool is_cubin_elf(const std::vector<char>& bytes);
std::vector<std::string> cubin_symbols(const std::vector<char>& bytes);  // function symbols

// Project headers that `source` may include, transitively: every #include (conditional
// ones too) that resolves inside kernels_dir. Returned as (path relative to kernels_dir,
// xxh3-64 hex of the content), sorted. Exposed for tests and `comfuse explain`.
std::vector<std::pair<std::string, std::string>> project_headers(
    std::string_view source, const std::filesystem::path& kernels_dir);

}  // namespace comfuse
