// jit_compile: content-addressed disk cache in front of the compilers.
//
// Layout under the cache root:
//   <key>/kernel.cubin, kernel.cu, meta.json   one finished entry, never modified in place
//   tmp/<key>.<unique>/                          an entry being built (renamed into place)
//   tmp/<key>.<unique>.work/                     compiler scratch (nvcc files), deleted
//   pch/<pid>.<salt>/<pch key>.pch               one process's NVRTC precompiled headers (PchRequest
//                                                in jit.h), removed when it exits
// An entry becomes visible only through rename(2) of a complete, fsynced directory, so a
// reader sees all of it or nothing; when two processes race, the loser's rename fails
// (the target is a non-empty directory) and it uses the winner's entry.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "comfuse/jit.h"
#include "field_hash.h"
#include "find_tool.h"
#include "kernels_dir.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace comfuse {
namespace {

constexpr int kFormat = 2;  // bump when the entry layout or key recipe changes

// COMFUSE_LOG names an spdlog level. spdlog maps an unknown name to `off`, which would also
// silence the warnings that matter (a corrupt cache entry, an nvcc fallback): refuse it.
void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* lvl = std::getenv("COMFUSE_LOG");
    if (!lvl || !*lvl) return;
    const spdlog::level::level_enum level = spdlog::level::from_str(lvl);
    if (level == spdlog::level::off && std::string_view(lvl) != "off")
      throw Error(fmt::format("COMFUSE_LOG='{}' is not a log level (trace, debug, info, warn, error, critical, off)",
                              lvl));
    spdlog::set_level(level);
  });
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }
std::string hash_hex(std::string_view s) { return hex64(XXH3_64bits(s.data(), s.size())); }

std::string read_text(const fs::path& p, bool* ok = nullptr) {
  std::ifstream in(p, std::ios::binary);
  if (ok) *ok = bool(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Unique per process, thread and call: names temp dirs that concurrent builders never share.
std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return fmt::format("{}.{:x}.{}", getpid(), salt, counter++);
}

// Write and fsync: the rename that publishes the entry must not outrun the data.
void write_synced(const fs::path& p, std::string_view data) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("jit: cannot create {}: {}", p.string(), std::strerror(errno)));
  for (size_t done = 0; done < data.size();) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw Error(fmt::format("jit: cannot write {}: {}", p.string(), std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
}

void fsync_dir(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Move a directory out of the way, then delete it: a concurrent reader sees the entry
// whole or not at all, never half deleted. Losing the race to another remover is fine.
void discard_dir(const fs::path& dir, const fs::path& tmp_root) {
  std::error_code ec;
  fs::create_directories(tmp_root, ec);
  fs::path trash = tmp_root / ("trash." + unique_suffix());
  if (::rename(dir.c_str(), trash.c_str()) == 0) fs::remove_all(trash, ec);
}

// A process killed mid-compile leaves its build dir in tmp/. Sweep those on the next miss;
// an hour is far beyond any compile, so a live builder's dir is never taken.
void sweep_stale(const fs::path& tmp_root) {
  std::error_code ec;
  auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(tmp_root, ec), end; !ec && it != end; it.increment(ec)) {
    auto t = fs::last_write_time(it->path(), ec);
    if (!ec && now - t > std::chrono::hours(1)) discard_dir(it->path(), tmp_root);
  }
}

// This process's PCH directory under <root>/pch, made on first use and removed at exit (by
// the process that made it, not a forked child). Directories of processes that died without
// removing theirs are swept then: their pid is gone.
fs::path process_pch_dir(const fs::path& root) {
  struct Dirs {
    std::mutex mu;
    std::map<fs::path, fs::path> by_root;
    pid_t owner = getpid();
    ~Dirs() {
      if (getpid() != owner) return;
      std::error_code ec;
      for (const auto& [root, dir] : by_root) fs::remove_all(dir, ec);
    }
  };
  static Dirs dirs;
  std::lock_guard lock(dirs.mu);
  auto it = dirs.by_root.find(root);
  if (it != dirs.by_root.end()) return it->second;
  fs::path pch_root = root / "pch";
  std::error_code ec;
  for (fs::directory_iterator d(pch_root, ec), end; !ec && d != end; d.increment(ec)) {
    const std::string name = d->path().filename().string();
    const long pid = std::strtol(name.c_str(), nullptr, 10);
    if (pid > 0 && pid != getpid() && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      discard_dir(d->path(), root / "tmp");
  }
  static const uint64_t salt = std::random_device{}();
  return dirs.by_root[root] = pch_root / fmt::format("{}.{:x}", getpid(), salt);
}

bool pch_wanted(const JitOptions& opt) {
  if (opt.pch) return *opt.pch;
  const char* env = std::getenv("COMFUSE_JIT_PCH");
  return env && *env && std::string_view(env) != "0";
}

fs::path cache_dir_of(const JitOptions& opt) { return opt.cache_dir.empty() ? default_cache_dir() : opt.cache_dir; }

// Where cache_dir_of's answer came from, for an error that says what to change.
std::string cache_dir_source(const JitOptions& opt) {
  if (!opt.cache_dir.empty()) return "JitOptions::cache_dir";
  if (const char* d = std::getenv("COMFUSE_CACHE_DIR"); d && *d) return "$COMFUSE_CACHE_DIR";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return "$XDG_CACHE_HOME/comfuse";
  if (const char* h = std::getenv("HOME"); h && *h) return "$HOME/.cache/comfuse";
  return "the temporary directory";
}

fs::path dump_dir_of(const JitOptions& opt) {
  if (!opt.dump_dir.empty()) return opt.dump_dir;
  const char* env = std::getenv("COMFUSE_JIT_DUMP");
  return env && *env ? fs::path(env) : fs::path();
}

// Everything that determines the cubin, hashed with length prefixes so that no two
// different inputs serialize alike. The kernels-dir -I path is replaced by a token: its
// headers' contents are hashed instead, so moving the checkout does not invalidate the cache.
struct KeyInputs {
  std::string key;
  std::vector<std::string> flags;  // as passed to the compiler
  std::vector<std::pair<std::string, std::string>> headers;
};

KeyInputs make_key(const KernelSource& src, const JitOptions& opt, const Compiler& cc) {
  KeyInputs k;
  k.flags = cc.flags(src, opt);
  fs::path kdir = jit_detail::kernels_dir_of(opt);
  k.headers = project_headers(src.source, kdir);
  jit_detail::FieldHash key;
  auto field = [&](std::string_view s) { key.field(s); };
  field(fmt::format("comfuse-jit-v{}", kFormat));
  field(src.name);
  field(src.source);
  field(opt.arch);
  field(cc.identity());
  std::string kdir_flag = "-I" + kdir.string();
  for (const std::string& f : k.flags) field(f == kdir_flag ? "-I<kernels>" : f);
  field("headers");
  for (const auto& [path, hash] : k.headers) {
    field(path);
    field(hash);
  }
  k.key = key.hex();
  return k;
}

// Load and verify an entry. Returns false when it is absent; a present but damaged entry
// (missing file, unparsable meta, wrong key, checksum mismatch, not an ELF) is discarded
// so the caller rebuilds it.
bool load_entry(const fs::path& dir, const std::string& key, const fs::path& tmp_root, CompiledKernel& out) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return false;
  std::string why;
  try {
    bool ok = false;
    std::string meta_text = read_text(dir / "meta.json", &ok);
    if (!ok) throw Error("meta.json missing");
    json meta = json::parse(meta_text);
    if (meta.at("format").get<int>() != kFormat || meta.at("key").get<std::string>() != key)
      throw Error("meta.json belongs to another key or format");
    std::string cubin = read_text(dir / "kernel.cubin", &ok);
    if (!ok) throw Error("kernel.cubin missing");
    if (cubin.size() != meta.at("cubin_size").get<size_t>() || hash_hex(cubin) != meta.at("cubin_xxh3").get<std::string>())
      throw Error("kernel.cubin checksum mismatch");
    std::string source = read_text(dir / "kernel.cu", &ok);
    if (!ok || hash_hex(source) != meta.at("source_xxh3").get<std::string>()) throw Error("kernel.cu missing or changed");
    out.cubin.assign(cubin.begin(), cubin.end());
    if (!is_cubin_elf(out.cubin)) throw Error("kernel.cubin is not a CUDA ELF");
    out.compiler = meta.at("compiler").get<std::string>();
    out.compile_seconds = meta.at("compile_seconds").get<double>();
    out.wgmma_serialized = meta.at("wgmma_serialized").get<bool>();
    out.stack_bytes = meta.at("stack_bytes").get<int>();
    out.spill_bytes = meta.at("spill_bytes").get<int>();
    out.log = meta.at("log").get<std::string>();
    out.entry_dir = dir;
    return true;
  } catch (const std::exception& e) {  // Error, json::exception
    why = e.what();
  }
  spdlog::warn("jit: cache entry {} is corrupt ({}); rebuilding it", dir.string(), why);
  discard_dir(dir, tmp_root);
  out.cubin.clear();
  return false;
}

json make_meta(const KernelSource& src, const JitOptions& opt, const KeyInputs& k, const CompiledKernel& ck) {
  std::string cubin(ck.cubin.begin(), ck.cubin.end());
  json headers = json::object();
  for (const auto& [path, hash] : k.headers) headers[path] = hash;
  return json{{"format", kFormat},
              {"key", k.key},
              {"name", src.name},
              {"entry", src.entry},
              {"arch", opt.arch},
              {"compiler", ck.compiler},
              {"flags", k.flags},
              {"headers", headers},
              {"source_size", src.source.size()},
              {"source_xxh3", hash_hex(src.source)},
              {"cubin_size", cubin.size()},
              {"cubin_xxh3", hash_hex(cubin)},
              {"compile_seconds", ck.compile_seconds},
              {"wgmma_serialized", ck.wgmma_serialized},
              {"stack_bytes", ck.stack_bytes},
              {"spill_bytes", ck.spill_bytes},
              {"log", ck.log},
              {"created_unix", std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count()}};
}

// COMFUSE_JIT_DUMP: source, PTX (when this call compiled), cubin, log and SASS side by side.
void dump(const fs::path& root, const KernelSource& src, const CompiledKernel& ck, const std::string& ptx) {
  fs::path d = root / fmt::format("{}-{}", src.name.empty() ? "kernel" : src.name, ck.key.substr(0, 12));
  std::error_code ec;
  fs::create_directories(d, ec);
  std::ofstream(d / "kernel.cu") << src.source;
  std::ofstream(d / "kernel.cubin", std::ios::binary).write(ck.cubin.data(), static_cast<std::streamsize>(ck.cubin.size()));
  std::ofstream(d / "compile.log") << ck.log;
  if (!ptx.empty()) std::ofstream(d / "kernel.ptx") << ptx;
  fs::path tool = jit_detail::find_tool("cuobjdump");
  if (!tool.empty()) {
    std::string cmd = fmt::format("'{}' --dump-sass '{}' > '{}' 2>&1", tool.string(), (d / "kernel.cubin").string(),
                                  (d / "kernel.sass").string());
    if (std::system(cmd.c_str()) != 0) spdlog::warn("jit: cuobjdump failed, see {}", (d / "kernel.sass").string());
  } else {
    std::ofstream(d / "kernel.sass") << "cuobjdump not found (looked beside nvcc and on PATH)\n";
  }
  spdlog::info("jit: dumped {} to {}", src.name, d.string());
}

// Keep a failing source where a person can open it; the Error names the file.
fs::path keep_failed_source(const KernelSource& src, const std::string& key, const std::string& log) {
  fs::path d = fs::temp_directory_path() / "comfuse-jit-failed";
  std::error_code ec;
  fs::create_directories(d, ec);
  fs::path cu = d / fmt::format("{}-{}.cu", src.name.empty() ? "kernel" : src.name, key.substr(0, 16));
  std::ofstream(cu) << src.source;
  std::ofstream(fs::path(cu).replace_extension(".log")) << log;
  return cu;
}

void check_entry(const KernelSource& src, const CompiledKernel& ck) {
  if (src.entry.empty()) return;
  std::vector<std::string> syms = cubin_symbols(ck.cubin);
  for (const std::string& s : syms)
    if (s == src.entry) return;
  throw Error(fmt::format("jit: kernel '{}' has no entry '{}' in its cubin; functions there: {}", src.name, src.entry,
                          fmt::join(syms, ", ")));
}

void report_serialization(const KernelSource& src, const CompiledKernel& ck) {
  // Error level on purpose: the kernel runs and is correct, so nothing else would notice.
  if (ck.wgmma_serialized)
    spdlog::error("jit: ptxas serialized the wgmma pipeline of '{}' (C7510/C7520): expect a slow kernel. "
                  "Keep asserts, printf and calls out of the wgmma region.", src.name);
}

}  // namespace

fs::path default_cache_dir() {
  if (const char* d = std::getenv("COMFUSE_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "comfuse";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "comfuse";
  return fs::temp_directory_path() / "comfuse-cache";
}

std::vector<std::pair<std::string, std::string>> project_headers(std::string_view source, const fs::path& kernels_dir) {
  static const std::regex include_re(R"(^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"])");
  std::error_code ec;
  fs::path root = fs::weakly_canonical(kernels_dir, ec);
  std::set<fs::path> seen;
  std::vector<std::pair<std::string, std::string>> out;
  // (text, directory of the file it came from; empty for the generated source)
  std::vector<std::pair<std::string, fs::path>> todo = {{std::string(source), {}}};
  while (!todo.empty()) {
    auto [text, from_dir] = std::move(todo.back());
    todo.pop_back();
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (line.find("include") == std::string::npos || !std::regex_search(line, m, include_re)) continue;
      // "..." looks beside the including header first, then every form looks in kernels/.
      std::vector<fs::path> candidates;
      if (m[1] == "\"" && !from_dir.empty()) candidates.push_back(from_dir / m[2].str());
      candidates.push_back(root / m[2].str());
      for (const fs::path& c : candidates) {
        if (!fs::is_regular_file(c, ec)) continue;
        fs::path p = fs::weakly_canonical(c, ec);
        fs::path rel = p.lexically_relative(root);
        if (rel.empty() || *rel.begin() == "..") break;  // outside kernels/: CUTLASS, CUDA
        if (seen.insert(p).second) {
          std::string content = read_text(p);
          out.emplace_back(rel.generic_string(), hash_hex(content));
          todo.emplace_back(std::move(content), p.parent_path());
        }
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string jit_cache_key(const KernelSource& src, const JitOptions& opt) {
  return make_key(src, opt, compiler_for(opt.compiler)).key;
}

namespace {
// The first line of a compiler's log that reports an error (NVRTC's first line is its status,
// NVRTC_ERROR_COMPILATION), else its first line, cut to 200 characters: what a fallback's warning
// says of why.
std::string first_error_line(const std::string& log) {
  std::istringstream in(log);
  std::string line, first;
  while (std::getline(in, line)) {
    if (first.empty()) first = line;
    if (line.find("error") != std::string::npos) {
      first = line;
      break;
    }
  }
  if (first.empty()) return "no log";
  return first.size() > 200 ? first.substr(0, 200) + "..." : first;
}
}  // namespace

CompiledKernel jit_compile(const KernelSource& src, const JitOptions& opt) {
  init_logging();
  auto t0 = std::chrono::steady_clock::now();
  const Compiler& cc = compiler_for(opt.compiler);
  KeyInputs k = make_key(src, opt, cc);
  fs::path root = cache_dir_of(opt), tmp_root = root / "tmp", entry = root / k.key;
  fs::path dump_root = dump_dir_of(opt);

  CompiledKernel ck;
  ck.key = k.key;
  ck.kernel_name = src.entry;
  if (opt.use_cache && load_entry(entry, k.key, tmp_root, ck)) {
    ck.cache_hit = true;
    ck.elapsed_seconds = since(t0);
    check_entry(src, ck);
    spdlog::debug("jit: cache hit '{}' {} ({:.1f} ms)", src.name, k.key, ck.elapsed_seconds * 1e3);
    report_serialization(src, ck);
    if (!dump_root.empty()) dump(dump_root, src, ck, {});
    return ck;
  }

  // Build in a private directory on the cache's filesystem (rename needs the same one).
  fs::path build = opt.use_cache ? tmp_root / (k.key + "." + unique_suffix())
                                 : fs::temp_directory_path() / ("comfuse-jit." + unique_suffix());
  fs::path work = build.string() + ".work";
  if (opt.use_cache) sweep_stale(tmp_root);
  std::error_code mk_ec;
  fs::create_directories(build, mk_ec);
  if (!mk_ec) fs::create_directories(work, mk_ec);
  if (mk_ec && !opt.use_cache)
    throw Error(fmt::format("jit: cannot create the scratch directory {}: {} (TMPDIR names where)", build.string(),
                            mk_ec.message()));
  if (mk_ec) {
    const std::string from = cache_dir_source(opt);
    throw Error(fmt::format("jit: the JIT cache directory '{}' (from {}) is not writable: cannot create {}: {}{}",
                            root.string(), from, build.string(), mk_ec.message(),
                            from == "$COMFUSE_CACHE_DIR" || from == "JitOptions::cache_dir"
                                ? ""
                                : "; set COMFUSE_CACHE_DIR to a writable directory"));
  }
  struct Cleanup {
    fs::path a, b;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove_all(b, ec);
    }
  } cleanup{build, work};

  PchRequest pch;
  if (cc.kind() == CompilerKind::Nvrtc && pch_wanted(opt)) {
    pch.dir = process_pch_dir(root);
    for (const auto& [path, hash] : k.headers) pch.salt += path + ":" + hash + "\n";
  }
  CompileOutput co;
  try {
    co = cc.compile(src, k.flags, work, !dump_root.empty(), pch);
  } catch (const Error& e) {
    if (cc.kind() == CompilerKind::Nvrtc && opt.nvcc_fallback) {
      spdlog::warn("jit: NVRTC failed on '{}' ({}); retrying with nvcc", src.name, first_error_line(e.what()));
      JitOptions o2 = opt;
      o2.compiler = CompilerKind::Nvcc;
      o2.nvcc_fallback = false;
      try {
        return jit_compile(src, o2);
      } catch (const Error& e2) {
        fs::path kept = keep_failed_source(src, k.key, std::string(e.what()) + "\n--- nvcc:\n" + e2.what());
        throw Error(fmt::format("jit: {} failed to compile kernel '{}' (source kept at {}):\n{}\n--- nvcc fallback:\n{}",
                                cc.identity(), src.name, kept.string(), e.what(), e2.what()));
      }
    }
    fs::path kept = keep_failed_source(src, k.key, e.what());
    throw Error(fmt::format("jit: {} failed to compile kernel '{}' (source kept at {}):\n{}", cc.identity(), src.name,
                            kept.string(), e.what()));
  }
  ck.cubin = std::move(co.cubin);
  ck.compiler = cc.identity();
  ck.compile_seconds = co.seconds;
  ck.wgmma_serialized = co.wgmma_serialized;
  ck.stack_bytes = co.stack_bytes;
  ck.spill_bytes = co.spill_bytes;
  ck.pch_used = co.pch_used;
  ck.log = co.log;
  if (!is_cubin_elf(ck.cubin)) throw Error(fmt::format("jit: {} returned a cubin that is not a CUDA ELF", cc.identity()));
  check_entry(src, ck);
  spdlog::debug("jit: compiled '{}' with {}{} in {:.2f} s, cubin {} bytes, stack {} B, spills {} B, key {}", src.name,
                cc.identity(), co.pch_used ? " (PCH)" : "", co.seconds, ck.cubin.size(), ck.stack_bytes, ck.spill_bytes,
                k.key);
  report_serialization(src, ck);

  if (opt.use_cache) {
    write_synced(build / "kernel.cubin", std::string_view(ck.cubin.data(), ck.cubin.size()));
    write_synced(build / "kernel.cu", src.source);
    write_synced(build / "meta.json", make_meta(src, opt, k, ck).dump(2));
    fsync_dir(build);
    if (::rename(build.c_str(), entry.c_str()) == 0) {
      fsync_dir(root);
      ck.entry_dir = entry;
    } else if (errno == EEXIST || errno == ENOTEMPTY) {
      // Another process published the same key first; its entry is equivalent, use it so
      // every process runs byte-identical code.
      CompiledKernel winner = ck;
      if (load_entry(entry, k.key, tmp_root, winner)) {
        spdlog::debug("jit: lost the publish race for {}; using the winner's entry", k.key);
        ck = std::move(winner);
      }
    } else {
      spdlog::warn("jit: cannot publish {} into the cache: {}", k.key, std::strerror(errno));
    }
  }
  ck.elapsed_seconds = since(t0);
  if (!dump_root.empty()) dump(dump_root, src, ck, co.ptx);
  return ck;
}

fs::path jit_detail::find_tool(const char* name) {
  fs::path beside = fs::path(COMFUSE_NVCC).parent_path() / name;
  if (fs::exists(beside)) return beside;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty() && fs::exists(fs::path(d) / name)) return fs::path(d) / name;
  }
  return {};
}

}  // namespace comfuse
