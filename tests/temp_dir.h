#pragma once
// A fresh directory under the system's temporary directory (mkdtemp: unique across processes and
// containers sharing /tmp), for a test fixture's files; the fixture removes it.
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace comfuse::test {

inline std::filesystem::path make_temp_dir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + tmpl);
  return tmpl;
}

}  // namespace comfuse::test
