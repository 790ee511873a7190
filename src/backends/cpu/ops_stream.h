// ops_stream.h — a backend that runs another backend's ops as compute-stream work: each call
// enqueues the op on the device's compute stream and returns at once, as a CUDA kernel launch does.
// The CPU device in async mode uses it around CpuOps, so that the host runs ahead of the model's
// math exactly as it does on a GPU and a missing event shows up without one. The math is the wrapped
// backend's, so results are bit-identical to calling it directly.
//
// Pointers are captured by value: what they point to must stay valid (and unmodified by other
// streams) until the compute stream has run the op — the ordering rules of zinf/device.h.
// Nothing here waits for the compute stream: the loss stays in device memory until the host reads it.
#pragma once

#include <memory>

#include "model/backend.h"
#include "zinf/device.h"

namespace zinf {

std::unique_ptr<OpsBackend> make_stream_ops(Device& dev, std::unique_ptr<OpsBackend> inner);

}  // namespace zinf
