// train.cpp — the training loop with every state on the device (zinf/train.h).
//
// One optimizer step:
//   for each micro batch: zero grad32w; forward; backward with dscale = loss_scale / (B·T·GA);
//                         round grad32w to grad16 (16-bit runs); with GA > 1 add it into gradacc
//   norm: sum of squares of the gradients the Update will read, unit by unit in order (fixed order)
//   non-finite → skip (fp16: the loss scaler backs off); else clip coefficient, then per unit the
//   fused Update writes master, m, v and param16; param16 → fp32 working weights for the next step.
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "model/gpt.h"
#include "zinf/cpu_adam/adam.h"
#include "zinf/cpu_adam/convert.h"
#include "zinf/cpu_adam/host_pool.h"
#include "zinf/data.h"
#include "zinf/device.h"
#include "zinf/error.h"
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

struct Unit {
  std::size_t n = 0;
  DeviceBuffer master, m, v, param16, work, grad32w, grad16, gradacc;
};

std::string hex64(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

}  // namespace

TrainResult train(const Config& c, const TrainHooks& hooks) {
  auto log = [&](const std::string& s) {
    if (hooks.log) hooks.log(s);
  };
  if (c.device.type == DeviceType::cuda)
    throw ConfigError(c.source + ": device.type: cuda: this build trains on the CPU device only so far",
                      "use device.type cpu (or auto)");
  if (c.zero.offload_optimizer.device != OffloadDevice::none || c.zero.offload_param.device != OffloadDevice::none)
    log("note: offload is planned but not scheduled yet (issue 6); training with every state on the device");
  if (c.device.simd != "auto") cpu_adam::set_simd_cap(cpu_adam::parse_simd_level(c.device.simd));

  const ModelShape shape{c.model.n_layer, c.model.n_head, c.model.d_model, c.model.vocab_size, c.model.seq_len};
  const int B = static_cast<int>(c.micro_batch_size), T = shape.seq_len;
  const std::int64_t GA = c.gradient_accumulation_steps;
  const Precision prec = c.precision();
  const bool mixed = prec != Precision::fp32;
  const cpu_adam::HalfType half = prec == Precision::bf16 ? cpu_adam::HalfType::bf16 : cpu_adam::HalfType::fp16;
  const cpu_adam::GradType grad16_type = prec == Precision::bf16 ? cpu_adam::GradType::bf16 : cpu_adam::GradType::fp16;

  TokenData data = TokenData::load(c.data, shape.vocab_size, T);
  log("data: " + data.description() + "; train " + std::to_string(data.train_tokens()) + " / val " +
      std::to_string(data.val_tokens()) + " tokens");

  const int threads = c.device.threads > 0 ? c.device.threads : cpu_adam::physical_cores();
  std::size_t budget = c.device.memory_budget;
  if (budget == 0) budget = query_machine().mem_available / 2;
  auto dev = make_cpu_device(budget);
  ops::Par par(threads);
  cpu_adam::HostPool pool(threads);
  log("device: " + dev->name() + ", " + std::to_string(threads) + " threads, cpu_adam " +
      std::string(cpu_adam::to_string(cpu_adam::active_simd())) + ", " + std::string(to_string(prec)));

  // ---- states -------------------------------------------------------------------------------------
  std::vector<Unit> units;
  std::vector<const float*> weights;
  std::vector<float*> grads;
  const auto layout = layer_units(shape);
  for (std::size_t u = 0; u < layout.size(); ++u) {
    Unit x;
    x.n = static_cast<std::size_t>(layout[u].params);
    const std::string& nm = layout[u].name;
    x.master = DeviceBuffer(*dev, x.n * 4, nm + " master");
    x.m = DeviceBuffer(*dev, x.n * 4, nm + " adam.m");
    x.v = DeviceBuffer(*dev, x.n * 4, nm + " adam.v");
    x.grad32w = DeviceBuffer(*dev, x.n * 4, nm + " grad (fp32 work)");
    if (mixed) {
      x.param16 = DeviceBuffer(*dev, x.n * 2, nm + " param16");
      x.work = DeviceBuffer(*dev, x.n * 4, nm + " fp32 working weights");
      x.grad16 = DeviceBuffer(*dev, x.n * 2, nm + " grad16");
    }
    if (GA > 1) x.gradacc = DeviceBuffer(*dev, x.n * 4, nm + " grad32 (accumulation)");
    init_unit(x.master.as<float>(), u, shape, c.train.seed);
    std::memset(x.m.as<float>(), 0, x.n * 4);
    std::memset(x.v.as<float>(), 0, x.n * 4);
    if (mixed) {
      auto* p16 = x.param16.as<std::uint16_t>();
      if (half == cpu_adam::HalfType::fp16) {
        cpu_adam::fp32_to_fp16(x.master.as<float>(), p16, x.n);
        cpu_adam::fp16_to_fp32(p16, x.work.as<float>(), x.n);
      } else {
        cpu_adam::fp32_to_bf16(x.master.as<float>(), p16, x.n);
        cpu_adam::bf16_to_fp32(p16, x.work.as<float>(), x.n);
      }
    }
    weights.push_back(mixed ? x.work.as<float>() : x.master.as<float>());
    grads.push_back(x.grad32w.as<float>());
    units.push_back(std::move(x));
  }
  std::int64_t n_params = 0;
  for (const auto& u : units) n_params += static_cast<std::int64_t>(u.n);
  GptModel model(shape, B, c.model.activation_checkpointing, *dev, par);
  DeviceBuffer tok(*dev, static_cast<std::size_t>(B) * T * 4, "tokens"), tgt(*dev, static_cast<std::size_t>(B) * T * 4, "targets");
  int* tokens = tok.as<int>();
  int* targets = tgt.as<int>();
  log("model: " + format_count(n_params) + " parameters in " + std::to_string(units.size()) + " layer units; device memory " +
      format_bytes(dev->in_use()) + " of " + format_bytes(dev->budget()));

  auto evaluate = [&]() {
    double sum = 0;
    for (int k = 0; k < c.train.eval_batches; ++k) {
      data.val_batch(k, c.train.eval_batches, B, T, tokens, targets);
      double l = 0;
      dev->launch(StreamRole::compute, [&] { l = model.forward(weights, tokens, targets); });
      dev->synchronize(StreamRole::compute);
      sum += l;
    }
    return sum / c.train.eval_batches;
  };

  std::ofstream metrics;
  if (!c.train.metrics_file.empty()) {
    metrics.open(c.train.metrics_file, std::ios::trunc);
    if (!metrics) throw ConfigError(c.train.metrics_file + ": cannot open the metrics file for writing");
  }

  TrainResult res;
  res.first_val_loss = evaluate();
  res.val_loss = res.first_val_loss;
  log("step 0: val_loss " + std::to_string(res.first_val_loss).substr(0, 6));
  LossScaler scaler(c.fp16);
  std::mt19937_64 rng(c.train.seed);
  std::int64_t opt_steps = 0, nonfinite_run = 0;
  const cpu_adam::AdamHyper hyper0{static_cast<float>(c.optimizer.lr), static_cast<float>(c.optimizer.beta1),
                                   static_cast<float>(c.optimizer.beta2), static_cast<float>(c.optimizer.eps),
                                   static_cast<float>(c.optimizer.weight_decay), c.optimizer.decoupled_weight_decay,
                                   c.optimizer.bias_correction};
  double t_fwd = 0, t_bwd = 0, t_upd = 0, tok_s = 0;

  for (std::int64_t step = 1; step <= c.train.steps; ++step) {
    const auto t_step = Clock::now();
    const double scale = scaler.scale();
    double loss_sum = 0;
    for (std::int64_t micro = 0; micro < GA; ++micro) {
      data.sample_train(rng, B, T, tokens, targets);
      auto t0 = Clock::now();
      double l = 0;
      dev->launch(StreamRole::compute, [&] {
        for (auto& u : units) std::memset(u.grad32w.as<float>(), 0, u.n * 4);
        l = model.forward(weights, tokens, targets);
      });
      dev->synchronize(StreamRole::compute);
      t_fwd += since(t0);
      loss_sum += l;
      t0 = Clock::now();
      const float dscale = static_cast<float>(scale / (static_cast<double>(B) * T * static_cast<double>(GA)));
      dev->launch(StreamRole::compute, [&] {
        model.backward(weights, grads, tokens, targets, dscale);
        for (auto& u : units) {
          float* g = u.grad32w.as<float>();
          if (mixed) {  // the gradient as a 16-bit device would hold it
            auto* g16 = u.grad16.as<std::uint16_t>();
            if (half == cpu_adam::HalfType::fp16) cpu_adam::fp32_to_fp16(g, g16, u.n); else cpu_adam::fp32_to_bf16(g, g16, u.n);
            if (GA > 1) {
              if (half == cpu_adam::HalfType::fp16) cpu_adam::fp16_to_fp32(g16, g, u.n); else cpu_adam::bf16_to_fp32(g16, g, u.n);
            }
          }
          if (GA > 1) {
            float* acc = u.gradacc.as<float>();
            if (micro == 0) std::memcpy(acc, g, u.n * 4); else ops::add_inplace(par, acc, g, u.n);
          }
        }
      });
      dev->synchronize(StreamRole::compute);
      t_bwd += since(t0);
    }
    const double loss = loss_sum / static_cast<double>(GA);

    // ---- the global norm, in unit order -------------------------------------------------------------
    const auto t0 = Clock::now();
    auto source = [&](Unit& u) -> std::pair<const void*, cpu_adam::GradType> {
      if (GA > 1) return {u.gradacc.as<float>(), cpu_adam::GradType::fp32};
      if (mixed) return {u.grad16.as<std::uint16_t>(), grad16_type};
      return {u.grad32w.as<float>(), cpu_adam::GradType::fp32};
    };
    double sumsq = 0;
    bool finite = true;
    for (auto& u : units) {
      auto [g, gt] = source(u);
      const auto s = cpu_adam::sum_squares(pool, g, gt, u.n);
      sumsq += s.sum;
      finite = finite && s.finite;
    }
    const double norm = std::sqrt(sumsq) / scale;
    const double lr = lr_at(c.scheduler, c.optimizer.lr, opt_steps);
    bool skipped = false;
    if (!finite || !std::isfinite(norm)) {
      skipped = true;
      ++res.skipped;
      if (prec == Precision::fp16 && scaler.dynamic()) {
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
      // DeepSpeed's combined divisor: loss_scale × max(1, (norm + 1e-6) / clip).
      double combined = scale;
      if (c.gradient_clipping > 0) {
        const double coef = (norm + 1e-6) / c.gradient_clipping;
        if (coef > 1) combined *= coef;
      }
      cpu_adam::AdamHyper h = hyper0;
      h.lr = static_cast<float>(lr);
      const cpu_adam::AdamStep st = cpu_adam::make_adam_step(h, opt_steps + 1, static_cast<float>(1.0 / combined));
      for (auto& u : units) {
        auto [g, gt] = source(u);
        cpu_adam::UpdateChunk ch;
        ch.n = u.n;
        ch.grad = g;
        ch.grad_type = gt;
        ch.master = u.master.as<float>();
        ch.m = u.m.as<float>();
        ch.v = u.v.as<float>();
        ch.param16 = mixed ? u.param16.as<std::uint16_t>() : nullptr;
        ch.param16_type = half;
        cpu_adam::adam_update(pool, st, ch);
        if (mixed) {
          if (half == cpu_adam::HalfType::fp16)
            cpu_adam::fp16_to_fp32(u.param16.as<std::uint16_t>(), u.work.as<float>(), u.n);
          else
            cpu_adam::bf16_to_fp32(u.param16.as<std::uint16_t>(), u.work.as<float>(), u.n);
        }
      }
      scaler.update(false);
      ++opt_steps;
    }
    t_upd += since(t0);
    const double dt = since(t_step);
    tok_s = static_cast<double>(B) * T * static_cast<double>(GA) / dt;
    res.steps = step;
    res.loss = loss;

    if (metrics.is_open())
      metrics << "{\"step\": " << step << ", \"loss\": " << loss << ", \"lr\": " << lr << ", \"loss_scale\": " << scale
              << ", \"grad_norm\": " << (std::isfinite(norm) ? norm : -1.0) << ", \"skipped\": " << (skipped ? "true" : "false")
              << ", \"tokens_per_s\": " << tok_s << "}\n";
    if (step % c.steps_per_print == 0 || step == c.train.steps) {
      char line[320];
      std::snprintf(line, sizeof line, "step %5" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | scale %g | norm %.3f | %.0f tok/s",
                    step, c.train.steps, loss, lr, scale, norm, tok_s);
      std::string s = line;
      if (c.wall_clock_breakdown) {
        std::snprintf(line, sizeof line, " | fwd %.1f ms bwd %.1f ms update %.1f ms", 1e3 * t_fwd / c.steps_per_print,
                      1e3 * t_bwd / c.steps_per_print, 1e3 * t_upd / c.steps_per_print);
        s += line;
      }
      t_fwd = t_bwd = t_upd = 0;
      log(s);
    }
    const bool stop = hooks.stop && hooks.stop->load();
    if ((c.train.eval_interval > 0 && step % c.train.eval_interval == 0) || step == c.train.steps || stop) {
      res.val_loss = evaluate();
      if (metrics.is_open()) metrics << "{\"step\": " << step << ", \"val_loss\": " << res.val_loss << "}\n";
      log("step " + std::to_string(step) + ": val_loss " + std::to_string(res.val_loss).substr(0, 6));
    }
    if (stop) {
      res.interrupted = true;
      log("interrupted: stopping after step " + std::to_string(step));
      break;
    }
  }
  std::uint64_t h = fnv1a64(nullptr, 0);
  for (const auto& u : units) h = fnv1a64(u.master.as<float>(), u.n * 4, h);
  res.params_digest = hex64(h);
  res.tokens_per_s = tok_s;
  res.peak_device_bytes = dev->peak();
  return res;
}

}  // namespace zinf
