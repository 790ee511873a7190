// config_fuzz.cpp — the run-config reader (a DeepSpeed ds_config plus zinf's sections) on arbitrary
// bytes. The input up to the first NUL byte is the JSON text; NUL-separated pieces after it are
// `--set dotted.path=value` overrides, applied before validation as the command line does.
// Besides "parses or throws zinf::Error", a config that parses must parse again from its own
// resolved form (what a checkpoint stores) to the same resolved form.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "app/config/config.h"
#include "fuzz_common.h"
#include "model/shape.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = all.find('\0');
  const std::string_view text = all.substr(0, nul);
  std::vector<std::string> overrides;
  for (std::size_t at = nul; at != std::string_view::npos && overrides.size() < 8;) {
    const std::size_t next = all.find('\0', at + 1);
    overrides.emplace_back(all.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1));
    at = next;
  }
  zinf::Config c;
  if (!zinf::fuzz::expect_clean("parse_config", [&] { c = zinf::parse_config(text, overrides, "fuzz.json"); }))
    return 0;
  zinf::fuzz::expect_clean("model_shape", [&] { (void)zinf::model_shape(c.model); });
  zinf::Config again;
  if (!zinf::fuzz::expect_clean("parse_config of a resolved config",
                                [&] { again = zinf::parse_config(c.resolved_json, {}, "resolved"); }))
    zinf::fuzz::violated("the resolved config is rejected:\n" + c.resolved_json);
  if (again.resolved_json != c.resolved_json)
    zinf::fuzz::violated("the resolved config does not resolve to itself:\n" + c.resolved_json + "\n" +
                         again.resolved_json);
  return 0;
}
