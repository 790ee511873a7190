// lm.cpp — the model of a shape's family (lm.h).
#include "model/lm.h"

#include <algorithm>
#include <vector>

#include "model/gpt.h"
#include "model/host_math.h"
#include "model/init.h"
#include "model/llama.h"

namespace zinf {

double forward_mean_loss(LanguageModel& m, Device& dev, UnitSource& src, const int* tokens, const int* targets) {
  m.forward(src, tokens, targets);
  std::vector<float> rows(static_cast<std::size_t>(m.rows()));
  if (dev.ops_stream_ordered()) {  // behind the model's ops on the compute stream
    dev.copy_to_host(rows.data(), m.row_losses(), rows.size() * sizeof(float), StreamRole::compute);
    dev.synchronize(StreamRole::compute);
  } else {  // the ops have run; the CPU device's memory is host memory
    std::copy(m.row_losses(), m.row_losses() + rows.size(), rows.begin());
  }
  return ops::mean_loss(rows.data(), m.rows());
}

std::unique_ptr<LanguageModel> make_model(const ModelShape& s, int B, bool checkpointing, Device& dev,
                                          OpsBackend& ops) {
  if (s.family == ModelFamily::llama) return std::make_unique<LlamaModel>(s, B, checkpointing, dev, ops);
  return std::make_unique<GptModel>(s, B, checkpointing, dev, ops);
}

void init_model_unit(float* p, std::size_t unit, const ModelShape& s, std::uint64_t seed) {
  if (s.family == ModelFamily::llama)
    llama_init_unit(p, unit, s, seed);
  else
    gpt2_init_unit(p, unit, s, seed);
}

}  // namespace zinf
