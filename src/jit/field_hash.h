#pragma once
// The JIT's keys (the disk cache's entry key, cache.cpp; the in-process PCH registry's,
// compiler.cpp): a 128-bit XXH3 hash of a sequence of fields, each prefixed with its length so
// that no two different sequences serialize alike.
#include <xxhash.h>

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace comfuse::jit_detail {

class FieldHash {
 public:
  FieldHash() : st_(XXH3_createState()) { XXH3_128bits_reset(st_); }
  ~FieldHash() { XXH3_freeState(st_); }
  FieldHash(const FieldHash&) = delete;
  FieldHash& operator=(const FieldHash&) = delete;

  void field(std::string_view s) {
    const uint64_t n = s.size();
    XXH3_128bits_update(st_, &n, sizeof n);
    XXH3_128bits_update(st_, s.data(), s.size());
  }
  // 32 hex digits, high half first.
  std::string hex() const {
    const XXH128_hash_t h = XXH3_128bits_digest(st_);
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
  }

 private:
  XXH3_state_t* st_;
};

}  // namespace comfuse::jit_detail
