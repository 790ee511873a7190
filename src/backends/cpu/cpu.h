// cpu.h — the CPU backend's factory (backend.cpp), for backends.cpp.
#pragma once

#include "zinf/backends/backend.h"

namespace zinf::cpu {

const backends::Backend& cpu_backend();

}  // namespace zinf::cpu
