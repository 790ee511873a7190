// dataflow.cpp — one step of the offload engine as a graph (zinf/offload/dataflow.h). The edges and
// their handoffs are the engine's own (engine.h's ordering contract; each `by` names the field or
// call in offload/ that does it).
#include "zinf/offload/dataflow.h"

#include <sstream>

namespace zinf::offload {

const char* resource_name(Resource r) {
  switch (r) {
    case Resource::trainer: return "trainer";
    case Resource::compute: return "compute stream";
    case Resource::h2d: return "h2d stream";
    case Resource::d2h: return "d2h stream";
    case Resource::device_update: return "device Update stream";
    case Resource::reduce_worker: return "Reduce worker";
    case Resource::update_worker: return "Update worker";
    case Resource::nvme_optimizer: return "NVMe queue (optimizer states)";
    case Resource::nvme_param: return "NVMe queue (parameters)";
    case Resource::nvme_gradient: return "NVMe queue (gradients)";
  }
  return "?";
}

Resource queue_of(Resource r) { return r == Resource::device_update ? Resource::d2h : r; }

bool is_stream(Resource r) {
  return r == Resource::compute || r == Resource::h2d || r == Resource::d2h || r == Resource::device_update;
}

StreamRole stream_of(Resource r) {
  switch (r) {
    case Resource::h2d: return StreamRole::h2d;
    case Resource::d2h: return StreamRole::d2h;
    case Resource::device_update: return kDeviceUpdateStream;
    default: return StreamRole::compute;
  }
}

const char* handoff_name(Handoff h) {
  switch (h) {
    case Handoff::none: return "none";
    case Handoff::stream_order: return "stream order";
    case Handoff::event: return "event";
    case Handoff::host_wait: return "host wait";
    case Handoff::enqueued_after: return "enqueued after";
    case Handoff::version: return "version";
  }
  return "?";
}

int StepGraph::find(const std::string& name) const {
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == name) return static_cast<int>(i);
  return -1;
}

int StepGraph::edge(const std::string& from, const std::string& to, Handoff h) const {
  const int a = find(from), b = find(to);
  for (std::size_t i = 0; i < edges.size(); ++i)
    if (edges[i].from == a && edges[i].to == b && edges[i].handoff == h) return static_cast<int>(i);
  return -1;
}

namespace {

struct Builder {
  StepGraph g;
  int node(const std::string& name, Resource r, const std::string& does) {
    g.nodes.push_back({name, r, does});
    return static_cast<int>(g.nodes.size()) - 1;
  }
  void edge(int from, int to, const std::string& buffer, Handoff h, const std::string& by, const std::string& when = "") {
    g.edges.push_back({from, to, buffer, h, by, when, true});
  }
  // An edge the trainer or the model hands over, not the engine.
  void outside(int from, int to, const std::string& buffer, Handoff h, const std::string& by,
               const std::string& when = "") {
    g.edges.push_back({from, to, buffer, h, by, when, false});
  }
};

}  // namespace

StepGraph step_graph(const Layout& l) {
  Builder b;
  {
    std::ostringstream p;
    p << "offload_optimizer " << to_string(l.optimizer) << ", offload_param " << to_string(l.param) << ", "
      << (l.mixed ? "16-bit" : "fp32") << " compute copy" << (l.fp32_work ? " with fp32 working weights" : "")
      << ", grad_accum " << l.grad_accum << ", " << l.world << (l.world == 1 ? " rank" : " ranks");
    if (l.parallel) p << " (ZeRO stage " << l.stage << ")";
    p << ", overlap " << (l.exact ? "exact" : "none");
    if (l.device_accum) p << ", gradients summed on the device";
    if (l.speculative) p << ", speculative Update";
    if (l.streaming) p << ", gradients streamed";
    b.g.placement = p.str();
  }
  const bool device_update = !l.optimizer_offloaded;
  const Resource update_on = device_update ? Resource::device_update : Resource::update_worker;
  const bool host_ckpt = l.checkpoint_pinned > 0;

  // ---- the forward and backward, on the model's stream ----
  const int fill = b.node("Batch fill", Resource::trainer, "the micro batch's tokens and targets into a pinned staging slot");
  const int batch = b.node("Batch upload", Resource::h2d, "the micro batch's tokens and targets, pinned slot → device");
  b.outside(fill, batch, "token/target staging (pinned)", Handoff::enqueued_after, "the trainer fills, then enqueues the copy");
  b.outside(batch, fill, "token/target staging, reuse", Handoff::host_wait, "the slot's `copied` event (app/train/batches.h)",
         "the slot's next micro batch");
  const int fwd = b.node("Forward(u)", Resource::compute, "the model's forward of unit u");
  const int bwd = b.node("Backward(u)", Resource::compute, "recompute (checkpointing) and backward of unit u");
  b.outside(batch, fwd, "token/target batch", Handoff::event, "the trainer's upload event (train.cpp)");
  b.outside(fwd, batch, "token/target batch, reuse", Handoff::event,
         "recorded on compute after the last micro batch's ops; h2d waits (train.cpp)", "next step");
  b.outside(fwd, bwd, "activations", Handoff::stream_order, "compute stream");

  // ---- parameters: a window slot (Fetch) or resident (landed in place) ----
  int fetch = -1, read = -1;
  if (l.windows) {
    fetch = b.node("Fetch(u)", Resource::h2d,
                   l.shard_params ? "every rank's shard of unit u gathered into a window slot"
                                  : "unit u's compute copy, its home → a window slot");
    b.edge(fetch, fwd, "window slot", Handoff::event, "slot.ready (model_waits_for)");
    b.edge(fetch, bwd, "window slot", Handoff::event, "slot.ready (model_waits_for)");
    b.edge(fwd, fetch, "window slot, reuse", Handoff::event, "slot.released (done_with)", "the slot's next unit");
    b.edge(bwd, fetch, "window slot, reuse", Handoff::event, "slot.released (done_with)", "the slot's next unit");
    if (l.param == OffloadDevice::nvme) {
      read = b.node("Fetch read(u)", Resource::nvme_param, "unit u's compute copy, NVMe → pinned staging");
      b.edge(read, fetch, "param staging (pinned)", Handoff::host_wait, "the store's read handle (fetch_into)");
      b.edge(fetch, read, "param staging, reuse", Handoff::host_wait, "h2d synchronized before the next read",
             "the staging's next unit");
    }
  }

  // ---- the gradient path: GradOut, Reduce ----
  int gradout, reduce = -1;
  if (device_update) {
    gradout = b.node("GradOut(u)", Resource::d2h,
                     std::string(l.mixed ? "round the fp32 gradient to 16 bits in place" : "the fp32 gradient as it is") +
                         (l.fp32_sum ? ", add it to the fp32 sum" : "") +
                         (l.parallel ? "; reduce it across ranks on the device" : ""));
    b.edge(bwd, gradout, "device gradient", Handoff::event, "recorded on compute at grads_done; d2h waits");
    b.edge(gradout, bwd, "device gradient, reuse", Handoff::host_wait,
           "d2h synchronized by the Reduce worker, then the slot freed; grads(u) waits for a free slot",
           "next micro batch");
  } else {
    gradout = b.node("GradOut(u)", Resource::d2h,
                     l.device_accum ? "round and add the micro batch into the device's fp32 sum; after the last, the "
                                      "sum bucket by bucket → pinned landing buffers"
                                    : l.mixed ? "bucket by bucket: round to 16 bits, → a pinned landing buffer"
                                              : "bucket by bucket: the fp32 gradient → a pinned landing buffer");
    reduce = b.node("Reduce(u)", Resource::reduce_worker,
                    l.parallel && l.streaming
                        ? "landing → fp32, reduced across ranks; this rank's part into a grad ring slot (pinned)"
                    : l.parallel
                        ? "landing → fp32, reduced across ranks, summed over micro batches into this rank's part"
                    : l.streaming ? (l.device_accum ? "landing → the fp32 sum into a grad ring slot (pinned)"
                                                    : "landing → the Update's input into a grad ring slot (pinned)")
                    : l.layer_major ? "landing → += the fp32 sum of the unit's micro batches, one after another (host)"
                    : l.fp32_sum ? "landing → += the fp32 sum of micro batches (host)"
                    : l.mixed    ? "landing → the Update's 16-bit input (host)"
                                 : "landing → the Update's fp32 input (host)");
    b.edge(bwd, gradout, "device gradient", Handoff::event,
           "recorded on compute at grads_done; d2h waits (enqueued by the Reduce worker before its GradOut)");
    b.edge(gradout, reduce, "grad landing (pinned)", Handoff::host_wait, "one event per bucket, waited on by the Reduce worker");
    b.edge(reduce, gradout, "grad landing, reuse", Handoff::enqueued_after,
           "the next copy into it is enqueued after it is read (through_landing)", "bucket + landing buffers");
    b.edge(gradout, bwd, "device gradient (or gradient slot), reuse", Handoff::host_wait,
           "d2h synchronized by the Reduce worker, then the slot freed; grads(u) waits for a free slot",
           "next micro batch");
  }

  // ---- the barrier ----
  const int norm = b.node("Norm", Resource::trainer, "the global gradient norm, overflow and clip: the step's decision");
  if (reduce >= 0) {
    b.edge(reduce, norm, "host gradient", Handoff::host_wait, "the Reduce worker drained at step()");
  } else {
    b.edge(gradout, norm, "device gradient (16-bit or fp32 sum)", Handoff::host_wait,
           "the Reduce worker drained (it synchronized d2h) at step()");
  }

  // ---- the Update: SwapIn, Update, Upload or the home's write, SwapOut, landing ----
  const int update = b.node(
      "Update(g)", update_on,
      device_update ? "the device's fused Adam on sub-group g, writing the new compute copy in place (or into its home)"
                    : "cpu_adam's fused pass on sub-group g: unscale, clip, Adam, the new compute copy");
  b.edge(norm, update, "the decision", device_update ? Handoff::enqueued_after : Handoff::host_wait,
         device_update ? "the Update worker takes the decision's future, then enqueues the device's Update"
                       : "the decision's future (launch)");
  if (device_update)
    b.edge(gradout, update, "device gradient (16-bit or fp32 sum)", Handoff::stream_order,
           "the d2h queue: the Update is enqueued behind the rounding");
  else if (l.speculative)
    b.edge(reduce, update, l.streaming ? "grad ring slot (pinned)" : "host gradient", Handoff::version,
           "Unit::reduced under mu (the speculative Update's gate)");
  else
    b.edge(reduce, update, "host gradient", Handoff::host_wait, "the Reduce worker drained at step()");
  if (l.streaming) {  // gradient streaming (GradientStream, offload/gradient_stream.h)
    const int gw = b.node("GradWrite(u)", Resource::nvme_gradient, "unit u's gradient, its ring slot → NVMe");
    const int gr = b.node("GradRead(u)", Resource::nvme_gradient,
                          l.speculative ? "unit u's gradient, NVMe → a ring slot, for a sub-group the speculation did not update"
                                        : "unit u's gradient, NVMe → a ring slot, for the Update after the barrier");
    b.edge(reduce, gw, "grad ring slot (pinned)", Handoff::enqueued_after,
           "the Reduce worker fills the slot, then issues the write (GradientStream::written)");
    b.edge(gw, reduce, "grad ring slot, reuse", Handoff::host_wait,
           "the write's handle, waited on by the Reduce worker before it sets Unit::reduced", "the slot's next unit");
    b.edge(gw, gr, "NVMe gradient", Handoff::host_wait,
           "the Reduce worker waited for the write; the barrier drains it before any read back");
    b.edge(gr, update, "grad ring slot (read back)", Handoff::host_wait,
           "the read's handle, waited on by the update worker (GradientStream::input)");
    b.edge(update, gr, "grad ring slot (read back), reuse", Handoff::enqueued_after,
           "the update worker reads the next unit back after its Update of this one", "u + 1");
    b.edge(update, reduce, "grad ring slot, reuse", Handoff::version,
           "the slot's holder cleared under mu when the speculation is done with its unit or stops (slot 0 read "
           "back: the next step's backward follows every landing); the Reduce waits for a free one",
           "the slot's next unit");
  }
  int swap_in = -1, swap_out = -1;
  if (l.optimizer == OffloadDevice::nvme) {
    swap_in = b.node("SwapIn(g)", Resource::nvme_optimizer, "master | m | v of sub-group g, NVMe → a swapper buffer");
    swap_out = b.node("SwapOut(g)", Resource::nvme_optimizer, "master | m | v of sub-group g, the buffer → NVMe");
    b.edge(swap_in, update, "optimizer swap buffer (pinned)", Handoff::host_wait, "the swapper's read handle");
    b.edge(update, swap_out, "optimizer swap buffer", Handoff::enqueued_after, "written after the Update (the swapper)");
    b.edge(swap_out, swap_in, "optimizer swap buffer, reuse", Handoff::host_wait, "the write's handle, before the next read",
           "g + buffer_count");
  }
  const int land = b.node("Land(u)", Resource::update_worker,
                          "unit u's last sub-group is home: version[u] = applied (units in order)");
  // Units whose compute copy lives on the device (resident, or a stage-3 shard there): the host
  // Update's new copy travels through the upload slots.
  bool on_device = l.param == OffloadDevice::none;
  for (const UnitLayout& u : l.units) on_device = on_device || !u.windowed;
  int upload = -1, write = -1;
  if (l.param == OffloadDevice::nvme)
    write = b.node("Param write(g)", Resource::nvme_param, "the new compute copy of sub-group g → its NVMe home");
  if (on_device && !device_update)
    upload = b.node("Upload(g)", Resource::h2d,
                    std::string("the new compute copy of sub-group g, pinned upload slot → the device") +
                        (l.windows ? " (the units it lives on)" : "") +
                        (l.fp32_work ? "; at the unit's end its fp32 working weights" : "") +
                        (l.shard_states ? "; the ranks' parts gathered" : ""));
  if (device_update) {
    b.edge(update, land, "what the device's Update wrote", Handoff::host_wait,
           "one event per sub-group on the device Update stream; the unit's last waited on before it lands");
    if (write >= 0)
      b.edge(update, write, "upload slot (pinned)", Handoff::host_wait, "the sub-group's event, waited on in land_chunk");
    if (l.fp32_work && on_device) {  // the resident units' fp32 working weights, from the new copy at the landing
      const int work = b.node("Working weights(u)", Resource::h2d,
                              "a resident unit's fp32 working weights from its new compute copy (land_unit)");
      b.edge(update, work, "resident compute copy", Handoff::host_wait, "the unit's last sub-group event, then land_unit");
      b.edge(work, fwd, "fp32 working weights", Handoff::event, "unit.landed: recorded on h2d; compute waits (weights(u))",
             "next step");
      b.edge(work, update, "resident compute copy, rewrite", Handoff::event,
             "unit.landed: the device Update stream waits it (update_target)", "next step's Update");
    }
  } else {
    b.edge(update, land, "the unit's sub-groups", Handoff::stream_order, "the Update worker: updated, then landed");
    if (write >= 0)
      b.edge(update, write, "upload slot (pinned)", Handoff::enqueued_after, "written after the Update (land_chunk)");
  }
  if (write >= 0) {
    b.edge(write, land, "NVMe home", Handoff::host_wait, "the write's handle, before the unit lands");
    b.edge(write, update, "upload slot, reuse", Handoff::host_wait, "the write's handle", "g + 2");
  }
  if (upload >= 0) {
    b.edge(update, upload, "upload slot (pinned)", Handoff::enqueued_after, "enqueued after the Update (land_chunk)");
    b.edge(upload, update, "upload slot, reuse", Handoff::host_wait, "the slot's copied event (UploadSlots)", "g + 2");
    b.edge(upload, fwd, "resident compute copy", Handoff::event,
           "unit.landed: recorded on h2d behind the unit's Uploads; compute waits (weights(u))", "next step");
    if (l.windows && l.param == OffloadDevice::none)  // stage 3: the windowed units' shards live on the device
      b.edge(upload, fetch, "device shard", Handoff::stream_order, "the h2d stream: the gather follows the Upload",
             "next step");
  }

  // The next step's use of the new compute copy.
  b.edge(land, fwd, "resident compute copy", Handoff::version, "version[u] = applied under mu (weights(u) waits)",
         "next step");
  if (l.windows) {
    b.edge(land, fetch, "param home", Handoff::version, "version[u] = applied under mu; the Fetch waits (wait_landed)",
           "next step");
    b.edge(fetch, update, "param home, rewrite", Handoff::host_wait,
           "unit.fetched (h2d), waited on before the Update rewrites the home", "next step's Update");
  }
  if (device_update)
    b.edge(fwd, update, "resident compute copy, rewrite", Handoff::event,
           "the device Update's stream waits compute's event (recorded at every grads_done)", "this step's Update");

  // ---- activation checkpoints in host memory (cpu_checkpointing) ----
  if (host_ckpt) {
    const int out = b.node("Checkpoint out(j)", Resource::d2h, "block j's checkpointed input, device slot → pinned host row");
    const int in = b.node("Checkpoint in(j)", Resource::h2d, "block j's checkpoint, pinned host row → device slot (one block ahead)");
    b.outside(fwd, out, "checkpoint slot", Handoff::event, "`written`: recorded on compute behind the write; d2h waits");
    b.outside(out, fwd, "checkpoint slot, reuse", Handoff::event, "on_host[j]: recorded on d2h; compute waits", "checkpoint j + 2");
    b.outside(out, in, "checkpoint host row", Handoff::event, "on_host[j]; h2d waits");
    b.outside(in, bwd, "checkpoint slot", Handoff::event, "on_device[j]: recorded on h2d; compute waits (acquire)");
    b.outside(bwd, in, "checkpoint slot, reuse", Handoff::event, "released: recorded on compute after the block's backward; h2d waits",
           "checkpoint j + 2");
  }
  return b.g;
}

std::vector<std::string> check_handoffs(const StepGraph& g) {
  std::vector<std::string> bad;
  for (const auto& e : g.edges) {
    const DataflowNode& a = g.nodes[static_cast<std::size_t>(e.from)];
    const DataflowNode& c = g.nodes[static_cast<std::size_t>(e.to)];
    const bool same_queue = queue_of(a.resource) == queue_of(c.resource);
    std::string why;
    switch (e.handoff) {
      case Handoff::none: why = same_queue ? "" : "nothing orders it"; break;
      case Handoff::stream_order:
        if (!same_queue) why = "stream order across two queues";
        break;
      case Handoff::event:
        if (!is_stream(a.resource) || !is_stream(c.resource)) why = "an event between a host thread and a stream";
        break;
      case Handoff::host_wait: break;  // the consumer's thread waits, then runs or enqueues the consumer
      case Handoff::enqueued_after:
      case Handoff::version:
        // The host thread has finished its own work when it enqueues or sets the version, but a stream's
        // work is not finished when a host thread moves on.
        if (is_stream(a.resource) && !same_queue) why = std::string(handoff_name(e.handoff)) + " behind a stream's work";
        break;
    }
    if (!why.empty())
      bad.push_back(a.name + " (" + resource_name(a.resource) + ") -> " + c.name + " (" + resource_name(c.resource) +
                    "), " + e.buffer + ": " + why);
  }
  return bad;
}

std::string to_text(const StepGraph& g) {
  std::ostringstream o;
  o << "step dataflow: " << g.placement << "\n\nsupernodes (resource: what it does)\n";
  for (const auto& n : g.nodes) o << "  " << n.name << "  [" << resource_name(n.resource) << "]  " << n.does << "\n";
  o << "\nedges (buffer: handoff, by what)\n";
  for (const auto& e : g.edges) {
    const auto& a = g.nodes[static_cast<std::size_t>(e.from)];
    const auto& c = g.nodes[static_cast<std::size_t>(e.to)];
    o << "  " << a.name << " -> " << c.name << (e.when.empty() ? "" : " (" + e.when + ")") << "  " << e.buffer << ": "
      << handoff_name(e.handoff) << ", " << e.by << "\n";
  }
  return o.str();
}

std::string to_dot(const StepGraph& g) {
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') q += '\\';
      q += ch;
    }
    return q + "\"";
  };
  std::ostringstream o;
  o << "digraph step {\n  label=" << quote(g.placement) << ";\n  rankdir=LR;\n  node [shape=box];\n";
  // One cluster per resource: its nodes run in one queue's order.
  for (int r = 0; r <= static_cast<int>(Resource::nvme_gradient); ++r) {
    bool any = false;
    for (const auto& n : g.nodes) any = any || static_cast<int>(n.resource) == r;
    if (!any) continue;
    o << "  subgraph cluster_" << r << " {\n    label=" << quote(resource_name(static_cast<Resource>(r))) << ";\n";
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      if (static_cast<int>(g.nodes[i].resource) == r) o << "    n" << i << " [label=" << quote(g.nodes[i].name) << "];\n";
    o << "  }\n";
  }
  for (const auto& e : g.edges) {
    const std::string label = std::string(handoff_name(e.handoff)) + (e.when.empty() ? "" : " (" + e.when + ")");
    o << "  n" << e.from << " -> n" << e.to << " [label=" << quote(label)
      << (e.when.empty() ? "" : ", style=dashed") << "];\n";
  }
  o << "}\n";
  return o.str();
}

}  // namespace zinf::offload
