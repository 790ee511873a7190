// io/json_keys.cpp — see json_keys.h.
#include "io/json_keys.h"

#include <memory>
#include <set>
#include <vector>

#include "zinf/error.h"

namespace zinf {

nlohmann::json::parser_callback_t reject_duplicate_keys(std::string where, std::string note) {
  using json = nlohmann::json;
  // One frame per open object or array: its keys so far and the key being read (for the path).
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;
  };
  auto frames = std::make_shared<std::vector<Frame>>();
  return [frames, where = std::move(where), note = std::move(note)](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames->push_back({true, {}, {}}); break;
      case json::parse_event_t::array_start: frames->push_back({false, {}, {}}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames->empty()) frames->pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& f = frames->back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) {
          std::string path;
          for (const Frame& g : *frames) path += g.object ? (path.empty() ? "" : ".") + g.key : "[]";
          throw ConfigError(where + ": " + path + ": the key appears twice in one object" +
                            (note.empty() ? "" : " (" + note + ")") + "; keep one");
        }
        break;
      }
      case json::parse_event_t::value: break;
    }
    return true;
  };
}

}  // namespace zinf
