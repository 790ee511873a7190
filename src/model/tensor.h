// tensor.h — typed views of device memory, as the op seam (model/backend.h) takes activations and
// weights: a pointer, its element type and its element count. A view owns nothing.
//
// The views let a backend hold its activations and weights in a 16-bit type while the CPU reference
// stays fp32: each backend checks the types it is handed (fp32_data below) and refuses the others
// with a zinf::Error that names the op and the argument, instead of reading bf16 bits as floats.
//
// A plain `float*` converts to an fp32 view whose size is not stated (numel() == kUnsized), so code
// that keeps fp32 buffers as raw pointers calls the seam unchanged; code that knows the size says so
// with TensorView(p, n). Null pointers convert to empty views (an op's optional output or bias).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zinf/error.h"
#include "zinf/types.h"

namespace zinf {

enum class DType : std::uint8_t { fp32, fp16, bf16 };

// The dtype's name in error messages (the config's words for precision live in zinf/types.h).
constexpr std::string_view to_string(DType t) { return enum_name(t, {"fp32", "fp16", "bf16"}); }
constexpr std::size_t dtype_bytes(DType t) { return t == DType::fp32 ? 4 : 2; }
// The dtype a run of precision p computes its 16-bit (or fp32) copies in.
constexpr DType dtype_of(Precision p) {
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::fp16 : DType::fp32;
}

inline constexpr std::size_t kUnsized = static_cast<std::size_t>(-1);

class TensorView {
 public:
  TensorView() = default;
  TensorView(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): an absent optional tensor
  TensorView(float* p, std::size_t n = kUnsized)
      : data_(p), numel_(p ? n : 0) {}  // NOLINT: fp32 buffers pass as they are
  TensorView(void* p, DType t, std::size_t n) : data_(p), dtype_(t), numel_(p ? n : 0) {}

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  std::size_t numel() const { return numel_; }  // kUnsized when the caller did not say
  bool empty() const { return data_ == nullptr; }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::fp32;
  std::size_t numel_ = 0;
};

class ConstTensorView {
 public:
  ConstTensorView() = default;
  ConstTensorView(std::nullptr_t) {}                                                                         // NOLINT
  ConstTensorView(const float* p, std::size_t n = kUnsized) : data_(p), numel_(p ? n : 0) {}                 // NOLINT
  ConstTensorView(float* p, std::size_t n = kUnsized) : ConstTensorView(static_cast<const float*>(p), n) {}  // NOLINT
  ConstTensorView(const TensorView& v) : data_(v.data()), dtype_(v.dtype()), numel_(v.numel()) {}            // NOLINT
  ConstTensorView(const void* p, DType t, std::size_t n) : data_(p), dtype_(t), numel_(p ? n : 0) {}

  const void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  std::size_t numel() const { return numel_; }
  bool empty() const { return data_ == nullptr; }

 private:
  const void* data_ = nullptr;
  DType dtype_ = DType::fp32;
  std::size_t numel_ = 0;
};

// Elements [offset, offset + n) of a view, in its dtype (a weight inside a layer unit, an activation
// inside a buffer). An empty view stays empty; a sized view must hold the range.
inline TensorView slice(const TensorView& v, std::size_t offset, std::size_t n) {
  if (v.empty()) return {};
  ZINF_CHECK(v.numel() == kUnsized || offset + n <= v.numel());
  return TensorView(static_cast<char*>(v.data()) + offset * dtype_bytes(v.dtype()), v.dtype(), n);
}
inline ConstTensorView slice(const ConstTensorView& v, std::size_t offset, std::size_t n) {
  if (v.empty()) return {};
  ZINF_CHECK(v.numel() == kUnsized || offset + n <= v.numel());
  return ConstTensorView(static_cast<const char*>(v.data()) + offset * dtype_bytes(v.dtype()), v.dtype(), n);
}

// Where a view is checked: the backend, the op and the argument, for the error a wrong type raises.
struct OpArgSite {
  const char* backend;
  const char* op;
  const char* names;  // the op's argument names as text, "(a, b, c)"
  std::size_t index;  // which of them

  std::string_view arg() const {  // the index-th name
    std::string_view rest(names);
    for (std::size_t i = 0;; ++i) {
      const std::size_t s = rest.find_first_not_of("(, ");
      if (s == std::string_view::npos) return "?";
      rest.remove_prefix(s);
      const std::string_view name = rest.substr(0, rest.find_first_of(",) "));
      if (i == index) return name;
      rest.remove_prefix(name.size());
    }
  }
};

[[noreturn]] inline void wrong_dtype(const OpArgSite& at, DType got) {
  throw Error(
      std::string(at.backend) + " op " + at.op + ": argument '" + std::string(at.arg()) + "' is " +
          std::string(to_string(got)) + ", but this backend computes in fp32 only",
      "hold this tensor in fp32 on this device, or run on a backend with " + std::string(to_string(got)) + " kernels");
}

// The fp32 pointer behind a view (null for an empty one); any other type is refused.
inline float* fp32_data(const TensorView& v, const OpArgSite& at) {
  if (!v.empty() && v.dtype() != DType::fp32) wrong_dtype(at, v.dtype());
  return static_cast<float*>(v.data());
}
inline const float* fp32_data(const ConstTensorView& v, const OpArgSite& at) {
  if (!v.empty() && v.dtype() != DType::fp32) wrong_dtype(at, v.dtype());
  return static_cast<const float*>(v.data());
}
// Everything that is not a view (sizes, flags, scales, token ids) passes as it is.
template <class T>
T fp32_data(T x, const OpArgSite&) {
  return x;
}

}  // namespace zinf
