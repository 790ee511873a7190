// param_homes.cpp — where each unit's compute copy (param16, or fp32 in fp32 runs) lives:
//   DeviceHome  resident on the device: every unit without offload_param, and the persistent units
//               (embedding, final LayerNorm) with it; 16-bit runs add fp32 working weights
//   PinnedHome  pinned host memory (offload_param cpu): the Update writes it in place, Fetch copies
//               from it
//   NvmeHome    a store tensor per unit (offload_param nvme): the Update's chunks go home through
//               an upload slot, Fetch reads them into a window slot's pinned staging first
// Upload — the new compute copy going home after the Update — is land_chunk() of each.
//
// Several ranks: a home holds param_range of its unit — the whole unit, or this rank's shard under
// ZeRO stage 3 (windowed units; a stage-3 run without offload_param keeps the shards in a DeviceHome
// of its own). A whole resident unit whose optimizer states are partitioned gathers every rank's
// updated part when it lands; a sharded home gathers the shards at Fetch, on the trainer's thread.
#include <algorithm>
#include <cstring>

#include "tiers.h"

namespace zinf::offload::detail {
namespace {

// The compute copy on the device: the resident units, and stage-3 shards of the windowed ones. How
// the Update's new copy gets there is its subclass's (chosen once, by the optimizer's tier):
// UploadedHome (the host's Update writes a pinned upload slot, copied up on h2d) or InPlaceHome (the
// device's Update writes it in place).
class DeviceHome : public ParamHome {
 public:
  DeviceHome(EngineState& s, UploadSlots& up) : state_(s), up_(up) {}
  void place(Unit& u, const std::string& name, const float* master) override {
    u.param = DeviceBuffer(state_.dev, state_.spec(Buffer::param, u.index, Tier::device).bytes,
                           name + state_.format->param_name());
    u.weights = u.param.as<void>();
    if (const BufferSpec* work = state_.find(Buffer::work, u.index)) {  // the model reads these instead
      u.work = DeviceBuffer(state_.dev, work->bytes, name + " fp32 working weights");
      u.weights = u.work.as<void>();
    }
    rebuild(u, master);
  }
  void rebuild(Unit& u, const float* master) override {
    // On the host, then up, a piece at a time: the host copy stays a few MiB whatever the unit.
    const std::size_t n = u.param_range.len(), cb = state_.layout.compute_bytes;
    const std::size_t piece = std::min<std::size_t>(n, std::size_t{1} << 22);
    std::vector<char> copy(piece * cb);
    for (std::size_t o = 0; o < n; o += piece) {
      const std::size_t len = std::min(piece, n - o);
      state_.to_compute(master + u.param_range.lo + o, copy.data(), len);
      state_.h2d_sync(static_cast<char*>(u.param.as<void>()) + o * cb, copy.data(), len * cb);
    }
    if (u.work.size())  // a resident 16-bit unit's fp32 working weights
      state_.kern->from_half(u.param.as<void>(), u.work.as<float>(), u.n, state_.half, StreamRole::h2d);
    state_.dev.synchronize(StreamRole::h2d);
  }
  // The unit's landing as StagePlan::landing resolved it.
  void land_unit(Unit& u) override {
    const StagePlan::Landing how = state_.stages.landing[u.index];
    if (how == StagePlan::Landing::in_stream) {
      // The whole unit is this rank's: its Uploads, then its fp32 working weights, are h2d work in
      // stream order, and the model's stream waits for the event behind them (weights()), so the
      // update worker goes on to the next unit while h2d finishes this one. The upload slots are
      // waited for where they are reused (update_target).
      follow_half(u);
      u.landed = state_.dev.record(StreamRole::h2d);
      return;
    }
    for (auto& e : up_.copied)
      if (e) e->wait();
    switch (how) {
      case StagePlan::Landing::in_stream:
      case StagePlan::Landing::shard: return;  // a shard: gathered at Fetch
      case StagePlan::Landing::gather_by_trainer:
        // The trainer gathers this unit at its first use (finish_landing), in its order of use.
        u.gather_pending = true;
        state_.dev.synchronize(StreamRole::h2d);
        return;
      case StagePlan::Landing::gather_here: {  // every rank updated its part: gather the new compute copy
        Comm& c = *state_.update_dcomm;        // a host transport: on this (the Update worker's) thread
        BusyScope busy(state_.dev, StreamRole::h2d, {"Gather", static_cast<std::int64_t>(u.index)});
        on_stream(c, state_.dev, StreamRole::h2d, [&](void* st) {
          c.allgatherv(u.param.as<void>(), u.counts_in(0, u.n), state_.layout.compute_bytes, st);
        });
        break;
      }
    }
    follow_half(u);
    state_.dev.synchronize(StreamRole::h2d);
  }
  // The Uploads of the rebuilt chunks (h2d) are done; the working weights never followed the
  // speculative copy (only a landing does), so they are the old ones still.
  void restored(Unit&) override {
    for (auto& e : up_.copied)
      if (e) e->wait();
  }
  void finish_landing(Unit& u) override {
    if (!u.gather_pending) return;
    u.gather_pending = false;
    Comm& c = *state_.fetch_dcomm;  // the trainer's, beside its Fetch gathers
    {
      BusyScope busy(state_.dev, StreamRole::h2d, {"Gather", static_cast<std::int64_t>(u.index)});
      state_.order.run(c, state_.dev, StreamRole::h2d, [&](void* st) {
        c.allgatherv(u.param.as<void>(), u.counts_in(0, u.n), state_.layout.compute_bytes, st);
      });
    }
    follow_half(u);
  }
  void fetch_into(Unit& u, void* slot, PinnedBuffer&) override {  // stage-3 shards (the window's units only)
    Comm& c = *state_.fetch_dcomm;  // the shards of every rank, straight into the slot
    state_.order.run(c, state_.dev, StreamRole::h2d, [&](void* st) {
      c.allgatherv(u.param.as<void>(), slot, u.counts_in(0, u.n), state_.layout.compute_bytes, st);
    });
  }

 protected:
  char* home_of(Unit& u, std::size_t o) {
    return static_cast<char*>(u.param.as<void>()) + (o - u.param_range.lo) * state_.layout.compute_bytes;
  }
  void follow_half(Unit& u) {  // 16-bit runs: the fp32 working weights follow the new 16-bit copy (h2d)
    if (!u.work.size()) return;
    BusyScope busy(state_.dev, StreamRole::h2d, {"Upload", static_cast<std::int64_t>(u.index)});
    state_.kern->from_half(u.param.as<void>(), u.work.as<float>(), u.n, state_.half, StreamRole::h2d);
  }

  EngineState& state_;
  UploadSlots& up_;
};

// The host's Update: the new copy of a sub-group leaves the host through a pinned upload slot (h2d).
class UploadedHome final : public DeviceHome {
 public:
  UploadedHome(EngineState& s, UploadSlots& up) : DeviceHome(s, up) {
    if (!s.stages.device_home_claims) return;  // the Upload: the slot's copied event, unit.landed on h2d
    s.claim("Update(g)", "Upload(g)", Handoff::enqueued_after);
    s.claim("Upload(g)", "Update(g)", Handoff::host_wait);
    s.claim("Upload(g)", "Forward(u)", Handoff::event);
    if (s.stages.upload_to_fetch) s.claim("Upload(g)", "Fetch(u)", Handoff::stream_order);
  }
  void* update_target(Unit&, std::size_t, int slot) override {
    auto k = static_cast<std::size_t>(slot);
    if (up_.copied[k]) up_.copied[k]->wait();  // its previous Upload has left the slot
    return up_.buffer[k].data();
  }
  void land_chunk(Unit& u, std::size_t o, std::size_t len, int slot, const EventHandle&) override {
    auto k = static_cast<std::size_t>(slot);
    {  // Upload: pinned → device
      BusyScope busy(state_.dev, StreamRole::h2d, {"Upload", static_cast<std::int64_t>(u.index)});
      state_.dev.copy_to_device(home_of(u, o), up_.buffer[k].data(), len * state_.layout.compute_bytes, StreamRole::h2d);
    }
    up_.copied[k] = state_.dev.record(StreamRole::h2d);
  }
};

// The device's own Update (on kDeviceUpdateStream) rewrites the home in place. A Fetch gather that
// read it (on h2d with NCCL) is behind it already: the model's stream waited for that gather
// (slot.ready) before its reads, and the Update's stream waited for the model's event at every
// grads_done before this Update. The previous landing's fp32 working weights read it on h2d: the
// Update's stream waits for that landing's event itself (the model's wait for it in weights()
// orders it too, but only for a caller that asked for the unit's weights in this step).
class InPlaceHome final : public DeviceHome {
 public:
  InPlaceHome(EngineState& s, UploadSlots& up) : DeviceHome(s, up) {
    if (!s.stages.working_weights_claims) return;  // the working weights at the landing, unit.landed
    s.claim("Update(g)", "Working weights(u)", Handoff::host_wait);
    s.claim("Working weights(u)", "Forward(u)", Handoff::event);
    s.claim("Working weights(u)", "Update(g)", Handoff::event);
  }
  void* update_target(Unit& u, std::size_t o, int) override {
    if (u.landed) state_.dev.wait_event(kDeviceUpdateStream, u.landed);
    return home_of(u, o);
  }
  void land_chunk(Unit&, std::size_t, std::size_t, int, const EventHandle&) override {}  // written in place
};

class PinnedHome final : public ParamHome {
 public:
  explicit PinnedHome(EngineState& s) : state_(s) {}
  void place(Unit& u, const std::string&, const float* master) override {
    u.pinned_home = state_.pinned->acquire(state_.spec(Buffer::param, u.index, Tier::pinned).bytes);
    rebuild(u, master);
  }
  void rebuild(Unit& u, const float* master) override {
    state_.to_compute(master + u.param_range.lo, u.pinned_home.data(), u.param_range.len());
  }
  void* update_target(Unit& u, std::size_t o, int) override {
    if (u.fetched) u.fetched->wait();  // no Fetch may still be reading the home we overwrite
    return static_cast<char*>(u.pinned_home.data()) + (o - u.param_range.lo) * state_.layout.compute_bytes;
  }
  // Written in place; the device's Update, if it wrote it, is waited for before the unit lands.
  void land_chunk(Unit&, std::size_t, std::size_t, int, const EventHandle&) override {}
  void fetch_into(Unit& u, void* slot, PinnedBuffer& staging) override {
    const void* src = u.pinned_home.data();
    if (state_.stages.fetch == StagePlan::Fetch::gather) {  // every rank's shard into the staging buffer first
      state_.fetch_comm->allgatherv(u.pinned_home.data(), staging.data(), u.counts_in(0, u.n), state_.layout.compute_bytes);
      src = staging.data();
    }
    state_.dev.copy_to_device(slot, src, u.n * state_.layout.compute_bytes, StreamRole::h2d);
  }

 private:
  EngineState& state_;
};

class NvmeHome final : public ParamHome {
 public:
  NvmeHome(EngineState& s, UploadSlots& up) : state_(s), up_(up), store_(s.config.param_store) {
    // The home's write after the Update (waiting for the device Update's event first), waited on
    // before the unit lands and before its slot is rewritten; the Fetch's read into the staging.
    s.claim("Update(g)", "Param write(g)", s.stages.update_to_param_write);
    s.claim("Param write(g)", "Land(u)", Handoff::host_wait);
    s.claim("Param write(g)", "Update(g)", Handoff::host_wait);
    s.claim("Fetch read(u)", "Fetch(u)", Handoff::host_wait);
    s.claim("Fetch(u)", "Fetch read(u)", Handoff::host_wait);
  }
  void place(Unit& u, const std::string& name, const float* master) override {
    const std::uint64_t bytes = state_.spec(Buffer::param, u.index, Tier::nvme).bytes;
    if (!bytes) return;  // an empty shard: nothing on disk
    u.nvme_param = store_.add(name + ".param", bytes);
    rebuild(u, master);
  }
  void rebuild(Unit& u, const float* master) override {
    const std::size_t n = u.param_range.len(), bytes = n * state_.layout.compute_bytes;
    if (!n) return;
    PinnedPool pool(round_up(bytes, PinnedPool::kAlign), /*lock=*/false);  // pageable: used once
    PinnedBuffer b = pool.acquire(bytes);
    state_.to_compute(master + u.param_range.lo, b.data(), n);
    store_.write(u.nvme_param, b.data())->wait();
  }
  void* update_target(Unit& u, std::size_t, int slot) override {
    if (u.fetched) u.fetched->wait();  // no Fetch may still be reading the home we overwrite
    auto k = static_cast<std::size_t>(slot);
    if (up_.copied[k]) up_.copied[k]->wait();
    return up_.buffer[k].data();
  }
  void land_chunk(Unit& u, std::size_t o, std::size_t len, int slot, const EventHandle& written) override {
    // upload slot: written by the device's Update (d2h), read by the host's write to disk below.
    if (written) written->wait();
    // The slot is reused next: wait for the write (the swapper's sub-group reads keep the disk busy).
    const auto k = static_cast<std::size_t>(slot);
    store_
        .write(u.nvme_param, up_.buffer[k].data(), (o - u.param_range.lo) * state_.layout.compute_bytes,
               len * state_.layout.compute_bytes)
        ->wait();
    up_.copied[k] = nullptr;
  }
  void fetch_into(Unit& u, void* slot, PinnedBuffer& staging) override {
    const std::size_t cb = state_.layout.compute_bytes, bytes = u.n * cb;
    char* buf = static_cast<char*>(staging.data());
    const auto id = u.nvme_param;
    switch (state_.stages.fetch) {
      case StagePlan::Fetch::in_stream:
        // NVMe → pinned in h2d stream order, before the copy (its time is the store's, not the link's).
        state_.dev.launch(StreamRole::h2d, [this, buf, bytes, id] { store_.read(id, buf, 0, bytes)->wait(); });
        break;
      case StagePlan::Fetch::read_first:
        // Pageable staging (pin_memory false): a copy from it reads its source when it is made, not in
        // stream order (CUDA stages pageable memory at once), so the read is done here, before it.
        store_.read(id, buf, 0, bytes)->wait();
        break;
      case StagePlan::Fetch::gather:  // this rank's shard from disk into its place, then every other rank's
        if (u.param_range.hi > u.param_range.lo)
          store_.read(id, buf + u.param_range.lo * cb, 0, u.param_range.len() * cb)->wait();
        state_.fetch_comm->allgatherv(buf, u.counts_in(0, u.n), cb);
        break;
    }
    state_.dev.copy_to_device(slot, buf, bytes, StreamRole::h2d);
  }
  nvme::TensorStore* store() override { return &store_; }

 private:
  EngineState& state_;
  UploadSlots& up_;
  nvme::TensorStore store_;
};

}  // namespace

std::unique_ptr<ParamHome> make_device_home(EngineState& s, UploadSlots& up) {
  switch (s.stages.device_home) {
    case StagePlan::DeviceHome::uploaded: return std::make_unique<UploadedHome>(s, up);
    case StagePlan::DeviceHome::in_place: return std::make_unique<InPlaceHome>(s, up);
  }
  throw Error("offload: unknown device home");
}

std::unique_ptr<ParamHome> make_offload_home(EngineState& s, UploadSlots& up) {
  switch (s.stages.offload_home) {
    case StagePlan::OffloadHome::none: return nullptr;
    case StagePlan::OffloadHome::device: return make_device_home(s, up);
    case StagePlan::OffloadHome::pinned: return std::make_unique<PinnedHome>(s);
    case StagePlan::OffloadHome::nvme: return std::make_unique<NvmeHome>(s, up);
  }
  throw Error("offload: unknown parameter home");
}

}  // namespace zinf::offload::detail
