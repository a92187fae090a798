// Just enough ELF64 reading to check a cubin without a GPU: is it an ELF for the CUDA
// machine, and which function symbols does it define (so a wrong entry name fails at
// compile time with the list of real names, not at cuModuleGetFunction on the device).
#include <cstdint>
#include <cstring>

#include "comfuse/jit.h"

namespace comfuse {
namespace {

constexpr uint16_t kEmCuda = 190;  // e_machine of NVIDIA cubins
constexpr uint32_t kShtSymtab = 2;
constexpr uint8_t kSttFunc = 2;

template <class T>
bool read_at(const std::vector<char>& b, uint64_t off, T& out) {
  if (off > b.size() || b.size() - off < sizeof(T)) return false;
  std::memcpy(&out, b.data() + off, sizeof(T));
  return true;
}

// Layout of the ELF64 headers we touch (little endian, which is all CUDA emits).
struct Ehdr {
  unsigned char ident[16];
  uint16_t type, machine;
  uint32_t version;
  uint64_t entry, phoff, shoff;
  uint32_t flags;
  uint16_t ehsize, phentsize, phnum, shentsize, shnum, shstrndx;
};
struct Shdr {
  uint32_t name, type;
  uint64_t flags, addr, offset, size;
  uint32_t link, info;
  uint64_t addralign, entsize;
};
struct Sym {
  uint32_t name;
  unsigned char info, other;
  uint16_t shndx;
  uint64_t value, size;
};

bool header(const std::vector<char>& b, Ehdr& eh) {
  if (!read_at(b, 0, eh)) return false;
  return std::memcmp(eh.ident, "\x7f" "ELF", 4) == 0 && eh.ident[4] == 2 /*64-bit*/ &&
         eh.ident[5] == 1 /*little endian*/ && eh.machine == kEmCuda;
}

}  // namespace

bool is_cubin_elf(const std::vector<char>& bytes) {
  Ehdr eh;
  return header(bytes, eh);
}

std::vector<std::string> cubin_symbols(const std::vector<char>& b) {
  std::vector<std::string> out;
  Ehdr eh;
  if (!header(b, eh) || eh.shentsize != sizeof(Shdr)) return out;
  for (uint16_t i = 0; i < eh.shnum; ++i) {
    Shdr sh, strsh;
    if (!read_at(b, eh.shoff + uint64_t(i) * sizeof(Shdr), sh) || sh.type != kShtSymtab) continue;
    if (!read_at(b, eh.shoff + uint64_t(sh.link) * sizeof(Shdr), strsh)) continue;
    for (uint64_t off = 0; off + sizeof(Sym) <= sh.size; off += sizeof(Sym)) {
      Sym s;
      if (!read_at(b, sh.offset + off, s) || (s.info & 0xf) != kSttFunc) continue;
      uint64_t at = strsh.offset + s.name;
      if (at >= b.size()) continue;
      out.emplace_back(b.data() + at, strnlen(b.data() + at, b.size() - at));
    }
  }
  return out;
}

}  // namespace comfuse
