// optimizer_states.cpp — master, m and v of every unit, on the tier offload_optimizer names:
//   DeviceStates  device memory (offload_optimizer none); the Update is the device's own kernel
//   HostStates    host memory (cpu); the Update is cpu_adam on the host threads
//   NvmeStates    one store tensor per sub-group, laid out by SubGroupLayout (nvme); the Update
//                 streams them through the pipelined swapper: SwapIn ahead, SwapOut behind
// Each holds the states of state_range of every unit (this rank's shard under ZeRO stage ≥ 1 with
// several ranks, else the whole unit); add/read/write take whole-unit arrays indexed globally.
// The speculative Update (tiers.h) keeps the old version of what it updates: HostStates in a bounded
// backup of whole sub-groups, NvmeStates in the other of two slots per sub-group (Speculated, below).
#include <algorithm>
#include <cstring>
#include <tuple>

#include "tiers.h"
#include "zinf/nvme/swapper.h"

namespace zinf::offload::detail {
namespace {

// Which sub-groups a speculative Update touched, and which of them the next walk passes by (committed).
struct Speculated {
  std::vector<OptimizerStates::SubGroupRef> touched;  // in the order updated
  std::vector<std::vector<char>> passed;              // [unit][sub-group]: committed, not updated again
  void commit(EngineState& s) {
    if (passed.empty())
      for (const Unit& u : s.units) passed.emplace_back(u.chunks.size(), 0);
    for (auto [ui, ci] : touched) passed[ui][ci] = 1;
    touched.clear();
  }
  bool pass(std::size_t ui, std::size_t ci) const { return !passed.empty() && passed[ui][ci]; }
  void walked() {  // after the walk that followed a commit
    for (auto& p : passed) std::fill(p.begin(), p.end(), 0);
  }
};

// The Update's walk over states that are addressable in place: bases(u) gives unit u's master, m
// and v arrays; sub-groups `spec` has committed are passed by.
template <class Bases>
void walk_in_place(EngineState& s, const std::shared_future<Decision>& decision, const OptimizerStates::SubGroupFn& fn,
                   Bases bases, Speculated* spec = nullptr) {
  const Decision& d = decision.get();
  if (!d) return;
  for (std::size_t ui = 0; ui < s.units.size(); ++ui) {
    Unit& u = s.units[ui];
    const auto [master, m, v] = bases(u);
    for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) {
      if (spec && spec->pass(ui, ci)) continue;
      const std::size_t o = u.chunks[ci];
      const std::size_t i = o - u.state_range.lo;
      fn(ui, o, u.chunk_len(ci), master + i, m + i, v + i, *d);
    }
  }
}

class DeviceStates final : public OptimizerStates {
 public:
  explicit DeviceStates(EngineState& s) : state_(s) {}
  void add(Unit& u, const std::string& name, const float* master) override {
    const std::size_t n = u.state_range.len();
    // fp32 with whole resident parameters: the compute copy is the master (no second fp32 copy).
    if (const BufferSpec* b = state_.find(Buffer::master, u.index))
      u.dev_master = DeviceBuffer(state_.dev, b->bytes, name + " master");
    u.dev_m = DeviceBuffer(state_.dev, state_.spec(Buffer::adam_m, u.index, Tier::device).bytes, name + " adam.m");
    u.dev_v = DeviceBuffer(state_.dev, state_.spec(Buffer::adam_v, u.index, Tier::device).bytes, name + " adam.v");
    if (n) {  // a small unit's shard may be empty on this rank
      state_.kern->zero(u.dev_m.as<void>(), n * 4, StreamRole::h2d);
      state_.kern->zero(u.dev_v.as<void>(), n * 4, StreamRole::h2d);
    }
    if (u.dev_master.size()) state_.h2d_sync(u.dev_master.as<void>(), master + u.state_range.lo, n * 4);
    state_.dev.synchronize(StreamRole::h2d);
  }
  void update_walk(const std::shared_future<Decision>& decision, const SubGroupFn& fn) override {
    walk_in_place(state_, decision, fn,
                  [this](Unit& u) { return std::tuple(master_of(u), u.dev_m.as<float>(), u.dev_v.as<float>()); });
  }
  void read(Unit& u, float* master, float* m, float* v) override {
    const std::size_t n = u.state_range.len();
    state_.d2h_sync(master + u.state_range.lo, master_of(u), n * 4);
    if (m) state_.d2h_sync(m + u.state_range.lo, u.dev_m.as<void>(), n * 4);
    if (v) state_.d2h_sync(v + u.state_range.lo, u.dev_v.as<void>(), n * 4);
  }
  void write(Unit& u, const float* master, const float* m, const float* v) override {
    const std::size_t n = u.state_range.len();
    if (u.dev_master.size())
      state_.h2d_sync(u.dev_master.as<void>(), master + u.state_range.lo,
                      n * 4);  // else: the compute copy, rebuilt by its home
    state_.h2d_sync(u.dev_m.as<void>(), m + u.state_range.lo, n * 4);
    state_.h2d_sync(u.dev_v.as<void>(), v + u.state_range.lo, n * 4);
  }

 private:
  float* master_of(Unit& u) {
    return u.dev_master.size() ? u.dev_master.as<float>() : u.param.as<float>() + u.state_range.lo;
  }
  EngineState& state_;
};

class HostStates final : public OptimizerStates {
 public:
  explicit HostStates(EngineState& s) : state_(s) {
    if (const BufferSpec* b = s.find(Buffer::speculation_backup)) {
      backup_ = s.alloc_host(b->bytes * b->count);
      backup_bytes_ = b->bytes;
      backup_slots_ = b->count;
    }
  }
  void add(Unit& u, const std::string&, const float* master) override {
    const std::size_t n = u.state_range.len();
    u.host_master = state_.alloc_host(state_.spec(Buffer::master, u.index, Tier::host).bytes);
    u.host_m = state_.alloc_host(state_.spec(Buffer::adam_m, u.index, Tier::host).bytes);
    u.host_v = state_.alloc_host(state_.spec(Buffer::adam_v, u.index, Tier::host).bytes);
    std::memcpy(u.host_master.get(), master + u.state_range.lo, n * 4);
    std::memset(u.host_m.get(), 0, n * 4);
    std::memset(u.host_v.get(), 0, n * 4);
  }
  void update_walk(const std::shared_future<Decision>& decision, const SubGroupFn& fn) override {
    walk_in_place(
        state_, decision, fn, [](Unit& u) { return std::tuple(f(u.host_master), f(u.host_m), f(u.host_v)); }, &spec_);
    spec_.walked();
  }
  bool speculative() const override { return backup_slots_ > 0; }
  // Sub-group k of the backup holds the old master|m|v (SubGroupLayout) of spec_.touched[k].
  void speculate(const std::vector<SubGroupRef>& order, const Gate& gate, const cpu_adam::AdamStep& step,
                 const SubGroupFn& fn) override {
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (spec_.touched.size() == backup_slots_) return;  // the backup is full: the rest waits for the decision
      if (!gate(k)) return;
      const auto [ui, ci] = order[k];
      Unit& u = state_.units[ui];
      const std::size_t o = u.chunks[ci], len = u.chunk_len(ci), i = o - u.state_range.lo;
      const SubGroupLayout l(len);
      void* b = backup_.get() + spec_.touched.size() * backup_bytes_;
      const auto t0 = Clock::now();
      copy(l.master(b), f(u.host_master) + i, len);
      copy(l.m(b), f(u.host_m) + i, len);
      copy(l.v(b), f(u.host_v) + i, len);
      state_.add_time(&BusyTimes::host, since(t0));
      spec_.touched.push_back(order[k]);
      fn(ui, o, len, f(u.host_master) + i, f(u.host_m) + i, f(u.host_v) + i, step);
    }
  }
  void commit() override { spec_.commit(state_); }
  void rollback(const SubGroupFn* rewrite) override {
    for (std::size_t k = 0; k < spec_.touched.size(); ++k) {
      const auto [ui, ci] = spec_.touched[k];
      Unit& u = state_.units[ui];
      const std::size_t o = u.chunks[ci], len = u.chunk_len(ci), i = o - u.state_range.lo;
      const SubGroupLayout l(len);
      void* b = backup_.get() + k * backup_bytes_;
      const auto t0 = Clock::now();
      copy(f(u.host_master) + i, l.master(b), len);
      copy(f(u.host_m) + i, l.m(b), len);
      copy(f(u.host_v) + i, l.v(b), len);
      state_.add_time(&BusyTimes::host, since(t0));
      if (rewrite) (*rewrite)(ui, o, len, f(u.host_master) + i, f(u.host_m) + i, f(u.host_v) + i, {});
    }
    spec_.touched.clear();
  }
  void read(Unit& u, float* master, float* m, float* v) override {
    const std::size_t n = u.state_range.len();
    std::memcpy(master + u.state_range.lo, u.host_master.get(), n * 4);
    if (m) std::memcpy(m + u.state_range.lo, u.host_m.get(), n * 4);
    if (v) std::memcpy(v + u.state_range.lo, u.host_v.get(), n * 4);
  }
  void write(Unit& u, const float* master, const float* m, const float* v) override {
    const std::size_t n = u.state_range.len();
    std::memcpy(u.host_master.get(), master + u.state_range.lo, n * 4);
    std::memcpy(u.host_m.get(), m + u.state_range.lo, n * 4);
    std::memcpy(u.host_v.get(), v + u.state_range.lo, n * 4);
  }

 private:
  static float* f(const HostMem& p) { return reinterpret_cast<float*>(p.get()); }
  void copy(float* dst, const float* src, std::size_t n) {  // on the host threads
    state_.threads.parallel_for(n, 1 << 16, [&](std::size_t b, std::size_t e) {
      std::memcpy(dst + b, src + b, (e - b) * 4);
    });
  }
  EngineState& state_;
  HostMem backup_;  // the speculative Update's: backup_slots_ sub-groups of backup_bytes_
  std::size_t backup_bytes_ = 0, backup_slots_ = 0;
  Speculated spec_;
};

class NvmeStates final : public OptimizerStates {
 public:
  explicit NvmeStates(EngineState& s)
      : state_(s),
        store_(s.config.optimizer_store, s.config.optimizer_faults),
        swapper_(store_, *s.pinned, static_cast<int>(swap_spec(s).count), swap_spec(s).bytes) {}
  void add(Unit& u, const std::string& name, const float* master) override {
    for (const BufferSpec& b : state_.buffers.of_unit(u.index))  // one tensor per sub-group, in order
      if (b.what == Buffer::optimizer_subgroup)
        for (std::uint64_t k = 0; k < b.count; ++k)
          u.nvme_subgroups.push_back(store_.add(name + ".sg" + std::to_string(u.nvme_subgroups.size()), b.bytes));
    ZINF_CHECK(u.nvme_subgroups.size() == u.chunks.size());
    if (current_.size() <= u.index) current_.resize(u.index + 1);
    current_[u.index].assign(u.chunks.size(), 0);
    for_each_subgroup(u, [&](std::size_t ci, std::size_t o, const SubGroupLayout& l, void* buf) {  // initial contents
      std::memset(buf, 0, l.bytes());
      std::memcpy(l.master(buf), master + o, l.len * 4);
      store_.write(u.nvme_subgroups[ci], buf, at(u.index, ci, l), l.bytes())->wait();
    });
  }
  void update_walk(const std::shared_future<Decision>& decision, const SubGroupFn& fn) override {
    struct Item {
      std::size_t unit, o, len;
    };
    std::vector<Item> meta;
    std::vector<nvme::SwapItem> items;
    for (std::size_t ui = 0; ui < state_.units.size(); ++ui) {
      Unit& u = state_.units[ui];
      for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) {
        if (spec_.pass(ui, ci)) continue;  // committed by a speculative Update: no I/O
        const SubGroupLayout l(u.chunk_len(ci));
        meta.push_back({ui, u.chunks[ci], u.chunk_len(ci)});
        items.push_back({u.nvme_subgroups[ci], at(ui, ci, l), l.bytes(), true, true});
      }
    }
    struct Walked {  // the committed marks are cleared however the walk ends
      Speculated& s;
      ~Walked() { s.walked(); }
    } walked{spec_};
    // SwapIn reads ahead (during the backward, when started early) and SwapOut writes behind.
    swapper_.run(
        items,
        [&](std::size_t i, void* buf, std::size_t) {
          const Decision& d = decision.get();  // blocks only until the barrier decides
          if (!d) return;                      // skipped step: the states go back unchanged
          const Item& it = meta[i];
          const SubGroupLayout l(it.len);
          fn(it.unit, it.o, it.len, l.master(buf), l.m(buf), l.v(buf), *d);
        },
        state_.exact() ? -1 : 0);
  }
  void read(Unit& u, float* master, float* m, float* v) override {
    for_each_subgroup(u, [&](std::size_t ci, std::size_t o, const SubGroupLayout& l, void* buf) {
      if (m || v)
        store_.read(u.nvme_subgroups[ci], buf, at(u.index, ci, l), l.bytes())->wait();
      else
        store_.read(u.nvme_subgroups[ci], buf, at(u.index, ci, l), 4 * l.padded)->wait();  // the master part only
      std::memcpy(master + o, l.master(buf), l.len * 4);
      if (m) std::memcpy(m + o, l.m(buf), l.len * 4);
      if (v) std::memcpy(v + o, l.v(buf), l.len * 4);
    });
  }
  void write(Unit& u, const float* master, const float* m, const float* v) override {
    for_each_subgroup(u, [&](std::size_t ci, std::size_t o, const SubGroupLayout& l, void* buf) {
      std::memset(buf, 0, l.bytes());
      std::memcpy(l.master(buf), master + o, l.len * 4);
      std::memcpy(l.m(buf), m + o, l.len * 4);
      std::memcpy(l.v(buf), v + o, l.len * 4);
      store_.write(u.nvme_subgroups[ci], buf, at(u.index, ci, l), l.bytes())->wait();
    });
  }
  nvme::TensorStore* store() override { return &store_; }

  // Speculation: each sub-group's tensor holds two slots; current_ says which one is its state.
  // The speculative Update reads the current slot and writes the other; commit switches, rollback
  // moves nothing.
  bool speculative() const override { return state_.buffers.layout().speculative; }
  void speculate(const std::vector<SubGroupRef>& order, const Gate& gate, const cpu_adam::AdamStep& step,
                 const SubGroupFn& fn) override {
    std::vector<nvme::SwapItem> items;
    for (auto [ui, ci] : order) {
      Unit& u = state_.units[ui];
      const SubGroupLayout l(u.chunk_len(ci));
      nvme::SwapItem it{u.nvme_subgroups[ci], at(ui, ci, l), l.bytes(), true, true};
      it.write_offset = static_cast<std::int64_t>(l.bytes() - it.offset);  // the other slot
      items.push_back(it);
    }
    // SwapIn reads ahead from now (the last backward); the gate holds each sub-group until its
    // gradient is reduced, and a no stops the run (what was written to the other slots is done).
    swapper_.run(
        items,
        [&](std::size_t k, void* buf, std::size_t) {
          const auto [ui, ci] = order[k];
          Unit& u = state_.units[ui];
          const SubGroupLayout l(u.chunk_len(ci));
          fn(ui, u.chunks[ci], l.len, l.master(buf), l.m(buf), l.v(buf), step);
          spec_.touched.push_back(order[k]);
        },
        state_.exact() ? -1 : 0, gate);
  }
  void commit() override {
    for (auto [ui, ci] : spec_.touched) current_[ui][ci] ^= 1;
    spec_.commit(state_);
  }
  void rollback(const SubGroupFn* rewrite) override {
    if (rewrite && !spec_.touched.empty()) {  // the old masters, from the current slots (read only)
      std::vector<nvme::SwapItem> items;
      for (auto [ui, ci] : spec_.touched) {
        Unit& u = state_.units[ui];
        const SubGroupLayout l(u.chunk_len(ci));
        items.push_back({u.nvme_subgroups[ci], at(ui, ci, l), 4 * l.padded, true, false});
      }
      swapper_.run(items, [&](std::size_t k, void* buf, std::size_t) {
        const auto [ui, ci] = spec_.touched[k];
        Unit& u = state_.units[ui];
        const SubGroupLayout l(u.chunk_len(ci));
        (*rewrite)(ui, u.chunks[ci], l.len, l.master(buf), nullptr, nullptr, {});
      });
    }
    spec_.touched.clear();
  }

 private:
  // fn(ci, o, layout, buf) for each of u's sub-groups in order, with one pageable staging buffer.
  template <class F>
  void for_each_subgroup(Unit& u, F fn) {
    const std::size_t cap =
        SubGroupLayout::bytes_for(std::max<std::size_t>(1, std::min(state_.sub_group, u.state_range.len())));
    PinnedPool pool(round_up(cap, PinnedPool::kAlign), /*lock=*/false);
    PinnedBuffer b = pool.acquire(cap);
    for (std::size_t ci = 0; ci < u.chunks.size(); ++ci)
      fn(ci, u.chunks[ci], SubGroupLayout(u.chunk_len(ci)), b.data());
  }
  static const BufferSpec& swap_spec(EngineState& s) { return s.spec(Buffer::optimizer_swap, kShared, Tier::pinned); }
  // Where sub-group ci of unit ui's current state starts in its tensor.
  std::uint64_t at(std::size_t ui, std::size_t ci, const SubGroupLayout& l) const {
    return current_[ui][ci] ? l.bytes() : 0;
  }
  EngineState& state_;
  nvme::TensorStore store_;
  nvme::Swapper swapper_;
  std::vector<std::vector<char>> current_;  // [unit][sub-group]: which slot holds the state (speculation)
  Speculated spec_;
};

}  // namespace

std::unique_ptr<OptimizerStates> make_optimizer_states(EngineState& s) {
  switch (s.config.optimizer) {
    case OffloadDevice::none: return std::make_unique<DeviceStates>(s);
    case OffloadDevice::cpu: return std::make_unique<HostStates>(s);
    case OffloadDevice::nvme: return std::make_unique<NvmeStates>(s);
  }
  throw Error("offload: unknown optimizer tier");
}

}  // namespace zinf::offload::detail
