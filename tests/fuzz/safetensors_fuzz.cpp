// safetensors_fuzz.cpp — the safetensors reader on arbitrary bytes, both ways zinf reads the format:
// parse_safetensors on the whole file in memory, and StReader, which reads the header from a file
// and each tensor's bytes when asked (here from a memfd). The two must agree on every tensor, every
// tensor they accept must lie inside the data, and reading each one (as stored and transposed) must
// stay inside it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static zinf::fuzz::MemFile file;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  zinf::StFile whole;
  const bool parsed = zinf::fuzz::expect_clean("parse_safetensors",
                                               [&] { whole = zinf::parse_safetensors(bytes, "fuzz.safetensors"); });
  const std::string& path = file.set(data, size);
  std::vector<zinf::StReader> reader;  // zero or one: StReader has no default constructor
  const bool opened = zinf::fuzz::expect_clean("StReader", [&] { reader.emplace_back(path); });
  if (parsed != opened) zinf::fuzz::violated("parse_safetensors and StReader disagree on whether the file is valid");
  if (!parsed) return 0;
  const zinf::StFile& lazy = reader.front().header();
  if (lazy.tensors.size() != whole.tensors.size() || lazy.data_start != whole.data_start)
    zinf::fuzz::violated("parse_safetensors and StReader disagree on the tensors");
  for (std::size_t i = 0; i < whole.tensors.size(); ++i) {
    const zinf::StTensor& t = whole.tensors[i];
    const zinf::StTensor& u = lazy.tensors[i];
    if (t.name != u.name || t.begin != u.begin || t.end != u.end || t.shape != u.shape || t.dtype != u.dtype)
      zinf::fuzz::violated("parse_safetensors and StReader disagree on tensor " + t.name);
    if (t.begin > t.end || whole.data_start + t.end > size)
      zinf::fuzz::violated("tensor " + t.name + " lies outside the file");
    const std::size_t width = t.dtype == zinf::StDtype::f32 ? 4 : 2;
    std::vector<float> out((t.end - t.begin) / width);
    zinf::fuzz::expect_clean("StReader::read", [&] { reader.front().read(u, out.data(), false); });
    if (t.shape.size() == 2)  // a matrix may be read transposed ([rows, cols] into [cols, rows])
      zinf::fuzz::expect_clean("StReader::read transposed", [&] { reader.front().read(u, out.data(), true); });
  }
  return 0;
}
