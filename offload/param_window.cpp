// param_window.cpp — Fetch and the parameter window (param_window.h).
#include "param_window.h"

namespace zinf::offload::detail {

ParamWindow::ParamWindow(EngineState& s, ParamHome& home) : state_(s), home_(home) {
  // The handoffs of the step graph the window makes: slot.ready (h2d → compute), slot.released
  // (compute → h2d), the landing version a Fetch waits for, and unit.fetched, which the Update
  // waits for before it rewrites the home.
  for (const char* use : {"Forward(u)", "Backward(u)"}) {
    s.claim("Fetch(u)", use, Handoff::event);
    s.claim(use, "Fetch(u)", Handoff::event);
  }
  s.claim("Land(u)", "Fetch(u)", Handoff::version);
  s.claim("Fetch(u)", "Update(g)", Handoff::host_wait);
  const BufferSpec& param = s.spec(Buffer::param_slot, kShared, Tier::device);
  const BufferSpec* work = s.find(Buffer::work_slot);
  const BufferSpec* staging = s.find(Buffer::param_staging);
  for (std::uint64_t i = 0; i < param.count; ++i) {
    Slot slot;
    slot.param = DeviceBuffer(s.dev, param.bytes, "param window slot " + std::to_string(i));
    slot.weights = slot.param.as<void>();
    if (work) {  // 16-bit runs with fp32 working weights: the model reads these
      slot.work = DeviceBuffer(s.dev, work->bytes, "fp32 working weights slot " + std::to_string(i));
      slot.weights = slot.work.as<void>();
    }
    if (staging) slot.staging = s.pinned->acquire(staging->bytes);
    slots_.push_back(std::move(slot));
  }
}

int ParamWindow::find(std::size_t u) {
  std::lock_guard<std::mutex> lk(state_.mu);
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].unit == static_cast<int>(u) && slots_[i].version == state_.units[u].version)
      return static_cast<int>(i);
  return -1;
}

// Fetch(u): starts bringing unit u into the least recently used free slot; returns the slot, or −1
// when every slot is in use.
int ParamWindow::fetch(std::size_t u) {
  int best = -1;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].users > 0) continue;
    if (best < 0 || slots_[i].last_use < slots_[static_cast<std::size_t>(best)].last_use) best = static_cast<int>(i);
  }
  if (best < 0) return -1;
  Slot& slot = slots_[static_cast<std::size_t>(best)];
  if (slot.ready) slot.ready->wait();  // a previous fetch into this slot must be finished
  // The model may still be reading the slot's previous unit: the h2d stream waits for the compute
  // stream's event recorded at release() before it overwrites the slot.
  if (slot.released) state_.dev.wait_event(StreamRole::h2d, slot.released);
  Unit& unit = state_.units[u];
  slot.unit = static_cast<int>(u);
  {
    std::lock_guard<std::mutex> lk(state_.mu);
    slot.version = unit.version;
  }
  slot.last_use = ++tick_;
  {
    BusyScope busy(state_.dev, StreamRole::h2d, {"Fetch", static_cast<std::int64_t>(u)});  // home → device
    home_.fetch_into(unit, slot.param.as<void>(), slot.staging);
    if (slot.work.size())  // the fp32 working weights follow the fetched 16-bit copy
      state_.kern->from_half(slot.param.as<void>(), slot.work.as<float>(), unit.n, state_.half, StreamRole::h2d);
  }
  slot.ready = state_.dev.record(StreamRole::h2d);
  unit.fetched = slot.ready;
  if (state_.stages.fetch_done == StagePlan::FetchDone::synchronous) slot.ready->wait();
  return best;
}

// The units StagePlan::prefetch lists for u in the pass's direction (none without overlap), nearest first.
void ParamWindow::prefetch_after(std::size_t u, bool backward) {
  for (const std::size_t v : state_.stages.prefetch[backward ? 1 : 0][u]) {
    {
      std::unique_lock<std::mutex> lk(state_.mu);
      // Partitioned parameters: every rank must gather the same units in the same order, so the
      // prefetch waits for the landing (the Update worker sets version[v] = applied under mu once
      // v's shard is home; that is what hands the shard to this thread's gather) instead of
      // depending on its timing.
      if (state_.stages.prefetch_wait == StagePlan::PrefetchWait::wait_landing)
        state_.cv.wait(lk, [&] { return state_.units[v].version == state_.applied || state_.update_failed; });
      if (state_.units[v].version != state_.applied) break;  // its update has not landed yet: fetch on demand
    }
    // Only now is the window asked whether it holds v: before v lands, find() compares slots with
    // v's previous version, so a slot with the stale copy would count as current. Asked first, one
    // rank whose Update had not reached v yet skipped v and gathered v+1 before it, while another
    // rank, whose Update was a unit ahead, gathered v first — equal-sized blocks then swapped
    // parameters between the two gathers without any error.
    if (find(v) >= 0) continue;
    if (fetch(v) < 0) break;
  }
}

const void* ParamWindow::acquire(std::size_t u, bool backward) {
  int i = find(u);
  if (i < 0) i = fetch(u);
  if (i < 0) throw Error("offload: no free parameter window slot for unit " + std::to_string(u));
  Slot& slot = slots_[static_cast<std::size_t>(i)];
  model_waits_for(state_.dev, slot.ready);  // the model reads the slot after the Fetch's copies
  ++slot.users;
  slot.last_use = ++tick_;
  prefetch_after(u, backward);
  return slot.weights;
}

void ParamWindow::release(std::size_t u) {
  const int i = find(u);
  if (i < 0) return;
  Slot& slot = slots_[static_cast<std::size_t>(i)];
  if (slot.users > 0 && --slot.users == 0)
    slot.released = state_.dev.record(StreamRole::compute);  // behind the model's last read
}

}  // namespace zinf::offload::detail
