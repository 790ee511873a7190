// export.cpp — `zinf export --checkpoint DIR [--format safetensors] [--dtype fp32|fp16|bf16] --output FILE`.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "zinf/checkpoint.h"
#include "zinf/error.h"
#include "zinf/safetensors.h"

namespace zinf::cli {
namespace {

struct ExportArgs {
  std::string checkpoint, format = "safetensors", dtype = "fp32", output;
};

int run_export(const ExportArgs& a) {
  if (a.format != "safetensors") throw ConfigError("--format: '" + a.format + "' is not supported (safetensors)");
  const StDtype dt = parse_st_dtype(a.dtype);
  const ModelShape shape = checkpoint_shape(a.checkpoint);
  std::vector<std::vector<float>> units;
  for (const auto& u : layer_units(shape)) units.emplace_back(static_cast<std::size_t>(u.params));
  load_checkpoint(a.checkpoint, shape, [&](std::size_t u, const float* master, const float*, const float*) {
    std::copy(master, master + units[u].size(), units[u].begin());
  });
  write_gpt2_safetensors(a.output, shape, units, dt);
  std::printf("exported %s (%d layers, d_model %d) to %s as %s safetensors with GPT-2's tensor names\n", a.checkpoint.c_str(),
              shape.n_layer, shape.d_model, a.output.c_str(), a.dtype.c_str());
  return 0;
}

}  // namespace

Command add_export(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand(
      "export",
      "Write a checkpoint's model as a safetensors file with the tensor names Hugging Face uses for GPT-2 "
      "(wte.weight, h.0.attn.c_attn.weight, …), in fp32, fp16 or bf16; the checkpoint is verified first. "
      "model.init_from loads such a file to fine-tune from it");
  sub->add_option("--checkpoint", args->checkpoint, "A checkpoint directory (train.checkpoint_dir/step-N)")->required()->type_name("DIR");
  sub->add_option("--format", args->format, "Output format")->capture_default_str();
  sub->add_option("--dtype", args->dtype, "fp32, fp16 or bf16")->capture_default_str();
  sub->add_option("-o,--output", args->output, "The file to write")->required()->type_name("FILE");
  return {sub, [args] { return run_export(*args); }};
}

}  // namespace zinf::cli
