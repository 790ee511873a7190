// mpirun.h — the fixture of the tests that start zinf under mpirun.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>

namespace zinf::test {

class MpirunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);  // CI runs as root
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
};

}  // namespace zinf::test
