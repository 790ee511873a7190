// io/json_keys.h — one rule for every JSON document zinf reads (a run config, a JSONL example): a key
// given twice in one object is an error naming its path. nlohmann's parser would keep the last value
// silently, so a file that says two things would be read as saying one.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace zinf {

// A parser callback for nlohmann::json::parse that throws ConfigError
// "<where>: <path>: the key appears twice in one object[ (<note>)]; keep one" at the second
// occurrence (path: the keys from the root, "[]" for an array level). Each call makes a fresh one:
// it keeps the open objects' keys while one document is parsed.
nlohmann::json::parser_callback_t reject_duplicate_keys(std::string where, std::string note = "");

}  // namespace zinf
