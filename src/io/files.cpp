// files.cpp — reading a user's files safely and writing outputs all-or-nothing (io/files.h).
#include "io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "zinf/error.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kWriteBuffer = std::size_t{1} << 20;

// Why a path that is not a regular file cannot be read, or "" for a regular file.
std::string not_regular(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "is a directory, not a file";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device, not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  return "is not a regular file";
}

const char* kNotRegularHint =
    "zinf reads only regular files: a pipe or a device could block or never end; save the contents to a file first";

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

InputFile::InputFile(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
  auto refuse = [&](const std::string& why, const std::string& hint = {}) {
    return ConfigError(what_ + " " + path_ + ": " + why, hint);
  };
  // stat first: it has no side effects, so a FIFO or a device is refused before it is even opened.
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) throw refuse("does not exist");
    throw refuse("cannot read (" + errno_text(e) + ")");
  }
  if (const std::string why = not_regular(st.st_mode); !why.empty())
    throw refuse(why, S_ISDIR(st.st_mode) ? std::string() : kNotRegularHint);
  // O_NONBLOCK: should the path have been swapped for a FIFO since the stat, the open still returns.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    const int e = errno;
    if (e == ENOENT) throw refuse("does not exist");
    throw refuse("cannot open (" + errno_text(e) + ")");
  }
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = not_regular(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    throw refuse(why.empty() ? "cannot read" : why, kNotRegularHint);
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& o) noexcept
    : path_(std::move(o.path_)), what_(std::move(o.what_)), fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}

std::size_t InputFile::read_at(void* dst, std::size_t n, std::uint64_t at) const {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, static_cast<char*>(dst) + got, n - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      throw IoError(what_ + " " + path_ + ": read failed at offset " + std::to_string(at + got) + " (" +
                        errno_text(e) + ")",
                    e);
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

std::string InputFile::read_all() const {
  std::string s;
  s.resize(static_cast<std::size_t>(size_));
  std::size_t got = 0;
  while (true) {
    if (got == s.size()) s.resize(s.size() + 65536);  // the file may have grown since fstat
    const ssize_t r = ::pread(fd_, s.data() + got, s.size() - got, static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      throw IoError(what_ + " " + path_ + ": read failed at offset " + std::to_string(got) + " (" + errno_text(e) + ")",
                    e);
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  s.resize(got);
  return s;
}

std::string read_input_file(const std::string& path, const std::string& what) {
  return InputFile(path, what).read_all();
}

std::string read_input_text(const std::string& path, const std::string& what) {
  std::string s = read_input_file(path, what);
  if (const auto nul = s.find('\0'); nul != std::string::npos)
    throw ConfigError(what + " " + path + ": holds a NUL byte at offset " + std::to_string(nul) + ", not text",
                      "a text file (JSON) ends with its document; a NUL byte is damage or another kind of file");
  return s;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw IoError(path + ": cannot open to sync (" + errno_text(e) + ")", e);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {  // EINVAL: the filesystem does not sync (nothing to wait for)
    const int e = errno;
    ::close(fd);
    throw IoError(path + ": fsync failed (" + errno_text(e) + ")", e);
  }
  ::close(fd);
}

// ------------------------------------------------------------------------------------------------

OutputFile::OutputFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)), tmp_(path_ + ".tmp-" + std::to_string(::getpid())) {
  std::error_code ec;
  if (fs::is_directory(path_, ec)) throw ConfigError(what_ + " " + path_ + ": is a directory; a file is expected here");
  // The temporary's name is predictable: a file (or a planted symlink) of that name is removed, never
  // followed or truncated.
  ::unlink(tmp_.c_str());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int e = errno;
    throw ConfigError(what_ + " " + path_ + ": cannot create " + tmp_ + " (" + errno_text(e) + ")");
  }
  buf_.reserve(kWriteBuffer);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

int write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    done += static_cast<std::size_t>(w);
  }
  return 0;
}

void OutputFile::flush_buffer() {
  if (const int e = write_all(fd_, buf_.data(), buf_.size()))
    throw IoError(what_ + " " + path_ + ": write failed (" + errno_text(e) + "); nothing was replaced", e);
  buf_.clear();
}

void OutputFile::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const std::size_t take = std::min(n, kWriteBuffer - buf_.size());
    buf_.append(p, take);
    p += take;
    n -= take;
    if (buf_.size() == kWriteBuffer) flush_buffer();
  }
}

void OutputFile::commit() {
  flush_buffer();
  if (::fsync(fd_) != 0 && errno != EINVAL) {
    const int e = errno;
    throw IoError(what_ + " " + path_ + ": fsync failed (" + errno_text(e) + ")", e);
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int e = errno;
    throw IoError(what_ + " " + path_ + ": close failed (" + errno_text(e) + ")", e);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    throw IoError(what_ + " " + path_ + ": cannot rename the finished file into place (" + errno_text(e) + ")", e);
  }
  committed_ = true;
  fs::path dir = fs::path(path_).parent_path();
  fsync_path(dir.empty() ? "." : dir.string());
}

// ------------------------------------------------------------------------------------------------

OutputFolder::OutputFolder(std::string path, std::function<bool(const std::string& name)> replaced, std::string what)
    : what_(std::move(what)), replaced_(std::move(replaced)) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/" names the folder out
  std::error_code ec;
  if (fs::is_symlink(p, ec) && fs::is_directory(p, ec)) p = fs::canonical(p, ec);  // swap the folder, not the link
  path_ = p.string();
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    throw ConfigError(what_ + " " + path_ + ": exists and is not a folder; a folder is written here");
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec)) {
    // Folders created for the output go again should it fail: the outermost one is remembered.
    for (fs::path a = parent; !a.empty() && !fs::exists(a, ec); a = a.parent_path()) {
      created_ = a.string();
      if (a == a.parent_path()) break;
    }
    fs::create_directories(parent, ec);
    if (ec)
      throw ConfigError(what_ + " " + path_ + ": cannot create the folder " + parent.string() + " (" + ec.message() +
                        ")");
  }
  tmp_ = (parent / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
  fs::remove_all(tmp_, ec);
  if (!fs::create_directory(tmp_, ec) || ec)
    throw ConfigError(what_ + " " + path_ + ": cannot create the temporary folder " + tmp_ + " (" +
                      (ec ? ec.message() : std::string("it exists")) + ")");
}

OutputFolder::~OutputFolder() {
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // after commit(): the old folder
  if (!committed_ && !created_.empty()) fs::remove_all(created_, ec);
}

void OutputFolder::commit() {
  std::error_code ec;
  const bool existed = fs::is_directory(path_, ec);
  if (existed) {
    // Keep what the caller does not replace (a tokenizer, a README): linked into the new folder.
    for (const auto& e : fs::directory_iterator(path_, ec)) {
      const std::string name = e.path().filename().string();
      if (replaced_(name)) continue;
      const fs::path to = fs::path(tmp_) / name;
      std::error_code lec;
      fs::copy(e.path(), to,
               fs::copy_options::recursive | fs::copy_options::copy_symlinks | fs::copy_options::create_hard_links,
               lec);
      if (lec) {  // links refused (another owner, a filesystem without them): copy instead
        fs::remove_all(to, lec);
        fs::copy(e.path(), to, fs::copy_options::recursive | fs::copy_options::copy_symlinks, lec);
      }
      if (lec)
        throw IoError(what_ + " " + path_ + ": cannot keep " + e.path().string() + " in the new folder (" +
                          lec.message() + "); the folder is untouched",
                      lec.value());
    }
    if (ec) throw IoError(what_ + " " + path_ + ": cannot list the folder (" + ec.message() + ")", ec.value());
    fs::permissions(tmp_, fs::status(path_, ec).permissions(), ec);
  }
  fsync_path(tmp_);
  if (!existed) {
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      throw IoError(what_ + " " + path_ + ": cannot rename the finished folder into place (" + errno_text(e) + ")", e);
    }
  } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) != 0) {
    const int e = errno;
    if (e != EINVAL && e != ENOSYS && e != ENOTSUP)
      throw IoError(what_ + " " + path_ + ": cannot swap the finished folder into place (" + errno_text(e) + ")", e);
    // No atomic exchange on this filesystem: move the old folder aside, then the new one in.
    const std::string old = tmp_ + ".old";
    if (std::rename(path_.c_str(), old.c_str()) != 0) {
      const int e2 = errno;
      throw IoError(what_ + " " + path_ + ": cannot move the old folder aside (" + errno_text(e2) + ")", e2);
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e2 = errno;
      std::rename(old.c_str(), path_.c_str());
      throw IoError(what_ + " " + path_ + ": cannot rename the finished folder into place (" + errno_text(e2) + ")",
                    e2);
    }
    fs::remove_all(tmp_, ec);
    tmp_ = old;
  }
  committed_ = true;
  const fs::path parent = fs::path(path_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

}  // namespace zinf
