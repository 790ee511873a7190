// update_pipeline.cpp — the update pipeline: SwapIn, Update, Upload, SwapOut (update_pipeline.h).
#include "update_pipeline.h"

namespace zinf::offload::detail {

UpdatePipeline::UpdatePipeline(EngineState& s, OptimizerStates& states, ParamHome& resident, ParamHome* offloaded,
                               GradientPath& grads)
    : state_(s),
      states_(states),
      resident_(resident),
      offloaded_(offloaded),
      grads_(grads),
      jitter_(s.dev.jitter(), 12) {
  worker_ = std::make_unique<SerialWorker>([this] { jitter_.delay(); }, [this] { state_.dev.bind_thread(); });
}

UpdatePipeline::~UpdatePipeline() {
  decide(std::nullopt);  // a walk started for a step that never came finishes unchanged
  try {
    worker_->drain();
  } catch (...) {
  }
}

void UpdatePipeline::push(std::function<void()> job) {
  worker_->push([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lk(state_.mu);
        state_.update_failed = true;
      }
      state_.cv.notify_all();
      throw;
    }
  });
}

void UpdatePipeline::start_early() {
  decision_ = std::make_unique<std::promise<Decision>>();
  auto fut = decision_->get_future().share();
  push([this, fut] { run(fut); });  // SwapIn of the first sub-groups starts now
}

void UpdatePipeline::decide(Decision d) {
  if (decision_) {
    decision_->set_value(d);
    decision_.reset();
  }
}

void UpdatePipeline::launch(const cpu_adam::AdamStep& st) {
  if (decision_) return decide(st);
  std::promise<Decision> p;
  p.set_value(st);
  auto fut = p.get_future().share();
  if (state_.exact())
    push([this, fut] { run(fut); });
  else
    run(fut);
}

void UpdatePipeline::drain() { worker_->drain(); }
void UpdatePipeline::check() { worker_->check(); }

void UpdatePipeline::run(const std::shared_future<Decision>& d) {
  int k = 0;             // alternates the two upload slots
  std::size_t next = 0;  // units land in order, each once its sub-groups (possibly none: an empty shard) are home
  auto land_through = [&](std::size_t ui) {
    while (next <= ui) land(next++);
  };
  states_.update_walk(d, [&](std::size_t ui, std::size_t o, std::size_t len, float* master, float* m, float* v,
                             const cpu_adam::AdamStep& st) {
    Unit& u = state_.units[ui];
    ParamHome& home = home_of(u);
    const int slot = k++ % 2;
    void* out = home.update_target(u, o, slot);
    const auto t0 = Clock::now();
    update_chunk(u, o, len, master, m, v, st, out);
    state_.add_time(&BusyTimes::host, since(t0));
    home.land_chunk(u, o, len, slot);  // Upload
    if (o + len == u.state_range.hi) land_through(ui);
  });
  if (d.get() && !state_.units.empty()) land_through(state_.units.size() - 1);
}

void UpdatePipeline::update_chunk(Unit& u, std::size_t o, std::size_t len, float* master, float* m, float* v,
                                  const cpu_adam::AdamStep& st, void* param_out) {
  auto [g, type] = grads_.update_input(u);
  cpu_adam::UpdateChunk ch;
  ch.n = len;
  ch.grad = static_cast<const char*>(g) + (o - u.grad_range.lo) * (type == cpu_adam::GradType::fp32 ? 4 : 2);
  ch.grad_type = type;
  ch.master = master;
  ch.m = m;
  ch.v = v;
  ch.param16 = state_.mixed ? param_out : nullptr;
  ch.param16_type = state_.half;
  if (!state_.optimizer_offloaded) {  // the states live on the device: the device's fused Update
    state_.kern->adam_update(st, ch, StreamRole::d2h);
    if (!state_.mixed && param_out != master) state_.kern->copy(param_out, master, len * 4, StreamRole::d2h);
    state_.dev.synchronize(StreamRole::d2h);
    return;
  }
  cpu_adam::adam_update(state_.threads, st, ch);
  if (!state_.mixed && param_out != master) std::memcpy(param_out, master, len * 4);
}

void UpdatePipeline::land(std::size_t ui) {
  Unit& u = state_.units[ui];
  home_of(u).land_unit(u);
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    u.version = state_.applied;
  }
  state_.cv.notify_all();
}

}  // namespace zinf::offload::detail
