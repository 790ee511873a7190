// io/event_file.h — TensorBoard event files (events.out.tfevents.*), written and read without
// TensorFlow.
//
// An event file is a sequence of TFRecords: a little-endian uint64 length, the masked CRC-32C of
// those 8 bytes, the data, and the masked CRC-32C of the data. Each record's data is one serialized
// tensorflow.Event message; the first holds file_version "brain.Event:2", the others a Summary of
// scalar values (tag, simple_value) at a step. TensorBoard reads every file in a folder, so a
// resumed run adds a new file beside the old ones rather than appending to one.
//
// Thread-safety: an EventFileWriter is used from one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zinf {

// TensorBoard's masked CRC-32C (Castagnoli) of a byte range: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

// One TFRecord around `data` (length, its masked CRC, data, the data's masked CRC).
std::string tf_record(std::string_view data);

// Every record's data in a TFRecord file, each checked against both CRCs. A bad CRC or a record cut
// short is an IoError naming the file and the record's byte offset.
std::vector<std::string> read_tf_records(const std::string& path);

// A scalar as an Event carries it.
struct ScalarEvent {
  double wall_time = 0;  // seconds since the Unix epoch
  std::int64_t step = 0;
  std::vector<std::pair<std::string, float>> values;  // (tag, simple_value)
  std::string file_version;                           // set in the first event of a file only
};

// Serializes / parses one Event message with the fields above (the parser skips fields it does not
// know, as protobuf does, and throws zinf::Error on malformed bytes).
std::string encode_event(const ScalarEvent& e);
ScalarEvent decode_event(std::string_view bytes);

class EventFileWriter {
 public:
  // Creates a new file in `dir` (which must exist): events.out.tfevents.<unix seconds>.<host>.<pid>.<n>,
  // n counting the writers this process opened, and writes the file_version event. An unwritable
  // folder is an IoError naming the file.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // Appends one event holding `values` at `step`, in one write() (so a run killed afterwards keeps
  // it; nothing is buffered in this process). A failed write is an IoError naming the file.
  void write_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& values, double wall_time);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& record);
  std::string path_;
  int fd_ = -1;
};

}  // namespace zinf
