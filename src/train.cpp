// train.cpp — the training loop with every state on the device (zinf/train.h).
//
// One optimizer step: for each micro batch, forward and backward through the offload engine (which
// windows the parameters and streams each unit's gradient out as soon as it is complete, see
// zinf/offload/engine.h); then engine.step() — the norm barrier, the overflow/clip decision and the
// Update, which lands unit by unit while the next forward starts. The loss scaler and the LR schedule
// live here; a skipped (overflowed) step advances neither the optimizer step nor the schedule.
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "model/gpt.h"
#include "model/ops_stream.h"
#include "zinf/checkpoint.h"
#include "zinf/safetensors.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_threads.h"
#include "zinf/data.h"
#include "zinf/device.h"
#include "zinf/error.h"
#include "zinf/offload/engine.h"
#include "zinf/plan.h"
#include "cuda/cuda_ops.h"
#include "cuda/engine_kernels.h"
#include "zinf/sysinfo.h"
#include "zinf/train.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// GPT-2 initialisation, deterministic per unit: N(0, 0.02) weights, N(0, 0.02/√(2L)) for the two
// residual projections, N(0, 0.01) positions, zero biases, LayerNorm weights 1.
void init_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003ull + unit * 7919ull + 17);
  auto normal = [&](float* dst, std::size_t n, double stdv) {
    for (std::size_t i = 0; i < n; i += 2) {  // Box–Muller, so the numbers do not depend on the libstdc++ version
      const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
      const double u2 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1)) * stdv;
      dst[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
      if (i + 1 < n) dst[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
    }
  };
  const std::size_t C = static_cast<std::size_t>(s.d_model), V = static_cast<std::size_t>(s.vocab_size),
                    T = static_cast<std::size_t>(s.seq_len);
  const std::size_t L = static_cast<std::size_t>(s.n_layer);
  if (unit == 0) {
    normal(p, V * C, 0.02);
    normal(p + V * C, T * C, 0.01);
  } else if (unit == L + 1) {
    for (std::size_t i = 0; i < C; ++i) p[i] = 1.0f, p[C + i] = 0.0f;
  } else {
    BlockView b = block_view(p, s.d_model);
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
    for (std::size_t i = 0; i < C; ++i) b.ln1w[i] = b.ln2w[i] = 1.0f, b.ln1b[i] = b.ln2b[i] = 0.0f;
    normal(b.qkvw, C * 3 * C, 0.02);
    std::fill(b.qkvb, b.qkvb + 3 * C, 0.0f);
    normal(b.projw, C * C, proj_std);
    std::fill(b.projb, b.projb + C, 0.0f);
    normal(b.fcw, C * 4 * C, 0.02);
    std::fill(b.fcb, b.fcb + 4 * C, 0.0f);
    normal(b.fcprojw, 4 * C * C, proj_std);
    std::fill(b.fcprojb, b.fcprojb + C, 0.0f);
  }
}

std::string hex64(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

// The model's view of the engine, with the time the model spends computing (waits for fetches and
// landings excluded) charged to the compute resource.
class EngineUnits final : public UnitSource {
  template <class F>
  auto timed(F f) -> decltype(f()) {
    const auto t0 = Clock::now();
    auto r = f();
    wait_ += since(t0);
    return r;
  }

 public:
  explicit EngineUnits(offload::Engine& e) : e_(e) {}
  const float* weights(std::size_t u) override { return timed([&] { return e_.weights(u); }); }
  void done_with(std::size_t u) override { e_.done_with(u); }
  float* grads(std::size_t u) override { return timed([&] { return e_.grads(u); }); }
  void grads_done(std::size_t u) override { timed([&] { e_.grads_done(u); return 0; }); }
  double take_wait() {
    const double w = wait_;
    wait_ = 0;
    return w;
  }

 private:
  offload::Engine& e_;
  double wait_ = 0;
};

// The token and target batch on the device, in two slots so that the host can fill and upload the
// next micro batch while the model still reads the previous one. Handoffs: the host rewrites a
// slot's staging only after its last h2d copy (event `copied`, host waits); the h2d stream
// overwrites a slot's device buffers only after the model's last op that reads them (event `used`,
// recorded on compute by done_with); the model reads them after the copies (model_waits_for).
struct Batch {
  DeviceBuffer tok, tgt;
  std::vector<int> tok_h, tgt_h;
  EventHandle copied, used;
  int* tokens() const { return tok.as<int>(); }
  int* targets() const { return tgt.as<int>(); }
};
class BatchSlots {
 public:
  BatchSlots(Device& d, std::size_t n) : dev_(d), n_(n) {
    for (int i = 0; i < 2; ++i) {
      s_[i].tok = DeviceBuffer(d, n * 4, "tokens " + std::to_string(i));
      s_[i].tgt = DeviceBuffer(d, n * 4, "targets " + std::to_string(i));
      s_[i].tok_h.resize(n);
      s_[i].tgt_h.resize(n);
    }
  }
  // Fills the next slot on the host (fill(tokens, targets)) and uploads it.
  template <class Fill>
  Batch& next(Fill fill) {
    Batch& b = s_[k_];
    k_ ^= 1;
    if (b.copied) b.copied->wait();
    fill(b.tok_h.data(), b.tgt_h.data());
    if (b.used) dev_.wait_event(StreamRole::h2d, b.used);
    dev_.copy_to_device(b.tokens(), b.tok_h.data(), n_ * 4, StreamRole::h2d);
    dev_.copy_to_device(b.targets(), b.tgt_h.data(), n_ * 4, StreamRole::h2d);
    b.copied = dev_.record(StreamRole::h2d);
    model_waits_for(dev_, b.copied);
    return b;
  }
  // The model has enqueued every op that reads the slot.
  void done_with(Batch& b) { b.used = dev_.record(StreamRole::compute); }

 private:
  Device& dev_;
  std::size_t n_;
  Batch s_[2];
  int k_ = 0;
};

}  // namespace

TrainResult train(const Config& c, const TrainHooks& hooks) {
  auto log = [&](const std::string& s) {
    if (hooks.log) hooks.log(s);
  };
  // `auto` stays on the CPU device until the CUDA path has been validated on a GPU (see README).
  const bool use_cuda = c.device.type == DeviceType::cuda;
  if (c.device.simd != "auto") cpu_adam::set_simd_cap(cpu_adam::parse_simd_level(c.device.simd));

  const ModelShape shape{c.model.n_layer, c.model.n_head, c.model.d_model, c.model.vocab_size, c.model.seq_len};
  const int B = static_cast<int>(c.micro_batch_size), T = shape.seq_len;
  const std::int64_t GA = c.gradient_accumulation_steps;

  TokenData data = TokenData::load(c.data, shape.vocab_size, T);
  log("data: " + data.description() + "; train " + std::to_string(data.train_tokens()) + " / val " +
      std::to_string(data.val_tokens()) + " tokens");

  const int threads = c.device.threads > 0 ? c.device.threads : cpu_adam::physical_cores();
  std::size_t budget = c.device.memory_budget;
  if (budget == 0 && !use_cuda) budget = query_machine().mem_available / 2;  // CUDA: 0 = the GPU's free memory
  std::unique_ptr<Device> dev;
  if (use_cuda) {
    dev = make_cuda_device(0, budget);
  } else {
    CpuDeviceOptions o;
    o.async = c.device.async;
    o.jitter = JitterSpec{c.device.jitter_seed, c.device.jitter_us};
    dev = make_cpu_device(budget, cpu_device_options_from_env(o));
  }
  ops::Par par(threads);
  log("device: " + dev->name() + ", " + std::to_string(threads) + " threads, cpu_adam " +
      std::string(cpu_adam::to_string(cpu_adam::active_simd())) + ", " + std::string(to_string(c.precision())));

  std::unique_ptr<OpsBackend> backend;
  if (use_cuda)
    backend = cuda::make_cuda_ops(*dev, c.precision());
  else if (dev->ops_stream_ordered())  // the async CPU device: the reference ops as compute-stream work
    backend = make_stream_ops(*dev, std::make_unique<CpuOps>(par));
  else
    backend = std::make_unique<CpuOps>(par);
  GptModel model(shape, B, c.model.activation_checkpointing, *dev, *backend);
  BatchSlots batches(*dev, static_cast<std::size_t>(B) * T);
  std::unique_ptr<StFile> init_file;
  if (!c.model.init_from.empty()) {
    init_file = std::make_unique<StFile>(read_safetensors(c.model.init_from));
    log("init: parameters from " + c.model.init_from + " (" + std::to_string(init_file->tensors.size()) + " tensors)");
  }
  offload::EngineConfig ec = engine_config(c, threads);
  if (use_cuda) ec.kernels = [](Device& d, cpu_adam::HostThreads&) { return cuda::make_engine_kernels(d); };
  offload::Engine engine(ec, *dev, [&](std::size_t u, float* master) {
    if (init_file)
      load_gpt2_unit(*init_file, c.model.init_from, shape, u, master);
    else
      init_unit(master, u, shape, c.train.seed);
  });
  init_file.reset();
  EngineUnits units(engine);
  log("offload: " + engine.describe());
  log("model: " + format_count(count_params(shape)) + " parameters in " + std::to_string(shape.n_layer + 2) +
      " layer units; device memory " + format_bytes(dev->in_use()) + " of " + format_bytes(dev->budget()));

  auto evaluate = [&]() {
    double sum = 0;
    for (int k = 0; k < c.train.eval_batches; ++k) {
      Batch& b = batches.next([&](int* tok, int* tgt) { data.val_batch(k, c.train.eval_batches, B, T, tok, tgt); });
      engine.begin_forward();
      sum += model.forward(units, b.tokens(), b.targets());
      batches.done_with(b);
    }
    units.take_wait();
    return sum / c.train.eval_batches;
  };

  std::ofstream metrics;
  if (!c.train.metrics_file.empty()) {
    metrics.open(c.train.metrics_file, std::ios::trunc);
    if (!metrics) throw ConfigError(c.train.metrics_file + ": cannot open the metrics file for writing");
  }

  TrainResult res;
  LossScaler scaler(c.fp16);
  std::mt19937_64 rng(c.train.seed);
  std::int64_t opt_steps = 0, nonfinite_run = 0, rows_drawn = 0, first_step = 1;
  if (!hooks.resume.empty()) {
    std::string path = hooks.resume;
    if (path == "latest") {
      if (c.train.checkpoint_dir.empty())
        throw ConfigError(c.source + ": --resume latest needs train.checkpoint_dir");
      std::vector<std::string> skipped;
      path = latest_valid_checkpoint(c.train.checkpoint_dir, shape, &skipped);
      for (const auto& sk : skipped) log("resume: " + sk);
      if (path.empty()) log("resume: no valid checkpoint under " + c.train.checkpoint_dir + "; starting from step 0");
    }
    if (!path.empty()) {
      const auto t0 = Clock::now();
      const CheckpointState st = load_checkpoint(path, shape, [&](std::size_t u, const float* ma, const float* mm, const float* vv) {
        engine.write_states(u, ma, mm, vv);
      });
      scaler.restore(st.loss_scale, st.scaler_iter, st.scaler_last_overflow, st.scaler_hysteresis);
      opt_steps = st.opt_steps;
      rows_drawn = st.rows_drawn;
      rng.discard(static_cast<unsigned long long>(rows_drawn));
      res.skipped = st.skipped;
      res.resumed_from = st.step;
      first_step = st.step + 1;
      log("resume: " + path + " (step " + std::to_string(st.step) + ", loaded and verified in " +
          std::to_string(since(t0)).substr(0, 5) + " s)");
    }
  }
  auto checkpoint = [&](std::int64_t step) {
    const auto t0 = Clock::now();
    CheckpointState st;
    st.step = step;
    st.opt_steps = opt_steps;
    st.rows_drawn = rows_drawn;
    st.skipped = res.skipped;
    st.loss_scale = scaler.scale();
    st.scaler_iter = scaler.cur_iter;
    st.scaler_last_overflow = scaler.last_overflow_iter;
    st.scaler_hysteresis = scaler.cur_hysteresis;
    const std::string path = save_checkpoint(c.train.checkpoint_dir, c.train.keep_last, c, shape, st,
                                             [&](std::size_t u, float* ma, float* mm, float* vv) { engine.read_states(u, ma, mm, vv); });
    const double dt = since(t0);
    res.checkpoint_seconds += dt;
    log("checkpoint: " + path + " written in " + std::to_string(dt).substr(0, 5) + " s");
  };
  res.first_val_loss = evaluate();
  res.val_loss = res.first_val_loss;
  engine.take_times();
  log("step " + std::to_string(first_step - 1) + ": val_loss " + std::to_string(res.first_val_loss).substr(0, 6));
  const cpu_adam::AdamHyper hyper0{static_cast<float>(c.optimizer.lr), static_cast<float>(c.optimizer.beta1),
                                   static_cast<float>(c.optimizer.beta2), static_cast<float>(c.optimizer.eps),
                                   static_cast<float>(c.optimizer.weight_decay), c.optimizer.decoupled_weight_decay,
                                   c.optimizer.bias_correction};
  double t_fwd = 0, t_bwd = 0, t_step = 0, tok_s = 0;
  offload::ResourceTimes window{};
  const std::int64_t measure_from = std::min<std::int64_t>(first_step + 1, c.train.steps);  // the first step warms up

  res.steps = first_step - 1;
  for (std::int64_t step = first_step; step <= c.train.steps; ++step) {
    const auto step_start = Clock::now();
    const double scale = scaler.scale();
    double loss_sum = 0;
    for (std::int64_t micro = 0; micro < GA; ++micro) {
      Batch& b = batches.next([&](int* tok, int* tgt) { data.sample_train(rng, B, T, tok, tgt); });
      rows_drawn += B;
      engine.begin_micro_batch(micro);
      auto t0 = Clock::now();
      engine.begin_forward();
      loss_sum += model.forward(units, b.tokens(), b.targets());
      double busy = since(t0) - units.take_wait();
      t_fwd += busy;
      if (!dev->ops_stream_ordered()) engine.add_compute_time(busy);  // else the device measures it
      t0 = Clock::now();
      engine.begin_backward();
      model.backward(units, b.tokens(), b.targets(),
                     static_cast<float>(scale / (static_cast<double>(B) * T * static_cast<double>(GA))));
      busy = since(t0) - units.take_wait();
      t_bwd += busy;
      if (!dev->ops_stream_ordered()) engine.add_compute_time(busy);
      batches.done_with(b);
    }
    const double loss = loss_sum / static_cast<double>(GA);
    const double lr = lr_at(c.scheduler, c.optimizer.lr, opt_steps);
    offload::StepOptions so;
    so.loss_scale = scale;
    so.gradient_clipping = c.gradient_clipping;
    so.hyper = hyper0;
    so.hyper.lr = static_cast<float>(lr);
    so.step = opt_steps + 1;
    const offload::StepOutcome out = engine.step(so);
    const double norm = out.norm;
    bool skipped = false;
    if (!out.finite) {
      skipped = true;
      ++res.skipped;
      if (c.precision() == Precision::fp16 && scaler.dynamic()) {
        const double before = scaler.scale();
        scaler.update(true);
        log("step " + std::to_string(step) + ": OVERFLOW, skipping step; loss scale " + std::to_string(before) + " -> " +
            std::to_string(scaler.scale()));
      } else {
        log("step " + std::to_string(step) + ": non-finite gradients, skipping step");
        if (++nonfinite_run >= 50)
          throw Error("gradients were NaN/Inf for 50 consecutive steps (last loss " + std::to_string(loss) + "): the run has diverged",
                      "lower optimizer.params.lr or check the data");
      }
    } else {
      nonfinite_run = 0;
      scaler.update(false);
      ++opt_steps;
    }
    const double dt = since(step_start);
    tok_s = static_cast<double>(B) * T * static_cast<double>(GA) / dt;
    res.steps = step;
    res.loss = loss;
    const offload::ResourceTimes rt = engine.take_times();
    if (step >= measure_from) {
      t_step += dt;
      window.compute += rt.compute, window.h2d += rt.h2d, window.d2h += rt.d2h, window.host += rt.host;
      window.nvme_read += rt.nvme_read, window.nvme_write += rt.nvme_write;
      res.measured_steps++;
    }

    if (metrics.is_open())
      metrics << "{\"step\": " << step << ", \"loss\": " << loss << ", \"lr\": " << lr << ", \"loss_scale\": " << scale
              << ", \"grad_norm\": " << (std::isfinite(norm) ? norm : -1.0) << ", \"skipped\": " << (skipped ? "true" : "false")
              << ", \"tokens_per_s\": " << tok_s << ", \"step_s\": " << dt << ", \"busy_s\": {\"compute\": " << rt.compute
              << ", \"h2d\": " << rt.h2d << ", \"d2h\": " << rt.d2h << ", \"host\": " << rt.host
              << ", \"nvme_read\": " << rt.nvme_read << ", \"nvme_write\": " << rt.nvme_write << "}}\n";
    if (step % c.steps_per_print == 0 || step == c.train.steps) {
      char line[512];
      std::snprintf(line, sizeof line, "step %5" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | scale %g | norm %.3f | %.0f tok/s",
                    step, c.train.steps, loss, lr, scale, norm, tok_s);
      std::string sline = line;
      if (c.wall_clock_breakdown) {
        std::snprintf(line, sizeof line, " | fwd %.1f ms bwd %.1f ms", 1e3 * t_fwd / c.steps_per_print,
                      1e3 * t_bwd / c.steps_per_print);
        sline += line;
      }
      if (c.zero.offload_optimizer.device != OffloadDevice::none || c.zero.offload_param.device != OffloadDevice::none) {
        std::snprintf(line, sizeof line,
                      " | busy ms: compute %.0f h2d %.0f d2h %.0f host %.0f nvme r %.0f w %.0f | overlap %.2f", 1e3 * rt.compute,
                      1e3 * rt.h2d, 1e3 * rt.d2h, 1e3 * rt.host, 1e3 * rt.nvme_read, 1e3 * rt.nvme_write,
                      rt.busiest() > 0 ? dt / rt.busiest() : 0.0);
        sline += line;
      }
      t_fwd = t_bwd = 0;
      log(sline);
    }
    const bool stop = hooks.stop && hooks.stop->load();
    if ((c.train.eval_interval > 0 && step % c.train.eval_interval == 0) || step == c.train.steps || stop) {
      res.val_loss = evaluate();
      engine.take_times();
      if (metrics.is_open()) metrics << "{\"step\": " << step << ", \"val_loss\": " << res.val_loss << "}\n";
      log("step " + std::to_string(step) + ": val_loss " + std::to_string(res.val_loss).substr(0, 6));
    }
    const bool save = !c.train.checkpoint_dir.empty() &&
                      ((c.train.checkpoint_interval > 0 && step % c.train.checkpoint_interval == 0) || step == c.train.steps || stop);
    if (save) checkpoint(step);
    if (stop) {
      res.interrupted = true;
      log("interrupted: stopping after step " + std::to_string(step));
      break;
    }
  }
  engine.synchronize();
  std::uint64_t h = fnv1a64(nullptr, 0);
  std::vector<float> buf;
  for (std::size_t u = 0; u < static_cast<std::size_t>(shape.n_layer) + 2; ++u) {
    buf.resize(static_cast<std::size_t>(layer_units(shape)[u].params));
    engine.read_master(u, buf.data());
    h = fnv1a64(buf.data(), buf.size() * 4, h);
  }
  res.params_digest = hex64(h);
  res.tokens_per_s = tok_s;
  res.peak_device_bytes = dev->peak();
  res.device_budget = dev->budget();
  res.pinned_capacity = engine.pinned_capacity();
  res.pinned_peak = engine.pinned_peak();
  res.busy = {window.compute, window.h2d, window.d2h, window.host, window.nvme_read, window.nvme_write};
  res.step_seconds = res.measured_steps ? t_step / static_cast<double>(res.measured_steps) : 0;
  return res;
}

}  // namespace zinf
