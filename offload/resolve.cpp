// resolve.cpp — the placement resolved once into the stages' variants (resolve.h). Every test of a
// placement setting that decides what a stage does is here, made once when the engine is built; the
// stages' per-step code only calls the strategies these choices picked.
#include "resolve.h"

#include "engine_state.h"

namespace zinf::offload::detail {

bool resolve_ordered_collectives(const Layout& layout, const EngineConfig& cfg) {
  return layout.parallel && cfg.device_comm && cfg.device_comm->stream_ordered();
}

StagePlan resolve_stages(const Layout& l, const EngineConfig& cfg) {
  using P = StagePlan;
  P p;
  const bool ordered = resolve_ordered_collectives(l, cfg);
  const cpu_adam::GradType half = l.precision == Precision::bf16 ? cpu_adam::GradType::bf16 : cpu_adam::GradType::fp16;

  // The gradient path.
  if (!l.optimizer_offloaded)
    p.route = ordered ? P::Route::ordered_device : P::Route::device;
  else
    p.route = l.device_accum ? P::Route::accum : P::Route::host;
  p.host_reduce = !l.fp32_sum   ? P::HostReduce::copy
                  : !l.parallel ? P::HostReduce::sum_one_rank
                                : P::HostReduce::sum_across_ranks;
  p.device_actions.push_back(!l.mixed     ? P::DeviceAction::gradout_fp32
                             : l.fp32_sum ? P::DeviceAction::gradout16_widen
                                          : P::DeviceAction::gradout16);
  if (l.parallel) p.device_actions.push_back(P::DeviceAction::reduce);
  if (l.fp32_sum) p.device_actions.push_back(P::DeviceAction::sum);
  p.reduced = l.shard_grads ? P::Reduced::own_part : P::Reduced::whole;
  if (l.optimizer_offloaded) {  // the host's Update reads host memory: the fp32 sum, or the landed gradient
    p.input = l.streaming ? P::Input::ring : P::Input::host_grad;
    p.input_type = l.fp32_sum || !l.mixed ? cpu_adam::GradType::fp32 : half;
  } else if (l.fp32_sum) {
    p.input = P::Input::grad_sum;
  } else if (l.mixed) {
    p.input = P::Input::grad16, p.input_type = half;
  }
  // (Streaming: the Reduce worker sums the ring slot, which is freed before the barrier.)
  p.host_norm = l.speculative && !l.streaming ? P::HostNorm::barrier : P::HostNorm::reduce_worker;
  // The speculative Update's gate waits for Unit::reduced; otherwise the barrier's drain.
  p.reduce_to_update = l.speculative ? Handoff::version : Handoff::host_wait;

  // The norm barrier, checkpoints, the early start.
  p.norm_sum = l.shard_grads ? P::NormSum::gathered : P::NormSum::local;
  p.state_read = l.shard_states ? P::StateRead::gathered : P::StateRead::whole;
  if (l.exact && l.speculative) p.early.push_back(P::EarlyStart::speculate);  // when the trainer expects a step
  if (l.exact && l.optimizer == OffloadDevice::nvme) p.early.push_back(P::EarlyStart::swap_in);

  // The Update.
  p.updater = l.optimizer_offloaded ? P::Updater::host : P::Updater::device;
  p.swap_ahead = l.exact ? -1 : 0;

  // The parameter homes.
  p.device_home = l.optimizer_offloaded ? P::DeviceHome::uploaded : P::DeviceHome::in_place;
  switch (l.param) {
    case OffloadDevice::none: p.offload_home = l.shard_params ? P::OffloadHome::device : P::OffloadHome::none; break;
    case OffloadDevice::cpu: p.offload_home = P::OffloadHome::pinned; break;
    case OffloadDevice::nvme: p.offload_home = P::OffloadHome::nvme; break;
  }
  // Pageable staging (pin_memory false): a copy from it reads its source when it is made, not in
  // stream order, so an NVMe read into it is done before the copy.
  p.fetch = l.shard_params ? P::Fetch::gather : l.pin_memory ? P::Fetch::in_stream : P::Fetch::read_first;
  p.device_home_claims = l.param == OffloadDevice::none;
  for (const UnitLayout& u : l.units) {
    p.device_home_claims = p.device_home_claims || !u.windowed;
    // Stage 3 (the trainer gathers windowed units at Fetch too), or a stream-ordered transport (the
    // trainer issues every device collective): the trainer gathers a whole unit's new copy at its
    // first use. Two threads issuing collectives on one stream would issue them in a timing-dependent
    // order — different on each rank, which hangs stream-ordered transports.
    p.landing.push_back(u.windowed                  ? P::Landing::shard
                        : !l.shard_states           ? P::Landing::in_stream
                        : l.shard_params || ordered ? P::Landing::gather_by_trainer
                                                    : P::Landing::gather_here);
    p.weights.push_back(u.windowed ? P::Weights::window : P::Weights::resident);
  }
  p.upload_to_fetch = l.windows && l.param == OffloadDevice::none;
  p.working_weights_claims = p.device_home_claims && l.fp32_work;
  p.update_to_param_write = l.optimizer_offloaded ? Handoff::enqueued_after : Handoff::host_wait;

  // The window: with overlap exact a use of unit u prefetches the windowed units among the next
  // prefetch_depth in the pass's direction.
  const long n = static_cast<long>(l.units.size());
  for (int dir = 0; dir < 2; ++dir) {
    p.prefetch[dir].resize(l.units.size());
    for (long u = 0; l.exact && u < n; ++u)
      for (int k = 1; k <= l.prefetch_depth; ++k) {
        const long next = dir ? u - k : u + k;
        if (next < 0 || next >= n) break;
        if (l.units[static_cast<std::size_t>(next)].windowed)
          p.prefetch[dir][static_cast<std::size_t>(u)].push_back(static_cast<std::size_t>(next));
      }
  }
  p.prefetch_wait = l.shard_params ? P::PrefetchWait::wait_landing : P::PrefetchWait::skip_unlanded;
  p.fetch_done = l.exact ? P::FetchDone::async : P::FetchDone::synchronous;
  p.weights_precision = l.fp32_work ? Precision::fp32 : l.precision;
  return p;
}

std::unique_ptr<const ComputeFormat> make_compute_format(const Layout& l, cpu_adam::HostThreads& threads,
                                                         cpu_adam::HalfType half) {
  if (l.mixed) return std::make_unique<HalfFormat>(threads, half);
  return std::make_unique<Fp32Format>(threads);
}

void check_placement(const Layout& l, bool kernels_take_states) {
  if (!l.optimizer_offloaded && !kernels_take_states)
    throw Error(std::string("zero_optimization.optimizer_states \"") + cpu_adam::state_format_name(l.states) +
                "\" with the optimizer on this device: its Update kernel does not take that format (use fp32, or "
                "offload_optimizer.device cpu or nvme)");
  if (!l.pin_memory && !l.optimizer_offloaded && l.param_offloaded)
    throw Error("offload engine: pin_memory false with the optimizer on the device and the parameters offloaded",
                "the device's Update writes the parameters' host homes through mapped memory, which must be "
                "page-locked: keep pin_memory true for this placement");
}

void open_communicators(EngineState& s) {
  if (!s.parallel()) return;  // one communicator per thread that runs collectives, in this order on every rank
  Comm& hc = *s.config.comm;
  Comm& dc = s.config.device_comm ? *s.config.device_comm : *s.config.comm;
  s.front_comm = hc.dup();
  s.reduce_comm = hc.dup();
  s.reduce_dcomm = dc.dup();
  s.update_comm = hc.dup();
  if (!s.ordered_collectives) s.update_dcomm = dc.dup();  // (ordered: the trainer gathers at first use instead)
  s.fetch_comm = hc.dup();
  s.fetch_dcomm = dc.dup();
}

std::string describe_placement(const Layout& l, std::size_t pinned_capacity) {
  std::string d = "offload_optimizer=" + std::string(to_string(l.optimizer)) +
                  " offload_param=" + std::string(to_string(l.param)) + ", overlap " + (l.exact ? "exact" : "none") +
                  ", pinned pool " + std::to_string(pinned_capacity) + " bytes";
  if (l.parallel) {
    d += "; rank " + std::to_string(l.rank) + " of " + std::to_string(l.world) + ", ZeRO stage " +
         std::to_string(l.stage);
    d += l.shard_params   ? " (optimizer states, gradients and parameters partitioned)"
         : l.shard_grads  ? " (optimizer states and gradients partitioned)"
         : l.shard_states ? " (optimizer states partitioned)"
                          : " (every state on every rank)";
  }
  return d;
}

}  // namespace zinf::offload::detail
