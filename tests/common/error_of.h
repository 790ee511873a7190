// error_of.h — the message of the exception a call throws, for tests that check what an error says.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace zinf::test {

// What `f()` throws as an E; fails the test (and returns "") when it throws nothing.
template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

}  // namespace zinf::test
