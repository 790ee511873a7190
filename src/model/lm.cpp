// lm.cpp — the model of a shape's family (lm.h).
#include "model/lm.h"

#include "model/gpt.h"
#include "model/init.h"
#include "model/llama.h"

namespace zinf {

std::unique_ptr<LanguageModel> make_model(const ModelShape& s, int B, bool checkpointing, Device& dev, OpsBackend& ops) {
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
