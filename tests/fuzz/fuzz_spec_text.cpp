// libFuzzer target: parse_spec must return or throw comfuse::Error on any input; an
// accepted spec must print, re-parse to an equal spec and survive verify() and the
// nest queries without crashing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "comfuse/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  comfuse::FusionSpec s;
  try {
    s = comfuse::parse_spec(text);
  } catch (const comfuse::Error&) {
    return 0;
  }
  const std::string printed = comfuse::print(s);
  comfuse::FusionSpec back = comfuse::parse_spec(printed);  // an Error here is a bug: let it abort
  if (!(back == s) || comfuse::print(back) != printed) std::abort();
  try {
    comfuse::verify(s);
  } catch (const comfuse::Error&) {
  }
  (void)s.reduction_count();
  (void)s.stage_count();
  comfuse::SpecVisitor().walk(s.root);
  return 0;
}
