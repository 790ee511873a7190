// dataflow_test.cpp — the step as data (zinf/offload/dataflow.h): for every placement, every edge
// between two queues has a handoff that orders it (the ordering contract of engine.h, walked), the
// graph has exactly the supernodes its placement needs, and the checker rejects a graph whose
// handoff is taken away or is the wrong kind.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "zinf/offload/buffer_specs.h"
#include "zinf/offload/dataflow.h"

namespace zinf::offload {
namespace {

PlanInput base() {
  PlanInput in;
  in.unit_params = {4096, 200000, 90000, 140000, 2048};
  in.persistent = {true, false, false, false, true};
  in.sub_group_size = 32768;
  in.reduce_bucket_size = 40960;
  return in;
}

struct Case {
  PlanInput in;
  std::string name;
};

// Every placement the engine runs: optimizer and parameters on each tier, each precision with the
// reference and the fast kernels, one and three ranks at each ZeRO stage, accumulation 1 and 2, both
// overlap modes, gradients summed on the device, the speculative Update, activation checkpoints in
// host memory, gradient streaming.
std::vector<Case> every_placement() {
  std::vector<Case> out;
  for (auto opt : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
    for (auto param : {OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme})
      for (Precision prec : {Precision::fp32, Precision::bf16})
        for (bool fp32_work : {false, true})
          for (int world : {1, 3})
            for (int stage : {0, 1, 2, 3})
              for (std::int64_t ga : {1, 2})
                for (Overlap ov : {Overlap::exact, Overlap::none})
                  for (int extra = 0; extra < 5; ++extra) {
                    if (world == 1 && stage > 0) continue;
                    // gradient streaming, where it applies (the optimizer on NVMe, exact; several
                    // ranks at GA 1, with the optimizer off the device from stage 1)
                    if (extra >= 3 && (opt != OffloadDevice::nvme || ov != Overlap::exact)) continue;
                    if (extra >= 3 && world > 1 && (ga > 1 || stage == 0)) continue;
                    PlanInput in = base();
                    in.optimizer = opt, in.param = param, in.precision = prec, in.fp32_work = fp32_work;
                    in.world = world, in.rank = world - 1, in.stage = stage, in.grad_accum = ga, in.overlap = ov;
                    in.device_grad_accum = extra == 1;
                    in.speculative = extra == 2 || extra == 4;
                    in.gradient_streaming = extra >= 3;  // with and without the speculative Update
                    if (extra >= 3) in.device_grad_accum = ga > 1;
                    in.checkpoint_pinned = extra == 2 ? 1 << 20 : 0;
                    out.push_back({in, std::string(to_string(opt)) + "/" + std::string(to_string(param)) + " " +
                                           std::string(to_string(prec)) + (fp32_work ? " work" : "") + " world " +
                                           std::to_string(world) + " stage " + std::to_string(stage) + " ga " +
                                           std::to_string(ga) + (ov == Overlap::exact ? " exact" : " none") +
                                           " extra " + std::to_string(extra)});
                  }
  return out;
}

std::set<std::string> names(const StepGraph& g) {
  std::set<std::string> s;
  for (const auto& n : g.nodes) s.insert(n.name);
  return s;
}

TEST(Dataflow, EveryEdgeBetweenTwoQueuesHasAHandoffInEveryPlacement) {
  int graphs = 0, crossing = 0;
  for (const Case& c : every_placement()) {
    SCOPED_TRACE(c.name);
    const StepGraph g = step_graph(make_layout(c.in));
    const auto bad = check_handoffs(g);
    EXPECT_TRUE(bad.empty()) << bad.front();
    for (const auto& e : g.edges) {
      ASSERT_GE(e.from, 0);
      ASSERT_GE(e.to, 0);
      ASSERT_LT(static_cast<std::size_t>(e.from), g.nodes.size());
      ASSERT_LT(static_cast<std::size_t>(e.to), g.nodes.size());
      const bool across = queue_of(g.nodes[static_cast<std::size_t>(e.from)].resource) !=
                          queue_of(g.nodes[static_cast<std::size_t>(e.to)].resource);
      crossing += across;
      if (across) {
        EXPECT_NE(e.handoff, Handoff::none);
        EXPECT_NE(e.handoff, Handoff::stream_order);
        EXPECT_FALSE(e.by.empty()) << "a handoff without a name in the code";
      }
    }
    // Every node is reached or reaches something: no supernode stands outside the step.
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      EXPECT_TRUE(std::any_of(g.edges.begin(), g.edges.end(),
                              [&](const DataflowEdge& e) {
                                return e.from == static_cast<int>(i) || e.to == static_cast<int>(i);
                              }))
          << g.nodes[i].name;
    ++graphs;
  }
  // + streaming (optimizer nvme, exact): one rank at GA 1 and 2, three ranks at stages 1 to 3 at GA 1
  EXPECT_EQ(graphs, 3 * 3 * 2 * 2 * (1 + 4) * 2 * 2 * 3 + 2 * 3 * 2 * 2 * 2 + 2 * 3 * 2 * 2 * 3);
  EXPECT_GT(crossing, 0);
}

// The supernodes follow the placement: nothing is drawn that the placement does not run.
TEST(Dataflow, SupernodesFollowThePlacement) {
  PlanInput in = base();
  auto graph = [&] { return names(step_graph(make_layout(in))); };
  std::set<std::string> g = graph();  // everything on the device
  EXPECT_TRUE(g.count("GradOut(u)") && g.count("Update(g)") && g.count("Land(u)"));
  EXPECT_FALSE(g.count("Fetch(u)") || g.count("Reduce(u)") || g.count("SwapIn(g)") || g.count("Upload(g)"));
  EXPECT_EQ(step_graph(make_layout(in)).nodes[static_cast<std::size_t>(step_graph(make_layout(in)).find("Update(g)"))]
                .resource,
            Resource::device_update);
  in.optimizer = OffloadDevice::cpu;
  g = graph();
  EXPECT_TRUE(g.count("Reduce(u)") && g.count("Upload(g)"));
  EXPECT_FALSE(g.count("SwapIn(g)"));
  in.optimizer = OffloadDevice::nvme;
  in.param = OffloadDevice::nvme;
  g = graph();
  EXPECT_TRUE(g.count("SwapIn(g)") && g.count("SwapOut(g)") && g.count("Fetch(u)") && g.count("Fetch read(u)") &&
              g.count("Param write(g)"));
  EXPECT_TRUE(g.count("Upload(g)"));  // the persistent units stay on the device: their copy is uploaded
  in.persistent = {false, false, false, false, false};
  g = graph();
  EXPECT_FALSE(g.count("Upload(g)"));  // every unit's copy lives on NVMe
  EXPECT_FALSE(g.count("Checkpoint out(j)"));
  in.checkpoint_pinned = 1 << 20;
  g = graph();
  EXPECT_TRUE(g.count("Checkpoint out(j)") && g.count("Checkpoint in(j)"));
  // The device's Update runs in the d2h stream's queue, on the stream the engine names for it.
  EXPECT_EQ(queue_of(Resource::device_update), Resource::d2h);
  EXPECT_EQ(stream_of(Resource::device_update), kDeviceUpdateStream);
}

// The checker can fail: a graph with one handoff taken away, or replaced by stream order across two
// queues, or an event with a host thread at one end, is rejected — naming the edge.
TEST(Dataflow, AGraphWithAMissingHandoffIsRejected) {
  int removed = 0;
  for (const Case& c : every_placement()) {
    if (c.in.world != 1 || c.in.grad_accum != 2) continue;  // enough placements, quickly
    const StepGraph g = step_graph(make_layout(c.in));
    for (std::size_t i = 0; i < g.edges.size(); ++i) {
      const DataflowEdge& e = g.edges[i];
      const Resource a = g.nodes[static_cast<std::size_t>(e.from)].resource;
      const Resource b = g.nodes[static_cast<std::size_t>(e.to)].resource;
      if (queue_of(a) == queue_of(b)) continue;
      SCOPED_TRACE(c.name + ": " + g.nodes[static_cast<std::size_t>(e.from)].name + " -> " +
                   g.nodes[static_cast<std::size_t>(e.to)].name);
      for (Handoff h : {Handoff::none, Handoff::stream_order}) {
        StepGraph broken = g;
        broken.edges[i].handoff = h;
        const auto bad = check_handoffs(broken);
        ASSERT_EQ(bad.size(), 1u);
        EXPECT_NE(bad[0].find(g.nodes[static_cast<std::size_t>(e.from)].name), std::string::npos) << bad[0];
        EXPECT_NE(bad[0].find(e.buffer), std::string::npos) << bad[0];
      }
      if (is_stream(a) != is_stream(b)) {  // an event cannot hand over between a host thread and a stream
        StepGraph broken = g;
        broken.edges[i].handoff = Handoff::event;
        EXPECT_EQ(check_handoffs(broken).size(), 1u);
      }
      if (is_stream(a)) {  // nor can a host-side flag or enqueue order behind a stream's work
        StepGraph broken = g;
        broken.edges[i].handoff = Handoff::version;
        EXPECT_EQ(check_handoffs(broken).size(), 1u);
      }
      ++removed;
    }
  }
  EXPECT_GT(removed, 100);
}

// The printed forms: every supernode with its resource, every edge with its handoff; dot is a digraph
// with one cluster per resource.
TEST(Dataflow, TextAndDotNameEverySupernodeAndHandoff) {
  PlanInput in = base();
  in.optimizer = OffloadDevice::nvme;
  in.param = OffloadDevice::cpu;
  const StepGraph g = step_graph(make_layout(in));
  const std::string text = to_text(g), dot = to_dot(g);
  for (const auto& n : g.nodes) {
    EXPECT_NE(text.find(n.name + "  [" + resource_name(n.resource) + "]"), std::string::npos) << n.name;
    EXPECT_NE(dot.find("label=\"" + n.name + "\""), std::string::npos) << n.name;
  }
  EXPECT_NE(text.find("offload_optimizer nvme, offload_param cpu"), std::string::npos);
  EXPECT_EQ(dot.rfind("digraph step {", 0), 0u);
  EXPECT_NE(dot.find("subgraph cluster_"), std::string::npos);
  std::size_t arrows = 0;
  for (std::size_t p = dot.find(" -> "); p != std::string::npos; p = dot.find(" -> ", p + 1)) ++arrows;
  EXPECT_EQ(arrows, g.edges.size());
}

}  // namespace
}  // namespace zinf::offload
