// io/files.h — reading a user's files safely and writing outputs all-or-nothing.
//
// Reading: only regular files are read. A FIFO would block the open (or the read) until some other
// process writes to it, a device may never end, a directory fails deep inside a library with a
// message naming nothing; so each is refused up front, before anything can block, with one
// ConfigError line (exit code 2) naming the role (the config key or flag) and the path.
//
// Writing: an output is built under a temporary name beside its final place and renamed into place
// only when complete and on disk (fsync). Any failure — a full disk (ENOSPC), a file size limit
// (EFBIG), an exception from the caller — removes the temporary and leaves whatever was at the
// final path untouched.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

namespace zinf {

// A regular file open for reading.
class InputFile {
 public:
  // Opens `path`; `what` names its role in errors ("data.path", "model.init_from", "--tokenizer").
  // A missing or unreadable path, a directory, FIFO, device or socket is a ConfigError
  // "<what> <path>: <why>". The open itself never blocks (O_NONBLOCK until the type is known).
  InputFile(const std::string& path, std::string what);
  ~InputFile();
  InputFile(InputFile&& o) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  InputFile& operator=(InputFile&&) = delete;

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads the whole file; a read failure is an IoError naming the file.
  std::string read_all() const;
  // Reads up to n bytes at offset `at` into dst, fewer only where the file ends; returns the bytes
  // read. A read failure is an IoError naming the file and the offset.
  std::size_t read_at(void* dst, std::size_t n, std::uint64_t at) const;

 private:
  std::string path_, what_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// The whole of a regular file (see InputFile).
std::string read_input_file(const std::string& path, const std::string& what);

// The whole of a regular text file (JSON, a config): as read_input_file, and a NUL byte anywhere is a
// ConfigError "<what> <path>: holds a NUL byte at offset N, not text". (JSON readers stop at the first
// NUL, so a document followed by NULs, or by anything after one, would otherwise read as whole.)
std::string read_input_text(const std::string& path, const std::string& what);

// Whether `a` and `b` name the same existing file or directory (same st_dev and st_ino, so a
// second name through a link or another spelling of the path counts too). False when either is missing.
bool same_file(const std::string& a, const std::string& b);

// A file written all-or-nothing: the bytes go to "<path>.tmp-<pid>"; commit() fsyncs it, renames
// it over `path` and fsyncs the directory. Destroyed without commit() (an error, an exception), the
// temporary is removed and `path` keeps what it held.
class OutputFile {
 public:
  // `what` names the output in errors ("--output", "the token file").
  explicit OutputFile(std::string path, std::string what = "output");
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Writes all n bytes (buffered); a failed write is an IoError naming the file and errno's text.
  void write(const void* data, std::size_t n);
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  void flush_buffer();
  std::string path_, what_, tmp_;
  int fd_ = -1;
  std::string buf_;
  bool committed_ = false;
};

// A folder written all-or-nothing. The files go into a temporary sibling folder (temp_path());
// commit() then carries over every entry of an existing folder at `path` that `replaced(name)` does
// not claim (hard links, so nothing is copied), and swaps the new folder in with one atomic rename
// (renameat2 RENAME_EXCHANGE; where the filesystem lacks it, two renames). The old folder is then
// removed. Destroyed without commit(), the temporary folder is removed and `path` is untouched.
class OutputFolder {
 public:
  OutputFolder(std::string path, std::function<bool(const std::string& name)> replaced, std::string what = "output");
  ~OutputFolder();
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  const std::string& temp_path() const { return tmp_; }
  void commit();

 private:
  std::string path_, what_, tmp_;
  std::string created_;  // the outermost folder created for the output ("" when none was)
  std::function<bool(const std::string&)> replaced_;
  bool committed_ = false;
};

// fsyncs a file or directory by path (errors are reported as IoError naming it).
void fsync_path(const std::string& path);

// Writes all n bytes to fd, retrying short writes and EINTR. Returns 0, or the errno of the write
// that failed (EIO for a write that wrote nothing).
int write_all(int fd, const void* data, std::size_t n);

}  // namespace zinf
