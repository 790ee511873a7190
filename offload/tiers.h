// tiers.h — where the states live, one class per tier (internal to zinf_offload). Adding a tier or a
// compressed state format means one more class here; the stages only call these interfaces.
//
//   OptimizerStates  master, m, v     DeviceStates | HostStates | NvmeStates  (optimizer_states.cpp)
//   ParamHome        the compute copy DeviceHome (resident units; UploadedHome with the host's
//                                     Update, InPlaceHome with the device's) | PinnedHome | NvmeHome
//                                     (param_homes.cpp)
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine_state.h"

namespace zinf::offload::detail {

// The barrier's decision for a step: the AdamStep, or nothing when the step is skipped.
using Decision = std::optional<cpu_adam::AdamStep>;

// One sub-group's states as the Update sees them: pointers to the sub-group's first element of the
// fp32 master and of m and v in the run's state format (cpu_adam::UpdateChunk), with their scales
// (null unless the format has any).
struct StateSlice {
  float* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;
  float* v_scale = nullptr;
};

class OptimizerStates {
 public:
  virtual ~OptimizerStates() = default;
  // Allocates unit u's states: master from `master` (n floats), m and v zero.
  virtual void add(Unit& u, const std::string& name, const float* master) = 0;
  // The Update's walk over every sub-group of every unit in forward order: fn(unit, o, len, slice,
  // step) with the slice's pointers where this tier keeps the states (device memory for
  // DeviceStates). The decision is awaited before the first call; a skipped step calls nothing
  // (NVMe: its sub-groups still pass through, unchanged). Runs on the update worker.
  using SubGroupFn = std::function<void(std::size_t unit, std::size_t o, std::size_t len, const StateSlice& slice,
                                        const cpu_adam::AdamStep& step)>;
  virtual void update_walk(const std::shared_future<Decision>& decision, const SubGroupFn& fn) = 0;
  // Checkpoints (nothing else may run): unit u's states, n floats each; m and v may be null.
  virtual void read(Unit& u, float* master, float* m, float* v) = 0;
  virtual void write(Unit& u, const float* master, const float* m, const float* v) = 0;
  virtual nvme::TensorStore* store() { return nullptr; }

  // ---- the speculative Update (UpdatePipeline::speculate; host memory and NVMe) ----
  // Sub-groups named by unit and index in Unit::chunks.
  using SubGroupRef = std::pair<std::size_t, std::size_t>;
  // Before order[k] is updated, gate(k) says whether it may be now (it may block); false stops the walk.
  using Gate = std::function<bool(std::size_t k)>;
  // Whether this tier keeps an old version beside a speculative one (host memory: a bounded backup;
  // NVMe: two slots per sub-group).
  virtual bool speculative() const { return false; }
  // Updates sub-groups of `order` in that order with `step` (fn as update_walk's), each only once its
  // gate says so, keeping the old version: host memory copies it into the backup first (and stops when
  // the backup is full); NVMe reads the current slot and writes the other. Runs on the update worker.
  virtual void speculate(const std::vector<SubGroupRef>& order, const Gate& gate, const cpu_adam::AdamStep& step,
                         const SubGroupFn& fn) {
    (void)order, (void)gate, (void)step, (void)fn;
  }
  // The decision. commit: the speculative versions are current (NVMe: the slots switch), and the next
  // update_walk passes those sub-groups by. rollback: the old versions are current again (host: copied
  // back from the backup; NVMe: nothing moves); `rewrite`, when given, is then called with each
  // restored sub-group's states (to read only; the step argument is meaningless).
  virtual void commit() {}
  virtual void rollback(const SubGroupFn* rewrite) { (void)rewrite; }
};
std::unique_ptr<OptimizerStates> make_optimizer_states(EngineState& s);

// Two pinned slots through which the Update's new compute copy leaves the host when its home is not
// host-visible (the device with an offloaded optimizer, or NVMe); each with the event of its last
// h2d copy, waited on before the slot is rewritten.
struct UploadSlots {
  std::vector<PinnedBuffer> buffer;
  std::vector<EventHandle> copied;
};

class ParamHome {
 public:
  virtual ~ParamHome() = default;
  // At construction: unit u's compute copy from its fp32 master.
  virtual void place(Unit& u, const std::string& name, const float* master) = 0;
  // After write_states: the compute copy rebuilt from the master, exactly as the Update writes it.
  virtual void rebuild(Unit& u, const float* master) = 0;
  // The Update writes the new compute copy of [o, o+len) to update_target(), then land_chunk()
  // moves it home (Upload); land_unit() runs once u's last chunk is home, before u lands.
  // `written`: the device's own Update is d2h stream work, and this event (recorded on d2h after the
  // chunk) says the target is written; a home that reads the target on the host waits for it first.
  // Null when the host's Update wrote it (done before land_chunk is called).
  virtual void* update_target(Unit& u, std::size_t o, int slot) = 0;
  virtual void land_chunk(Unit& u, std::size_t o, std::size_t len, int slot, const EventHandle& written) = 0;
  virtual void land_unit(Unit&) {}
  // After a discarded speculation: the chunks of u that were rewritten with the restored masters
  // (update_target / land_chunk) are home once this returns. Not a landing: nothing is gathered
  // (every rank's part of a whole unit is the old one again) and nothing derived is recomputed.
  virtual void restored(Unit&) {}
  // Partitioned optimizer states at stage 3, or with a stream-ordered transport at any stage: a
  // resident unit's new compute copy is whole only once the trainer has gathered the other ranks'
  // parts (land_unit leaves gather_pending set). Runs on the trainer's thread, in its order of use,
  // so that every rank issues its device collectives in one order; the gather is on h2d.
  virtual void finish_landing(Unit&) {}
  // Fetch (windowed homes): brings u's whole compute copy into `slot` (device memory) on the h2d
  // stream — a copy from the home, an NVMe read into `staging` (pinned) first, or, with partitioned
  // parameters, the gather of every rank's shard (on the calling thread, which is the trainer's).
  virtual void fetch_into(Unit& u, void* slot, PinnedBuffer& staging) = 0;
  virtual nvme::TensorStore* store() { return nullptr; }
};
// The home of resident units (StagePlan::device_home), and the home of windowed units
// (StagePlan::offload_home).
std::unique_ptr<ParamHome> make_device_home(EngineState& s, UploadSlots& up);
// Null without offload_param, unless the parameters are partitioned (ZeRO stage 3 with several ranks).
std::unique_ptr<ParamHome> make_offload_home(EngineState& s, UploadSlots& up);

}  // namespace zinf::offload::detail
