// app/train/trace_file.h — a run's Trace (zinf/trace.h) as a Chrome-trace / Perfetto JSON file
// (train.trace_file, `zinf bench step --trace`; docs/trace.md).
//
// The JSON Object format: {"traceEvents": [...], "displayTimeUnit": "ms", "zinf": {...}}. Every span
// is a complete event ("ph": "X") with ts and dur in microseconds from the trace's start, pid the
// track's group (1 device, 2 host, 3 nvme), tid its track and args {"step", "unit" when one}; "ph":
// "M" events name every process and thread used (process_name, thread_name) and order them
// (thread_sort_index). "zinf" holds the steps the file holds and what the caller adds.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "zinf/trace.h"

namespace zinf {

// The trace as the JSON document above; `about` goes into its "zinf" object beside "steps".
nlohmann::json trace_json(const Trace& t, const nlohmann::json& about = nlohmann::json::object());

// Writes trace_json to `path` all-or-nothing (a temporary file renamed over it); throws IoError.
void write_trace_file(const Trace& t, const std::string& path, const nlohmann::json& about = nlohmann::json::object());

// Refuses a trace_file the run could not write, before anything is built: a folder, or a file in a
// folder that does not exist or cannot be written (ConfigError naming `what` and the path).
void check_trace_path(const std::string& path, const std::string& what);

}  // namespace zinf
