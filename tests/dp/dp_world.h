// dp_world.h — the data-parallel tests' ranks. The dp_test binary runs under `mpirun -np N` (ctest
// label dp); its main() makes the job's communicator before any test runs. Every test must issue the
// same collectives on every rank, so a check never returns early before a collective (EXPECT, not
// ASSERT, until the last one).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "zinf/backends/world.h"
#include "zinf/comm.h"

namespace zinf::test {

Comm& world();  // the job's communicator (solo when the binary was started without mpirun)

// Runs f; one that has not finished after `seconds` is a hang (the ranks waiting for each other):
// the job is ended with a line naming `what`, instead of every rank waiting for ever.
void within(int seconds, const std::string& what, const std::function<void()>& f);

// Skips the calling test when the binary was started as one process.
#define ZINF_NEED_RANKS()                                                                                \
  do {                                                                                                   \
    if (::zinf::test::world().size() < 2) GTEST_SKIP() << "needs several ranks: run under mpirun -np 2"; \
  } while (0)

}  // namespace zinf::test
