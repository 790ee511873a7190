// event_file_test.cpp — TensorBoard event files: the CRC against its published check value, records
// read back by zinf's reader and by TensorBoard's own (record reader + protobuf Event), and a
// corrupted byte refused by both.
#include "io/event_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/checkers.h"
#include "common/temp_dir.h"
#include "zinf/error.h"

namespace zinf {
namespace {

// TensorBoard's record reader (with its CRC checks) and protobuf's Event parser, printing every
// event as JSON; exit 3 and "DATALOSS" when a CRC fails.
constexpr const char* kReadEvents = R"PY(
import sys, json
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow, errors
from tensorboard.compat.proto import event_pb2
r = pywrap_tensorflow.PyRecordReader_New(sys.argv[1])
out = []
try:
    while True:
        r.GetNext()
        e = event_pb2.Event.FromString(r.record())
        out.append({"wall_time": e.wall_time, "step": e.step, "file_version": e.file_version,
                    "values": [[v.tag, v.simple_value] for v in e.summary.value]})
except errors.OutOfRangeError:
    pass
except errors.DataLossError as x:
    print("DATALOSS", x)
    sys.exit(3)
print(json.dumps(out))
)PY";

std::string only_event_file(const test::TempDir& dir) {
  const auto names = dir.entries("events.out.tfevents.");
  EXPECT_EQ(names.size(), 1u);
  return names.empty() ? std::string() : dir / names[0];
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(EventFile, Crc32cMatchesTheCheckValue) {
  // CRC-32C("123456789") = 0xE3069283 (the catalogue's check value); masked as TensorBoard masks it.
  const std::uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(EventFile, RecordsReadBackBySelf) {
  test::TempDir dir("event-self");
  double wall = 0;
  {
    EventFileWriter w(dir.path.string());
    w.write_scalars(16, {{"Train/Samples/train_loss", 5.25f}, {"Train/Samples/lr", 3e-3f}}, 1.7e9 + 0.5);
    w.write_scalars(-3, {{"a b", -1.0f}}, 1.7e9 + 1.25);
    wall = 1.7e9 + 1.25;
  }
  const std::string path = only_event_file(dir);
  const auto name = std::filesystem::path(path).filename().string();
  EXPECT_NE(name.find("." + std::to_string(::getpid()) + "."), std::string::npos) << name;
  const auto recs = read_tf_records(path);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(decode_event(recs[0]).file_version, "brain.Event:2");
  const ScalarEvent a = decode_event(recs[1]), b = decode_event(recs[2]);
  EXPECT_EQ(a.step, 16);
  ASSERT_EQ(a.values.size(), 2u);
  EXPECT_EQ(a.values[0].first, "Train/Samples/train_loss");
  EXPECT_EQ(a.values[0].second, 5.25f);
  EXPECT_EQ(a.values[1].second, 3e-3f);
  EXPECT_EQ(b.step, -3);
  EXPECT_EQ(b.wall_time, wall);
  ASSERT_EQ(b.values.size(), 1u);
  EXPECT_EQ(b.values[0].first, "a b");
  EXPECT_EQ(b.values[0].second, -1.0f);
}

TEST(EventFile, CorruptByteIsRefusedBySelf) {
  test::TempDir dir("event-corrupt-self");
  { EventFileWriter(dir.path.string()).write_scalars(1, {{"x", 1.0f}}, 1.0); }
  const std::string path = only_event_file(dir);
  std::string b = bytes_of(path);
  b[b.size() - 6] ^= 0x01;  // inside the last record's data (its value)
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  try {
    read_tf_records(path);
    FAIL() << "a flipped byte was read without complaint";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
  b.resize(b.size() - 2);  // a record cut short
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  EXPECT_THROW(read_tf_records(path), IoError);
}

TEST(EventFile, TensorBoardReadsTheRecords) {
  const std::string py = test::checker_python("tensorboard");
  if (py.empty()) GTEST_SKIP() << test::checker_missing("tensorboard");
  test::TempDir dir("event-tb");
  const std::vector<std::pair<std::string, float>> v1 = {{"Train/Samples/train_loss", 5.5431f},
                                                         {"Train/Samples/lr", 2.5e-4f}};
  const std::vector<std::pair<std::string, float>> v2 = {{"Train/Samples/train_loss", 4.0f},
                                                         {"Train/Samples/busy_ms_disk_vda", 1234.5f}};
  {
    EventFileWriter w(dir.path.string());
    w.write_scalars(8, v1, 1.75e9);
    w.write_scalars(1LL << 40, v2, 1.75e9 + 2);
  }
  const std::string path = only_event_file(dir);
  const auto r = test::run_python(py, kReadEvents, {path});
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.size(), 3u) << r.output;
  EXPECT_EQ(j[0]["file_version"], "brain.Event:2");
  EXPECT_GT(j[0]["wall_time"].get<double>(), 1.6e9);  // now, as the writer opened the file
  const std::vector<std::pair<std::int64_t, std::vector<std::pair<std::string, float>>>> want = {{8, v1},
                                                                                                 {1LL << 40, v2}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    const auto& e = j[i + 1];
    EXPECT_EQ(e["step"].get<std::int64_t>(), want[i].first);
    ASSERT_EQ(e["values"].size(), want[i].second.size());
    for (std::size_t k = 0; k < want[i].second.size(); ++k) {
      EXPECT_EQ(e["values"][k][0].get<std::string>(), want[i].second[k].first);
      EXPECT_EQ(static_cast<float>(e["values"][k][1].get<double>()), want[i].second[k].second);
    }
  }
  EXPECT_EQ(j[2]["wall_time"].get<double>(), 1.75e9 + 2);

  std::string b = bytes_of(path);
  b[b.size() - 6] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  const auto bad = test::run_python(py, kReadEvents, {path});
  EXPECT_EQ(bad.status, 3) << bad.output;
  EXPECT_NE(bad.output.find("DATALOSS"), std::string::npos) << bad.output;
}

TEST(EventFile, UnwritableFolderIsOneError) {
  try {
    EventFileWriter w("/nonexistent-zinf-folder/sub");
    FAIL() << "opened " << w.path();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-zinf-folder/sub/events.out.tfevents."), std::string::npos)
        << e.what();
  }
}

TEST(EventFile, MalformedEventIsAnError) {
  EXPECT_THROW(decode_event(std::string("\x2a\x10\x0a", 3)), Error);  // a summary longer than the message
}

}  // namespace
}  // namespace zinf
