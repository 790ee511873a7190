// zinf/offload/dataflow.h — one training step of the offload engine as data: its supernodes, the
// resource each runs on, and the edges each waits on, with the handoff that orders every edge.
//
// The graph is built from the resolved placement (the Layout of buffer_specs.h), so it names only
// the supernodes a placement has: Fetch only with parameter windows, SwapIn/SwapOut only with the
// optimizer on NVMe, Upload only when the Update's new compute copy must travel to the device, the
// checkpoint copies only with activation checkpoints in host memory. Nodes are per unit `u` (or per
// sub-group `g` of unit u); an edge may point at the next unit, a slot's next user, the next micro
// batch or the next step.
//
// A resource is a queue: what runs on one runs in its order. Two resources may share one queue —
// the device's own Update (optimizer on the device) is ordered behind the gradient's rounding on
// the same device queue as GradOut — and the graph says so (queue_of). Every edge between two
// queues needs a handoff that orders it across them; check_handoffs lists every edge without one.
// `zinf plan --dataflow` prints the graph (text, or Graphviz with --dot); the ordering test walks
// it for every placement.
#pragma once

#include <string>
#include <vector>

#include "zinf/device.h"
#include "zinf/offload/buffer_specs.h"

namespace zinf::offload {

enum class Resource {
  trainer,        // the trainer's thread: the model's calls, the norm barrier, stage-3 gathers over MPI
  compute,        // the device's compute stream: the model's ops
  h2d,            // host → device copies: Fetch, Upload, the token batch, checkpoints coming back
  d2h,            // device → host copies: GradOut, checkpoints leaving
  device_update,  // the device's own Update (optimizer on the device): rounding, Adam, the compute copy
  reduce_worker,  // the engine's Reduce worker (host)
  update_worker,  // the engine's Update worker (host): the host Update, landings
  nvme_optimizer, // the optimizer store's queue: SwapIn, SwapOut
  nvme_param,     // the parameter store's queue: the NVMe read of a Fetch, the home's write
  nvme_gradient,  // gradient streaming: the gradient store's queue (each unit's gradient written, read back)
};
const char* resource_name(Resource r);

// The queue a resource's work runs in: itself, but for the device's Update, which the engine runs
// in the order of the d2h stream's queue (Device streams are compute, h2d, d2h): it reads the
// gradient the GradOut rounding wrote there, in stream order.
Resource queue_of(Resource r);
// The device stream that runs a resource's work; compute for resources that are not device streams.
StreamRole stream_of(Resource r);
bool is_stream(Resource r);  // compute, h2d, d2h, device_update
// The stream the engine enqueues the device's Update on: the one queue_of(device_update) names.
constexpr StreamRole kDeviceUpdateStream = StreamRole::d2h;

enum class Handoff {
  none,           // nothing orders it: only right within one queue
  stream_order,   // the same queue: program order on one thread, FIFO order on one stream
  event,          // an event recorded on the producer's stream, waited on by the consumer's stream
  host_wait,      // the consumer's host thread waits (an event, a stream sync, a drained worker, a future)
  enqueued_after, // a host producer finishes, then enqueues the consumer's stream work itself
  version,        // a landing version or flag under the engine's mutex, waited on with its condition
};
const char* handoff_name(Handoff h);

struct DataflowNode {
  std::string name;  // "Fetch(u)", "Update(g)", …
  Resource resource;
  std::string does;  // one line
};

struct DataflowEdge {
  int from = 0, to = 0;  // node indices
  std::string buffer;    // what is handed over: "window slot", "landing buffer", …
  Handoff handoff = Handoff::none;
  std::string by;  // the handoff's name in the code: "slot.ready", "unit.landed", …
  std::string when;  // "" (the same unit) or where the consumer is: "u+1", "next micro batch", "next step", …
  // The engine makes this handoff (false: the trainer's or the model's own, as the token batch's and
  // the activation checkpoints'). Each stage of the engine claims the edges it hands over when it is
  // made (Engine::unclaimed_handoffs lists those no stage claimed).
  bool engine = true;
};

struct StepGraph {
  std::string placement;  // one line: the tiers, stage, accumulation, overlap
  std::vector<DataflowNode> nodes;
  std::vector<DataflowEdge> edges;
  int find(const std::string& name) const;  // -1 when the graph has no such node
  // The edge from node `from` to node `to` with handoff `h`: its index, -1 when the graph has none.
  int edge(const std::string& from, const std::string& to, Handoff h) const;
};

// The step of this placement.
StepGraph step_graph(const Layout& layout);

// Every edge whose handoff does not order it: across two queues, none or stream_order; an event
// whose producer or consumer is not a stream; a host_wait or version into a stream; enqueued_after
// from a stream. One line each ("GradOut(u) d2h -> Reduce(u) Reduce worker: ..."); empty when sound.
std::vector<std::string> check_handoffs(const StepGraph& g);

std::string to_text(const StepGraph& g);
std::string to_dot(const StepGraph& g);

}  // namespace zinf::offload
