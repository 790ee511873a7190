// metrics_steps.h — a `train.metrics_file` read back as the numerics-contract tests compare runs: each
// step line's loss, loss scale, gradient norm and skip (as JSON text, so that equal means bit for bit),
// and the NVMe bytes the steps after the first read.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace zinf::test {

struct MetricsSteps {
  std::vector<std::string> steps;    // {"grad_norm","loss","loss_scale","skipped"} of each step line
  double nvme_read_after_first = 0;  // bytes read from NVMe in the windows of steps 2, 3, …
};

inline MetricsSteps metrics_steps(const std::string& path) {
  MetricsSteps out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;  // the evaluations' lines
    out.steps.push_back(nlohmann::json{{"loss", j["loss"]},
                                       {"loss_scale", j["loss_scale"]},
                                       {"grad_norm", j["grad_norm"]},
                                       {"skipped", j["skipped"]}}
                            .dump());
    if (out.steps.size() > 1 && j.contains("nvme_bytes")) out.nvme_read_after_first += j["nvme_bytes"]["read"].get<double>();
  }
  return out;
}

}  // namespace zinf::test
