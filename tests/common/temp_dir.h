// temp_dir.h — a private folder for one test under the system's temporary directory: created empty,
// removed with everything in it when the object goes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace zinf::test {

class TempDir {
 public:
  // <tmp>/zinf-<tag>-<pid>: the process id keeps concurrent test binaries apart.
  explicit TempDir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("zinf-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;  // a test that made part of it unreadable still ends cleanly
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` inside the folder.
  std::string operator/(const std::string& name) const { return (path / name).string(); }

  // Writes `text` to the file `name` inside the folder.
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }

  // The names directly inside the folder that start with `prefix`, in directory order.
  std::vector<std::string> entries(const std::string& prefix = "") const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path))
      if (e.path().filename().string().rfind(prefix, 0) == 0) names.push_back(e.path().filename().string());
    return names;
  }

  const std::filesystem::path path;
};

}  // namespace zinf::test
