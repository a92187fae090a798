// libFuzzer target: the graph parser must return or throw comfuse::Error on any input,
// and whatever it accepts must print to text that parses back to the same node count.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "comfuse/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  comfuse::Graph g;
  try {
    g = comfuse::parse_graph(text);
  } catch (const comfuse::Error&) {
    return 0;
  }
  std::string printed;
  try {
    printed = comfuse::print_graph(g);
  } catch (const comfuse::Error&) {
    return 0;  // a graph the text format cannot spell (e.g. a NaN constant): refused, not a crash
  }
  // The printed form must parse: an Error here is a real bug, so it escapes and aborts.
  comfuse::Graph back = comfuse::parse_graph(printed);
  if (back.nodes().size() != g.nodes().size() || back.outputs().size() != g.outputs().size()) std::abort();
  if (comfuse::print_graph(back) != printed) std::abort();
  return 0;
}
