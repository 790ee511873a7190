// dp_world.h — the data-parallel tests' ranks. The dp_test binary runs under `mpirun -np N` (ctest
// label dp); its main() makes the job's communicator before any test runs. Every test must issue the
// same collectives on every rank, so a check never returns early before a collective (EXPECT, not
// ASSERT, until the last one).
#pragma once

#include <gtest/gtest.h>

#include "zinf/comm.h"

namespace zinf::test {

Comm& world();  // the job's communicator (solo when the binary was started without mpirun)

// Skips the calling test when the binary was started as one process.
#define ZINF_NEED_RANKS()                                                                          \
  do {                                                                                             \
    if (::zinf::test::world().size() < 2) GTEST_SKIP() << "needs several ranks: run under mpirun -np 2"; \
  } while (0)

}  // namespace zinf::test
