// event_file.cpp — see event_file.h.
//
// Why the three messages are encoded here rather than by protoc-generated code: Debian's
// libsentencepiece.so.0 carries its own copy of protobuf-lite and exports its google::protobuf
// symbols (the weak template instances generated code also emits among them). Generated code built
// against the system's libprotobuf would share those names with a different protobuf version in the
// same process, and the dynamic linker would bind one library's calls to the other's code. Event,
// Summary and Summary.Value need five fields of four wire types, written below in a few lines each,
// and the tests read the files back with TensorBoard's own reader.
//
// The field numbers are tensorflow/core/util/event.proto's and summary.proto's:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
#include "io/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <boost/crc.hpp>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "io/files.h"
#include "zinf/error.h"

namespace zinf {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5;

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<std::uint64_t>(field << 3 | wire)); }
template <class T>
void put_le(std::string& out, T v) {  // fixed-width fields are little-endian, as x86-64 stores them
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof v);
}
void put_bytes(std::string& out, int field, std::string_view s) {
  put_key(out, field, kBytes);
  put_varint(out, s.size());
  out.append(s);
}

// A reader over one message's bytes; a malformed message is a zinf::Error.
class Wire {
 public:
  explicit Wire(std::string_view b) : b_(b) {}
  bool more() const { return i_ < b_.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i_ >= b_.size()) bad("a varint runs past the end");
      const auto c = static_cast<unsigned char>(b_[i_++]);
      v |= static_cast<std::uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    bad("a varint longer than 10 bytes");
  }
  template <class T>
  T fixed() {
    T v;
    std::memcpy(&v, take(sizeof v).data(), sizeof v);
    return v;
  }
  std::string_view bytes() { return take(varint()); }
  void skip(int wire) {
    switch (wire) {
      case kVarint: varint(); break;
      case kFixed64: take(8); break;
      case kBytes: bytes(); break;
      case kFixed32: take(4); break;
      default: bad("wire type " + std::to_string(wire));
    }
  }

 private:
  std::string_view take(std::uint64_t n) {
    if (n > b_.size() - i_) bad("a field runs past the end");
    std::string_view s = b_.substr(i_, n);
    i_ += n;
    return s;
  }
  [[noreturn]] static void bad(const std::string& why) { throw Error("event message: malformed (" + why + ")"); }
  std::string_view b_;
  std::size_t i_ = 0;
};

std::string encode_value(const std::string& tag, float v) {
  std::string s;
  put_bytes(s, 1, tag);
  put_key(s, 2, kFixed32);
  put_le(s, v);
  return s;
}

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0 || !h[0]) return "localhost";
  return h;
}

}  // namespace

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  // CRC-32C: polynomial 0x1EDC6F41, reflected in and out, initial and final XOR all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  const std::uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tf_record(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_le(r, static_cast<std::uint64_t>(data.size()));
  put_le(r, masked_crc32c(r.data(), 8));
  r.append(data);
  put_le(r, masked_crc32c(data.data(), data.size()));
  return r;
}

std::vector<std::string> read_tf_records(const std::string& path) {
  const std::string all = read_input_file(path, "event file");
  std::vector<std::string> out;
  std::size_t at = 0;
  auto fail = [&](const std::string& why) -> IoError {
    return IoError(path + ": record at byte " + std::to_string(at) + ": " + why, EIO);
  };
  while (at < all.size()) {
    if (all.size() - at < 12) throw fail("cut short in its header");
    std::uint64_t len;
    std::uint32_t len_crc;
    std::memcpy(&len, all.data() + at, 8);
    std::memcpy(&len_crc, all.data() + at + 8, 4);
    if (masked_crc32c(all.data() + at, 8) != len_crc) throw fail("the length's CRC does not match");
    if (len > all.size() - at - 12 || all.size() - at - 12 - len < 4) throw fail("cut short in its data");
    const char* data = all.data() + at + 12;
    std::uint32_t data_crc;
    std::memcpy(&data_crc, data + len, 4);
    if (masked_crc32c(data, len) != data_crc) throw fail("the data's CRC does not match");
    out.emplace_back(data, len);
    at += 12 + len + 4;
  }
  return out;
}

std::string encode_event(const ScalarEvent& e) {
  std::string s;
  put_key(s, 1, kFixed64);
  put_le(s, e.wall_time);
  put_key(s, 2, kVarint);
  put_varint(s, static_cast<std::uint64_t>(e.step));  // int64: a negative step is ten bytes, as protobuf writes it
  if (!e.file_version.empty()) put_bytes(s, 3, e.file_version);
  if (!e.values.empty()) {
    std::string summary;
    for (const auto& [tag, v] : e.values) put_bytes(summary, 1, encode_value(tag, v));
    put_bytes(s, 5, summary);
  }
  return s;
}

ScalarEvent decode_event(std::string_view bytes) {
  ScalarEvent e;
  Wire w(bytes);
  while (w.more()) {
    const std::uint64_t key = w.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == kFixed64) {
      e.wall_time = w.fixed<double>();
    } else if (field == 2 && wire == kVarint) {
      e.step = static_cast<std::int64_t>(w.varint());
    } else if (field == 3 && wire == kBytes) {
      e.file_version = std::string(w.bytes());
    } else if (field == 5 && wire == kBytes) {
      Wire summary(w.bytes());
      while (summary.more()) {
        const std::uint64_t k = summary.varint();
        if (k >> 3 != 1 || (k & 7) != kBytes) {
          summary.skip(static_cast<int>(k & 7));
          continue;
        }
        Wire value(summary.bytes());
        std::pair<std::string, float> tv{"", 0.0f};
        while (value.more()) {
          const std::uint64_t vk = value.varint();
          if (vk >> 3 == 1 && (vk & 7) == kBytes)
            tv.first = std::string(value.bytes());
          else if (vk >> 3 == 2 && (vk & 7) == kFixed32)
            tv.second = value.fixed<float>();
          else
            value.skip(static_cast<int>(vk & 7));
        }
        e.values.push_back(std::move(tv));
      }
    } else {
      w.skip(wire);
    }
  }
  return e;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  static std::atomic<int> opened{0};
  const std::string name = "events.out.tfevents." + std::to_string(static_cast<long long>(std::time(nullptr))) + "." +
                           host_name() + "." + std::to_string(::getpid()) + "." + std::to_string(opened++);
  path_ = dir.empty() ? name : (dir.back() == '/' ? dir + name : dir + "/" + name);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int e = errno;
    throw IoError(path_ + ": cannot create the TensorBoard event file (" + std::strerror(e) + ")", e);
  }
  ScalarEvent first;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  first.wall_time = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  first.file_version = "brain.Event:2";
  append(tf_record(encode_event(first)));
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFileWriter::write_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& values,
                                    double wall_time) {
  ScalarEvent e;
  e.wall_time = wall_time;
  e.step = step;
  e.values = values;
  append(tf_record(encode_event(e)));
}

void EventFileWriter::append(const std::string& record) {
  if (const int e = write_all(fd_, record.data(), record.size()))
    throw IoError(path_ + ": write failed (" + std::strerror(e) + ")", e);
}

}  // namespace zinf
