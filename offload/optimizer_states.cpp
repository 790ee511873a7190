// optimizer_states.cpp — master, m and v of every unit, on the tier offload_optimizer names:
//   DeviceStates  device memory (offload_optimizer none); the Update is the device's own kernel
//   HostStates    host memory (cpu); the Update is cpu_adam on the host threads
//   NvmeStates    one store tensor per sub-group, laid out by SubGroupLayout (nvme); the Update
//                 streams them through the pipelined swapper: SwapIn ahead, SwapOut behind
// Each holds the states of state_range of every unit (this rank's shard under ZeRO stage ≥ 1 with
// several ranks, else the whole unit); add/read/write take whole-unit arrays indexed globally.
//
// m and v are kept in the run's state format (EngineConfig::optimizer_states): in place as one
// StateArray each (device and host memory), in each sub-group's tensor on NVMe (SubGroupLayout).
// A zero-filled array is the encoding of m = v = 0 in every format (q8: codes 0 under a +0 scale);
// checkpoints see fp32 (read decodes, write encodes).
//
// The speculative Update (tiers.h) keeps the old version of what it updates: HostStates in a bounded
// backup of whole sub-groups, NvmeStates in the other of two slots per sub-group (Speculated, below).
#include <algorithm>
#include <cstring>
#include <tuple>

#include "tiers.h"
#include "zinf/nvme/swapper.h"

namespace zinf::offload::detail {
namespace {

using cpu_adam::StateFormat;
using cpu_adam::StateKind;

// A tier's own per-unit state: unit u's master, m and v (of buffer type B), by the unit's index.
template <class B>
class PerUnit {
 public:
  struct Buffers {
    B master, m, v;
  };
  Buffers& operator()(const Unit& u) {
    if (of_.size() <= u.index) of_.resize(u.index + 1);
    return of_[u.index];
  }

 private:
  std::vector<Buffers> of_;
};

// In-place state arrays (StateArray): of a range of n elements, the sub-group at element i.
struct InPlace {
  StateFormat f;
  std::size_t n;
  void* elems(void* a, std::size_t i) const { return static_cast<char*>(a) + i * cpu_adam::state_elem_bytes(f); }
  float* scales(void* a, std::size_t i) const {
    if (!cpu_adam::state_scales(f, n)) return nullptr;
    return reinterpret_cast<float*>(static_cast<char*>(a) + StateArray::scales_at(n, f)) + i / cpu_adam::kQ8Block;
  }
  // The whole array ⇄ n fp32 values.
  void decode(StateKind k, void* a, float* dst) const { cpu_adam::decode_states(f, k, a, scales(a, 0), dst, n); }
  void encode(StateKind k, const float* src, void* a) const { cpu_adam::encode_states(f, k, src, a, scales(a, 0), n); }
};

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
// and v arrays (StateArray); sub-groups `spec` has committed are passed by.
template <class Bases>
void walk_in_place(EngineState& s, const std::shared_future<Decision>& decision, const OptimizerStates::SubGroupFn& fn,
                   Bases bases, Speculated* spec = nullptr) {
  const Decision& d = decision.get();
  if (!d) return;
  for (std::size_t ui = 0; ui < s.units.size(); ++ui) {
    Unit& u = s.units[ui];
    const auto [master, m, v] = bases(u);
    const InPlace a{s.layout.states, u.state_range.len()};
    for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) {
      if (spec && spec->pass(ui, ci)) continue;
      const std::size_t o = u.chunks[ci];
      const std::size_t i = o - u.state_range.lo;  // a multiple of the sub-group alignment: a q8 block's start
      fn(ui, o, u.chunk_len(ci),
         StateSlice{.master = master + i,
                    .m = a.elems(m, i),
                    .v = a.elems(v, i),
                    .m_scale = a.scales(m, i),
                    .v_scale = a.scales(v, i)},
         *d);
    }
  }
}

class DeviceStates final : public OptimizerStates {
 public:
  explicit DeviceStates(EngineState& s) : state_(s) {}

 private:
  PerUnit<DeviceBuffer> dev;  // each unit's master, m and v in device memory

 public:
  void add(Unit& u, const std::string& name, const float* master) override {
    const std::size_t n = u.state_range.len();
    // fp32 with whole resident parameters: the compute copy is the master (no second fp32 copy).
    if (const BufferSpec* b = state_.find(Buffer::master, u.index))
      dev(u).master = DeviceBuffer(state_.dev, b->bytes, name + " master");
    const std::size_t state = state_.spec(Buffer::adam_m, u.index, Tier::device).bytes;
    dev(u).m = DeviceBuffer(state_.dev, state, name + " adam.m");
    dev(u).v = DeviceBuffer(state_.dev, state_.spec(Buffer::adam_v, u.index, Tier::device).bytes, name + " adam.v");
    if (n) {  // a small unit's shard may be empty on this rank
      state_.kern->zero(dev(u).m.as<void>(), state, StreamRole::h2d);
      state_.kern->zero(dev(u).v.as<void>(), state, StreamRole::h2d);
    }
    if (dev(u).master.size()) state_.h2d_sync(dev(u).master.as<void>(), master + u.state_range.lo, n * 4);
    state_.dev.synchronize(StreamRole::h2d);
  }
  void update_walk(const std::shared_future<Decision>& decision, const SubGroupFn& fn) override {
    walk_in_place(state_, decision, fn,
                  [this](Unit& u) { return std::tuple(master_of(u), dev(u).m.as<void>(), dev(u).v.as<void>()); });
  }
  void read(Unit& u, float* master, float* m, float* v) override {
    const std::size_t n = u.state_range.len();
    state_.d2h_sync(master + u.state_range.lo, master_of(u), n * 4);
    if (m) read_state(u, StateKind::m, dev(u).m, m + u.state_range.lo);
    if (v) read_state(u, StateKind::v, dev(u).v, v + u.state_range.lo);
  }
  void write(Unit& u, const float* master, const float* m, const float* v) override {
    const std::size_t n = u.state_range.len();
    if (dev(u).master.size())
      state_.h2d_sync(dev(u).master.as<void>(), master + u.state_range.lo,
                      n * 4);  // else: the compute copy, rebuilt by its home
    write_state(u, StateKind::m, m + u.state_range.lo, dev(u).m);
    write_state(u, StateKind::v, v + u.state_range.lo, dev(u).v);
  }

 private:
  float* master_of(Unit& u) {
    return dev(u).master.size() ? dev(u).master.as<float>() : u.param.as<float>() + u.state_range.lo;
  }
  // One of u's m, v: fp32 straight from or to the device; another format through a host copy of the
  // array, decoded or encoded there.
  void read_state(Unit& u, StateKind k, DeviceBuffer& a, float* dst) {
    const InPlace f{state_.layout.states, u.state_range.len()};
    if (f.f == StateFormat::fp32) return state_.d2h_sync(dst, a.as<void>(), f.n * 4);
    HostMem h = host_alloc(a.size());
    state_.d2h_sync(h.get(), a.as<void>(), a.size());
    f.decode(k, h.get(), dst);
  }
  void write_state(Unit& u, StateKind k, const float* src, DeviceBuffer& a) {
    const InPlace f{state_.layout.states, u.state_range.len()};
    if (f.f == StateFormat::fp32) return state_.h2d_sync(a.as<void>(), src, f.n * 4);
    HostMem h = host_alloc(a.size());
    f.encode(k, src, h.get());
    state_.h2d_sync(a.as<void>(), h.get(), a.size());
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

 private:
  PerUnit<HostMem> host;  // each unit's master, m and v in host memory

 public:
  void add(Unit& u, const std::string&, const float* master) override {
    const std::size_t n = u.state_range.len();
    host(u).master = state_.alloc_host(state_.spec(Buffer::master, u.index, Tier::host).bytes);
    const std::size_t state = state_.spec(Buffer::adam_m, u.index, Tier::host).bytes;
    host(u).m = state_.alloc_host(state);
    host(u).v = state_.alloc_host(state_.spec(Buffer::adam_v, u.index, Tier::host).bytes);
    std::memcpy(host(u).master.get(), master + u.state_range.lo, n * 4);
    std::memset(host(u).m.get(), 0, state);
    std::memset(host(u).v.get(), 0, state);
  }
  void update_walk(const std::shared_future<Decision>& decision, const SubGroupFn& fn) override {
    struct Walked {  // the committed marks are cleared however the walk ends
      Speculated& s;
      ~Walked() { s.walked(); }
    } walked{spec_};
    walk_in_place(
        state_, decision, fn,
        [this](Unit& u) {
          return std::tuple(reinterpret_cast<float*>(host(u).master.get()), static_cast<void*>(host(u).m.get()),
                            static_cast<void*>(host(u).v.get()));
        },
        &spec_);
  }
  // The same on every rank (the layout's flag), also where this rank keeps no states and its backup
  // has no slot: every rank then decides its steps alike (a clipped step is redone and lands with
  // its gathers on every rank; a skipped one lands nowhere). With no slot, speculate() updates nothing.
  bool speculative() const override { return state_.layout.speculative; }
  // Slot k of the backup holds the old master | m | v | scales (SubGroupLayout) of spec_.touched[k].
  void speculate(const std::vector<SubGroupRef>& order, const Gate& gate, const cpu_adam::AdamStep& step,
                 const SubGroupFn& fn) override {
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (spec_.touched.size() == backup_slots_) return;  // the backup is full: the rest waits for the decision
      if (!gate(k)) return;
      const auto [ui, ci] = order[k];
      const StateSlice s = slice(ui, ci);
      backup(s, ui, ci, spec_.touched.size(), true);
      spec_.touched.push_back(order[k]);
      fn(ui, state_.units[ui].chunks[ci], state_.units[ui].chunk_len(ci), s, step);
    }
  }
  void commit() override { spec_.commit(state_); }
  void rollback(const SubGroupFn* rewrite) override {
    for (std::size_t k = 0; k < spec_.touched.size(); ++k) {
      const auto [ui, ci] = spec_.touched[k];
      const StateSlice s = slice(ui, ci);
      backup(s, ui, ci, k, false);
      if (rewrite) (*rewrite)(ui, state_.units[ui].chunks[ci], state_.units[ui].chunk_len(ci), s, {});
    }
    spec_.touched.clear();
  }
  void read(Unit& u, float* master, float* m, float* v) override {
    const std::size_t n = u.state_range.len();
    const InPlace a{state_.layout.states, n};
    std::memcpy(master + u.state_range.lo, host(u).master.get(), n * 4);
    if (m) a.decode(StateKind::m, host(u).m.get(), m + u.state_range.lo);
    if (v) a.decode(StateKind::v, host(u).v.get(), v + u.state_range.lo);
  }
  void write(Unit& u, const float* master, const float* m, const float* v) override {
    const std::size_t n = u.state_range.len();
    const InPlace a{state_.layout.states, n};
    std::memcpy(host(u).master.get(), master + u.state_range.lo, n * 4);
    a.encode(StateKind::m, m + u.state_range.lo, host(u).m.get());
    a.encode(StateKind::v, v + u.state_range.lo, host(u).v.get());
  }

 private:
  // Sub-group ci of unit ui where it lives (as walk_in_place hands it).
  StateSlice slice(std::size_t ui, std::size_t ci) {
    Unit& u = state_.units[ui];
    const InPlace a{state_.layout.states, u.state_range.len()};
    const std::size_t i = u.chunks[ci] - u.state_range.lo;
    void *m = host(u).m.get(), *v = host(u).v.get();
    return StateSlice{.master = reinterpret_cast<float*>(host(u).master.get()) + i,
                      .m = a.elems(m, i),
                      .v = a.elems(v, i),
                      .m_scale = a.scales(m, i),
                      .v_scale = a.scales(v, i)};
  }
  // Copies sub-group ci of unit ui (at `s`) into backup slot k (`save`), or back from it.
  void backup(const StateSlice& s, std::size_t ui, std::size_t ci, std::size_t k, bool save) {
    const std::size_t len = state_.units[ui].chunk_len(ci);
    const SubGroupLayout l(len, state_.layout.states);
    void* b = backup_.get() + k * backup_bytes_;
    const std::size_t elems = cpu_adam::state_elem_bytes(l.format) * len,
                      scales = 4 * cpu_adam::state_scales(l.format, len);
    const auto t0 = Clock::now();
    copy(l.master(b), s.master, 4 * len, save);
    copy(l.m(b), s.m, elems, save);
    copy(l.v(b), s.v, elems, save);
    if (scales) {
      copy(l.m_scale(b), s.m_scale, scales, save);
      copy(l.v_scale(b), s.v_scale, scales, save);
    }
    state_.add_host_time(t0, "Backup", static_cast<std::int64_t>(ui));
  }
  void copy(void* backup, void* home, std::size_t bytes, bool save) {  // on the host threads
    char* dst = static_cast<char*>(save ? backup : home);
    const char* src = static_cast<const char*>(save ? home : backup);
    state_.threads.parallel_for(bytes, 1 << 18, [&](std::size_t b, std::size_t e) { std::memcpy(dst + b, src + b, e - b); });
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
        swapper_(store_, *s.pinned, static_cast<int>(swap_spec(s).count), swap_spec(s).bytes) {
    // The swapper's handoffs in the step graph: the Update waits for a sub-group's read; its write is
    // issued after the Update; a buffer is read into again once its write has finished.
    s.claim("SwapIn(g)", "Update(g)", Handoff::host_wait);
    s.claim("Update(g)", "SwapOut(g)", Handoff::enqueued_after);
    s.claim("SwapOut(g)", "SwapIn(g)", Handoff::host_wait);
  }

 private:
  // Each unit's NVMe tensors, one per sub-group holding its master | m | v (this tier's own).
  std::vector<std::vector<nvme::TensorStore::Id>> subgroups_;
  std::vector<nvme::TensorStore::Id>& subgroups(const Unit& u) {
    if (subgroups_.size() <= u.index) subgroups_.resize(u.index + 1);
    return subgroups_[u.index];
  }

 public:
  void add(Unit& u, const std::string& name, const float* master) override {
    for (const BufferSpec& b : state_.buffers.of_unit(u.index))  // one tensor per sub-group, in order
      if (b.what == Buffer::optimizer_subgroup)
        for (std::uint64_t k = 0; k < b.count; ++k)
          subgroups(u).push_back(store_.add(name + ".sg" + std::to_string(subgroups(u).size()), b.bytes));
    ZINF_CHECK(subgroups(u).size() == u.chunks.size());
    if (current_.size() <= u.index) current_.resize(u.index + 1);
    current_[u.index].assign(u.chunks.size(), 0);
    for_each_subgroup(u, [&](std::size_t ci, std::size_t o, const SubGroupLayout& l, void* buf) {  // initial contents
      std::memset(buf, 0, l.bytes());
      std::memcpy(l.master(buf), master + o, l.len * 4);
      store_.write(subgroups(u)[ci], buf, at(u.index, ci, l), l.bytes())->wait();
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
        const SubGroupLayout l = layout(u.chunk_len(ci));
        meta.push_back({ui, u.chunks[ci], u.chunk_len(ci)});
        items.push_back({subgroups(u)[ci], at(ui, ci, l), l.bytes(), true, true});
      }
    }
    struct Walked {  // the committed marks are cleared however the walk ends
      Speculated& s;
      ~Walked() { s.walked(); }
    } walked{spec_};
    // SwapIn reads ahead (during the backward, when started early) and SwapOut writes behind. A step
    // that updates nothing (skipped, or a walk started early and abandoned) stops at the first
    // sub-group: what was read ahead is dropped, nothing is written back, the states stay as they are.
    swapper_.run(
        items,
        [&](std::size_t i, void* buf, std::size_t) {
          const Decision& d = decision.get();
          const Item& it = meta[i];
          const SubGroupLayout l = layout(it.len);
          fn(it.unit, it.o, it.len,
             StateSlice{.master = l.master(buf),
                        .m = l.m(buf),
                        .v = l.v(buf),
                        .m_scale = l.m_scale(buf),
                        .v_scale = l.v_scale(buf)},
             *d);
        },
        state_.stages.swap_ahead,
        [&](std::size_t) { return decision.get().has_value(); });  // blocks only until the barrier decides
  }
  void read(Unit& u, float* master, float* m, float* v) override {
    for_each_subgroup(u, [&](std::size_t ci, std::size_t o, const SubGroupLayout& l, void* buf) {
      if (m || v)
        store_.read(subgroups(u)[ci], buf, at(u.index, ci, l), l.bytes())->wait();
      else
        store_.read(subgroups(u)[ci], buf, at(u.index, ci, l), l.master_bytes)->wait();  // the master part only
      std::memcpy(master + o, l.master(buf), l.len * 4);
      if (m) cpu_adam::decode_states(l.format, StateKind::m, l.m(buf), l.m_scale(buf), m + o, l.len);
      if (v) cpu_adam::decode_states(l.format, StateKind::v, l.v(buf), l.v_scale(buf), v + o, l.len);
    });
  }
  void write(Unit& u, const float* master, const float* m, const float* v) override {
    for_each_subgroup(u, [&](std::size_t ci, std::size_t o, const SubGroupLayout& l, void* buf) {
      std::memset(buf, 0, l.bytes());
      std::memcpy(l.master(buf), master + o, l.len * 4);
      cpu_adam::encode_states(l.format, StateKind::m, m + o, l.m(buf), l.m_scale(buf), l.len);
      cpu_adam::encode_states(l.format, StateKind::v, v + o, l.v(buf), l.v_scale(buf), l.len);
      store_.write(subgroups(u)[ci], buf, at(u.index, ci, l), l.bytes())->wait();
    });
  }
  nvme::TensorStore* store() override { return &store_; }

  // Speculation: each sub-group's tensor holds two slots; current_ says which one is its state.
  // The speculative Update reads the current slot and writes the other; commit switches, rollback
  // moves nothing.
  bool speculative() const override { return state_.layout.speculative; }
  void speculate(const std::vector<SubGroupRef>& order, const Gate& gate, const cpu_adam::AdamStep& step,
                 const SubGroupFn& fn) override {
    std::vector<nvme::SwapItem> items;
    for (auto [ui, ci] : order) {
      Unit& u = state_.units[ui];
      const SubGroupLayout l = layout(u.chunk_len(ci));
      nvme::SwapItem it{subgroups(u)[ci], at(ui, ci, l), l.bytes(), true, true};
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
          const SubGroupLayout l = layout(u.chunk_len(ci));
          fn(ui, u.chunks[ci], l.len,
             StateSlice{.master = l.master(buf),
                        .m = l.m(buf),
                        .v = l.v(buf),
                        .m_scale = l.m_scale(buf),
                        .v_scale = l.v_scale(buf)},
             step);
          spec_.touched.push_back(order[k]);
        },
        state_.stages.swap_ahead, gate);
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
        const SubGroupLayout l = layout(u.chunk_len(ci));
        items.push_back({subgroups(u)[ci], at(ui, ci, l), l.master_bytes, true, false});
      }
      swapper_.run(items, [&](std::size_t k, void* buf, std::size_t) {
        const auto [ui, ci] = spec_.touched[k];
        Unit& u = state_.units[ui];
        const SubGroupLayout l = layout(u.chunk_len(ci));
        (*rewrite)(ui, u.chunks[ci], l.len, StateSlice{.master = l.master(buf)}, {});
      });
    }
    spec_.touched.clear();
  }

 private:
  // fn(ci, o, layout, buf) for each of u's sub-groups in order, with one pageable staging buffer.
  template <class F>
  void for_each_subgroup(Unit& u, F fn) {
    const std::size_t cap = layout(std::max<std::size_t>(1, std::min(state_.layout.sub_group, u.state_range.len()))).bytes();
    PinnedPool pool(round_up(cap, PinnedPool::kAlign), /*lock=*/false);
    PinnedBuffer b = pool.acquire(cap);
    for (std::size_t ci = 0; ci < u.chunks.size(); ++ci) fn(ci, u.chunks[ci], layout(u.chunk_len(ci)), b.data());
  }
  SubGroupLayout layout(std::size_t len) const { return SubGroupLayout(len, state_.layout.states); }
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
  switch (s.layout.optimizer) {
    case OffloadDevice::none: return std::make_unique<DeviceStates>(s);
    case OffloadDevice::cpu: return std::make_unique<HostStates>(s);
    case OffloadDevice::nvme: return std::make_unique<NvmeStates>(s);
  }
  throw Error("offload: unknown optimizer tier");
}

}  // namespace zinf::offload::detail
