#pragma once
// One exception type for every user-facing failure, carrying where it came from.
#include <stdexcept>
#include <string>

namespace comfuse {

struct SourceLoc {
  int line = 0;    // 1-based; 0 = not from text
  int column = 0;  // 1-based
  bool known() const { return line > 0; }
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  Error(SourceLoc loc, const std::string& what)
      : std::runtime_error(loc.known() ? "line " + std::to_string(loc.line) + ", column " +
                                             std::to_string(loc.column) + ": " + what
                                       : what),
        loc_(loc) {}
  SourceLoc loc() const { return loc_; }

 private:
  SourceLoc loc_{};
};

}  // namespace comfuse
