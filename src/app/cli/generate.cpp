// generate.cpp — `zinf generate --model PATH --prompt TEXT`: text from a trained model, with a KV cache
// (model/generate.h), on the CPU device or CUDA. The new text goes to stdout, a summary line (tokens
// and tokens/s of the prompt's prefill and of the decoding) to stderr; --json prints one JSON object
// instead of both.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "app/config/device_choice.h"
#include "app/train/checkpoint.h"
#include "commands.h"
#include "io/files.h"
#include "io/hf.h"
#include "io/instruct.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/generate.h"
#include "zinf/backends/backend.h"
#include "zinf/error.h"

namespace zinf::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGenerateAbout =
    "Generate text from a model: a zinf checkpoint (train.checkpoint_dir/step-N, or the checkpoint_dir itself for its "
    "newest), a GPT-2 safetensors file (zinf export), or a Hugging Face folder (GPT-2 or the Llama family). The prompt "
    "is fed once, then one token at a time over a KV cache. Greedy with --temperature 0 (the default); the same --seed "
    "gives the "
    "same tokens on every run. Prints the new text on stdout and a summary on stderr (or one JSON object with "
    "--json)";

struct GenerateArgs {
  std::string model, prompt, prompt_file, tokenizer, device = "auto", chat, system;
  int max_new_tokens = 64, top_k = 0, n_head = 0, threads = 0;
  double temperature = 0, top_p = 1;
  std::uint64_t seed = 1;
  bool json = false, no_bos = false, no_special = false;
};

// The model's weights, unit by unit, on the host, and where a tokenizer may lie beside it.
struct HostModel {
  ModelShape shape;
  std::vector<std::vector<float>> units;
  std::string what, folder;  // a description for the summary; the folder to look for a tokenizer in
};

std::vector<std::vector<float>> empty_units(const ModelShape& s) {
  std::vector<std::vector<float>> u;
  for (const auto& l : layer_units(s)) u.emplace_back(static_cast<std::size_t>(l.params));
  return u;
}

HostModel from_checkpoint(const std::string& dir) {
  // Shared with other readers; refused while a run writes (and prunes) checkpoints in that folder.
  const CheckpointLock lock(checkpoint_folder(dir), CheckpointLock::Mode::read, "--model");
  HostModel m;
  m.shape = checkpoint_shape(dir);
  m.units = load_checkpoint_weights(dir, m.shape);
  m.what = "checkpoint " + dir;
  return m;
}

// A GPT-2 safetensors file: the shape from its tensors (wte [V,C], wpe [T,C], h.N), heads from
// --n-head or GPT-2's head width of 64.
HostModel from_safetensors(const std::string& path, int n_head) {
  const StFile f = read_safetensors(path, "--model");
  auto find = [&](const std::string& name) {
    const StTensor* t = f.find(name);
    return t ? t : f.find("transformer." + name);
  };
  const StTensor *wte = find("wte.weight"), *wpe = find("wpe.weight");
  if (!wte || !wpe || wte->shape.size() != 2 || wpe->shape.size() != 2)
    throw ConfigError("--model " + path + ": not a GPT-2 safetensors file (no 2-d wte.weight and wpe.weight)",
                      "a Llama-family model loads from its Hugging Face folder");
  ModelShape s;
  s.family = ModelFamily::gpt2;
  s.vocab_size = static_cast<int>(wte->shape[0]);
  s.d_model = static_cast<int>(wte->shape[1]);
  s.seq_len = static_cast<int>(wpe->shape[0]);
  while (find("h." + std::to_string(s.n_layer) + ".ln_1.weight")) ++s.n_layer;
  if (n_head <= 0) {
    if (s.d_model % 64 != 0)
      throw ConfigError("--model " + path + ": d_model " + std::to_string(s.d_model) +
                        " is not a multiple of GPT-2's head width 64; give the head count with --n-head");
    n_head = s.d_model / 64;
  }
  if (s.d_model % n_head != 0)
    throw ConfigError("--n-head " + std::to_string(n_head) + " does not divide d_model " + std::to_string(s.d_model));
  s.n_head = n_head;
  check_gpt2_tensor_set(f, path, s);
  HostModel m;
  m.shape = s;
  m.units = empty_units(s);
  for (std::size_t u = 0; u < m.units.size(); ++u) load_gpt2_unit(f, path, s, u, m.units[u].data());
  m.what = "GPT-2 safetensors " + path;
  m.folder = fs::path(path).parent_path().string();
  return m;
}

HostModel load_model(const GenerateArgs& a) {
  std::error_code ec;
  const std::string& p = a.model;
  if (!fs::exists(p, ec))
    throw ConfigError("--model " + p + ": does not exist",
                      "give a checkpoint folder, a run's checkpoint_dir, a safetensors file or a Hugging Face folder");
  if (!fs::is_directory(p, ec)) return from_safetensors(p, a.n_head);
  if (is_hf_folder(p)) {
    HostModel m;
    m.shape = hf_shape(p, 0);
    HfModelReader r(p);
    r.check(m.shape);
    m.units = empty_units(m.shape);
    for (std::size_t u = 0; u < m.units.size(); ++u) r.load_unit(m.shape, u, m.units[u].data());
    m.what = "Hugging Face folder " + p + " (" + r.weights() + ")";
    m.folder = p;
    return m;
  }
  if (fs::exists(fs::path(p) / "manifest.json", ec)) return from_checkpoint(p);
  const auto found = list_checkpoints(p);
  if (found.empty())
    throw ConfigError(
        "--model " + p + ": a folder with no checkpoint (manifest.json), no step-N checkpoints and no config.json",
        "give a checkpoint folder, a run's checkpoint_dir, a safetensors file or a Hugging Face folder");
  return from_checkpoint(found.front().second);
}

std::unique_ptr<Tokenizer> pick_tokenizer(const GenerateArgs& a, const HostModel& m) {
  if (!a.tokenizer.empty()) return open_tokenizer(a.tokenizer, "--tokenizer");
  std::error_code ec;
  if (!m.folder.empty() &&
      (fs::exists(fs::path(m.folder) / "tokenizer.json", ec) || fs::exists(fs::path(m.folder) / "tokenizer.model", ec)))
    return open_tokenizer(m.folder, "--model");
  return byte_tokenizer();
}

std::string read_prompt(const GenerateArgs& a) {
  return a.prompt_file.empty() ? a.prompt : read_input_file(a.prompt_file, "--prompt-file");
}

const char* stop_reason(const GenerateResult& r) {
  return r.stopped_at_eos ? "eos" : r.context_full ? "context_full" : "max_new_tokens";
}

int run_generate(const GenerateArgs& a) {
  if (a.prompt.empty() == a.prompt_file.empty())
    throw ConfigError("give the prompt with one of --prompt TEXT or --prompt-file FILE");
  if (!a.system.empty() && a.chat.empty())
    throw ConfigError("--system needs --chat (a system turn is part of a chat prompt)");
  if (!a.chat.empty()) parse_chat_template_name(a.chat, "--chat");  // refused before the model is read
  if (a.no_special && !a.chat.empty())
    throw ConfigError("--no-special applies to a plain prompt; a --chat prompt is encoded as its template renders it");
  if (a.max_new_tokens < 0) throw ConfigError("--max-new-tokens: " + std::to_string(a.max_new_tokens) + " is negative");
  if (a.device != "auto" && a.device != "cpu" && a.device != "cuda")
    throw ConfigError("--device: '" + a.device + "' is not a device (auto, cpu, cuda)");
  // auto means what device.type auto means for a run (app/config/device_choice.h).
  const DeviceChoice device = resolve_device_type(a.device == "cuda"  ? DeviceType::cuda
                                                  : a.device == "cpu" ? DeviceType::cpu
                                                                      : DeviceType::automatic);
  SamplingOptions so;
  so.temperature = a.temperature, so.top_k = a.top_k, so.top_p = a.top_p, so.seed = a.seed;
  Sampler check(so);  // refuses bad sampling options before the model is read
  const std::string text = read_prompt(a);
  HostModel m = load_model(a);
  auto tok = pick_tokenizer(a, m);
  if (tok->vocab_size() > m.shape.vocab_size)
    throw ConfigError("the tokenizer (" + tok->description() + ") has " + std::to_string(tok->vocab_size()) +
                          " tokens, the model " + std::to_string(m.shape.vocab_size),
                      "give the model's own tokenizer with --tokenizer");
  so.vocab = tok->vocab_size();  // a vocabulary padded past the tokenizer's never yields a padding id
  std::vector<int> prompt;
  std::string chat_note;
  std::optional<ChatFormat> format;
  if (!a.chat.empty()) {
    // The prompt is one user turn (after an optional system turn), rendered as in training on chat
    // data, followed by the assistant's header: the model answers as the assistant.
    const std::string where = !a.tokenizer.empty() ? a.tokenizer : m.folder;
    const ChatTemplate asked = parse_chat_template_name(a.chat, "--chat");
    format = chat_format(asked, where, *tok, "--chat");
    chat_note = chat_template_name(format->kind);
    if (asked == ChatTemplate::automatic || asked == ChatTemplate::model) chat_note += " (" + format->reason + ")";
  }
  const PromptOptions po = prompt_options(a.system, a.no_bos, a.no_special, format ? &*format : nullptr);
  for (std::uint32_t id : encode_generation_prompt(text, *tok, po)) prompt.push_back(static_cast<int>(id));
  std::vector<int> eos;
  for (std::uint32_t id : tok->eos_ids()) eos.push_back(static_cast<int>(id));

  const int threads = a.threads > 0 ? a.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const backends::Backend& be = backends::backend_for(device.type);
  backends::DeviceSpec spec;
  auto dev = be.make_device(spec);
  auto ops = be.make_ops(*dev, Precision::fp32, threads, Kernels::reference);
  std::vector<DeviceBuffer> weights;
  std::vector<ConstTensorView> views;
  for (std::size_t u = 0; u < m.units.size(); ++u) {
    const std::size_t n = m.units[u].size();
    weights.emplace_back(*dev, std::max<std::size_t>(n, 1) * sizeof(float), "generation weights");
    dev->copy_to_device(weights.back().as<void>(), m.units[u].data(), n * sizeof(float), StreamRole::compute);
    views.emplace_back(weights.back().as<float>(), n);
  }
  dev->synchronize(StreamRole::compute);
  m.units.clear();
  m.units.shrink_to_fit();
  const int capacity = std::min(m.shape.seq_len, static_cast<int>(prompt.size()) + std::max(a.max_new_tokens, 1));
  KvDecoder dec(m.shape, *dev, *ops, views, capacity);
  const GenerateResult r = generate(dec, prompt, a.max_new_tokens, so, eos);

  // The text is the answer: an EOS that ended it stays in `ids` but is not written out.
  std::vector<std::uint32_t> out_ids(r.ids.begin(), r.ids.end() - (r.stopped_at_eos && !r.ids.empty() ? 1 : 0));
  const std::string out = tok->decode(out_ids);
  const double prefill_tps = r.prefill_s > 0 ? r.prompt_tokens / r.prefill_s : 0;
  const int decoded = std::max(0, static_cast<int>(r.ids.size()) - 1);  // the first new token comes from the prefill
  const double decode_tps = r.decode_s > 0 && decoded > 0 ? decoded / r.decode_s : 0;
  if (a.json) {
    nlohmann::json j = {{"model", m.what},
                        {"tokenizer", tok->description()},
                        {"device", dev->name()},
                        {"device_reason", device.reason},
                        {"threads", threads},
                        {"prompt", text},
                        {"prompt_ids", prompt},
                        {"ids", r.ids},
                        {"text", out},
                        {"stop", stop_reason(r)},
                        {"prompt_tokens", r.prompt_tokens},
                        {"new_tokens", r.ids.size()},
                        {"seed", a.seed},
                        {"temperature", a.temperature},
                        {"top_k", a.top_k},
                        {"top_p", a.top_p},
                        {"timings",
                         {{"prefill_s", r.prefill_s},
                          {"decode_s", r.decode_s},
                          {"prefill_tokens_per_s", prefill_tps},
                          {"decode_tokens_per_s", decode_tps}}},
                        {"kv_cache_bytes", dec.cache_bytes()}};
    if (!chat_note.empty()) j["chat_template"] = chat_note;
    // Generated bytes need not be UTF-8 (a byte model, a split character): replaced in the JSON only.
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  if (!chat_note.empty()) std::fprintf(stderr, "generate: chat template %s\n", chat_note.c_str());
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr,
               "generate: %d prompt tokens, %zu new (stop: %s); prefill %.4f s (%.1f tokens/s), decode %.4f s (%.1f "
               "tokens/s); %s (%s), threads %d, KV cache %.2f MiB\n",
               r.prompt_tokens, r.ids.size(), stop_reason(r), r.prefill_s, prefill_tps, r.decode_s, decode_tps,
               dev->name().c_str(), device.reason.c_str(), threads, static_cast<double>(dec.cache_bytes()) / (1 << 20));
  return 0;
}

}  // namespace

Command add_generate(CLI::App& app) {
  auto [sub, args] = add_subcommand<GenerateArgs>(app, "generate", kGenerateAbout);
  sub->add_option("--model", args->model,
                  "A checkpoint folder (step-N), a run's checkpoint_dir (its newest), a GPT-2 safetensors file or a "
                  "Hugging Face folder")
      ->required()
      ->type_name("PATH");
  sub->add_option("--prompt", args->prompt, "The prompt text")->type_name("TEXT");
  sub->add_option("--prompt-file", args->prompt_file, "Read the prompt from a file")->type_name("FILE");
  sub->add_option("--max-new-tokens", args->max_new_tokens, "New tokens at most")->capture_default_str();
  sub->add_option("--temperature", args->temperature, "0: greedy; else softmax(logits / temperature)")
      ->capture_default_str();
  sub->add_option("--top-k", args->top_k, "Sample from the k most likely tokens (0: all)")->capture_default_str();
  sub->add_option("--top-p", args->top_p, "Sample from the most likely tokens whose probability reaches p")
      ->capture_default_str();
  sub->add_option("--seed", args->seed, "The sampler's seed")->capture_default_str();
  sub->add_option("--device", args->device, "auto, cpu or cuda (auto: as device.type auto in a run config)")
      ->capture_default_str();
  sub->add_option("--threads", args->threads, "CPU threads of the ops (0: every core)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--tokenizer", args->tokenizer,
                  "A tokenizer.json, tokenizer.model or a folder (default: the model folder's, else bytes)")
      ->type_name("PATH");
  sub->add_option("--n-head", args->n_head, "GPT-2 safetensors: attention heads (default d_model / 64)")
      ->check(CLI::Range(std::int64_t{1}, shape_limits::heads));
  sub->add_option("--chat", args->chat,
                  "Render the prompt as a user turn with a chat format (auto, model, llama3, chatml, qwen2, none; auto "
                  "and model read the model folder's template as data.chat_template does) and answer as the assistant")
      ->type_name("TEMPLATE");
  sub->add_option("--system", args->system, "With --chat: a system turn before the prompt")->type_name("TEXT");
  sub->add_flag("--no-bos", args->no_bos,
                "Add none of the tokens the tokenizer's post-processor puts around a prompt (Llama 3: its BOS); "
                "with --chat none, no BOS");
  sub->add_flag("--no-special", args->no_special,
                "Encode special-token text in the prompt (\"<|eot_id|>\") as plain text; by default it becomes the "
                "special token, as the tokenizer does");
  sub->add_flag("--json", args->json, "Print one JSON object (prompt, ids, text, timings)");
  return command(sub, args, run_generate);
}

}  // namespace zinf::cli
