// export.cpp — `zinf export --checkpoint DIR [--format safetensors|hf] [--dtype fp32|fp16|bf16] --output PATH`.
// The output appears whole or not at all: a file is written beside its place and renamed over it, a
// folder is built beside its place and swapped in (its earlier weights, index and config.json
// replaced, other files kept); any failure leaves the previous output as it was.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "app/config/config.h"
#include "app/train/checkpoint.h"
#include "commands.h"
#include "io/files.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "zinf/error.h"

namespace zinf::cli {
namespace {

namespace fs = std::filesystem;

// The output must not overwrite what it is made from: not the checkpoint folder or any file in it,
// and a folder export (which swaps a whole folder) not a folder the checkpoint lies in.
void check_output(const std::string& output, const std::string& checkpoint, bool folder) {
  std::error_code ec;
  if (!fs::is_directory(checkpoint, ec))
    throw ConfigError(
        "--checkpoint " + checkpoint + ": " + (fs::exists(checkpoint, ec) ? "is not a folder" : "does not exist"),
        "a checkpoint is a folder train.checkpoint_dir/step-N");
  auto refuse = [&](const std::string& what) {
    return ConfigError("--output " + output + ": is " + what +
                       "; export writes its own file or folder and never replaces its input");
  };
  if (same_file(output, checkpoint)) throw refuse("the checkpoint folder " + checkpoint);
  for (const auto& e : fs::directory_iterator(checkpoint, ec))
    if (same_file(output, e.path().string())) throw refuse("the checkpoint's " + e.path().string());
  if (folder)
    for (fs::path p = fs::absolute(checkpoint, ec).lexically_normal(); p.has_relative_path(); p = p.parent_path())
      if (same_file(output, p.string())) throw refuse("a folder holding the checkpoint (" + p.string() + ")");
}

// `zinf export --help`.
constexpr const char* kExportAbout =
    "Write a checkpoint's model for the usual tools, in fp32, fp16 or bf16; the checkpoint is verified first. "
    "--format safetensors (GPT-2): one file with the tensor names Hugging Face uses for GPT-2 (wte.weight, "
    "h.0.attn.c_attn.weight, …). --format hf (GPT-2 or the llama family): a folder with config.json and "
    "model.safetensors, or shards with their index, in Hugging Face's names and layouts (GPT2LMHeadModel's, "
    "LlamaForCausalLM's). model.init_from loads either to fine-tune from it. All or nothing: the output is built "
    "beside its place and moved in at the end; a folder's earlier config.json, *.safetensors and index are "
    "replaced, its other files (tokenizer, README) kept";

struct ExportArgs {
  std::string checkpoint, format = "safetensors", dtype = "fp32", output, shard_size = "5GB";
};

int run_export(const ExportArgs& a) {
  if (a.format != "safetensors" && a.format != "hf")
    throw ConfigError("--format: '" + a.format + "' is not supported (safetensors, hf)");
  const StDtype dt = parse_st_dtype(a.dtype);
  check_output(a.output, a.checkpoint, a.format == "hf");
  // Shared with other readers; refused while a run writes (and prunes) checkpoints in that folder.
  const CheckpointLock lock(checkpoint_folder(a.checkpoint), CheckpointLock::Mode::read, "--checkpoint");
  const ModelShape shape = checkpoint_shape(a.checkpoint);
  if (a.format == "safetensors" && shape.family != ModelFamily::gpt2)
    throw ConfigError(
        "--format safetensors writes GPT-2's tensor names; a llama-family checkpoint exports with --format hf");
  const std::vector<std::vector<float>> units = load_checkpoint_weights(a.checkpoint, shape);
  if (a.format == "hf") {
    write_hf_folder(a.output, shape, units, dt, static_cast<std::uint64_t>(parse_bytes(a.shard_size, "--shard-size")));
    std::printf("exported %s (%d layers, d_model %d) to the folder %s in Hugging Face's layout, %s\n",
                a.checkpoint.c_str(), shape.n_layer, shape.d_model, a.output.c_str(), a.dtype.c_str());
    return 0;
  }
  write_gpt2_safetensors(a.output, shape, units, dt);
  std::printf("exported %s (%d layers, d_model %d) to %s as %s safetensors with GPT-2's tensor names\n",
              a.checkpoint.c_str(), shape.n_layer, shape.d_model, a.output.c_str(), a.dtype.c_str());
  return 0;
}

}  // namespace

Command add_export(CLI::App& app) {
  auto [sub, args] = add_subcommand<ExportArgs>(app, "export", kExportAbout);
  sub->add_option("--checkpoint", args->checkpoint, "A checkpoint directory (train.checkpoint_dir/step-N)")
      ->required()
      ->type_name("DIR");
  sub->add_option("--format", args->format,
                  "safetensors (GPT-2's one file) or hf (a Hugging Face folder: GPT-2 or the llama family)")
      ->capture_default_str();
  sub->add_option("--shard-size", args->shard_size, "--format hf: the largest shard (e.g. 5GB, 500MB)")
      ->capture_default_str();
  sub->add_option("--dtype", args->dtype, "fp32, fp16 or bf16")->capture_default_str();
  sub->add_option("-o,--output", args->output, "The file (safetensors) or folder (hf) to write")
      ->required()
      ->type_name("PATH");
  return command(sub, args, run_export);
}

}  // namespace zinf::cli
