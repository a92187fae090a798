#pragma once
// A CPU test's expectation that a call is refused with a comfuse::Error whose message names
// `needle` (an option, a dimension, a limit): the refusal is by name, not merely a throw.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "comfuse/error.h"

namespace comfuse::test {

inline void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace comfuse::test
