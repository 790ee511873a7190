// mma.h — the executor's nvcuda::wmma (found before NVIDIA's <mma.h> in the executor build): warp
// matrix fragments for the shapes and types the project's kernels use (m16n16k16; __half or
// __nv_bfloat16 inputs, row- or column-major; float accumulators), with CUDA's rules checked:
//   - every operation is a warp collective: all 32 lanes arrive with the same pointer and stride;
//   - pointers 256-bit (32-byte) aligned, ldm a multiple of 16 bytes (8 16-bit or 4 float elements);
// A fault ends the kernel with a launch failure. Each lane holds the whole 16x16 tile (CUDA leaves
// the element-to-lane mapping unspecified, so kernels may only treat x[] uniformly); a store writes
// each element from one lane (element e from lane e % 32), so a race between a store and another
// warp's access is visible to ThreadSanitizer. The product accumulates in fp32 in k order; the
// tensor cores' own internal order and width are what only a GPU shows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cudax/kernel.h"

namespace zinf::cudax {
void wmma_collective(int op, const void* ptr, unsigned ldm, Site site, const char* name);
int lane_id();
void warp_once(int op, void* lane_args, void (*fn)(void* const* lanes), Site site, const char* name);
}  // namespace zinf::cudax

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the executor's wmma has the m16n16k16 shape only");
  static_assert(std::is_same_v<Use, accumulator> || std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "a matrix_a or matrix_b fragment names its layout");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>),
                "the executor's wmma has __half/__nv_bfloat16 inputs and float accumulators");
  using element_type = T;
  static constexpr int num_elements = 256;
  T x[256];  // row-major (i, j) at x[i * 16 + j] for every use
};

namespace detail {
template <typename T>
inline float to_f(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return __bfloat162float(v);
}
template <typename T>
inline void check_ptr(const T* p, unsigned ldm, zinf::cudax::Site site, const char* name) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) zinf::cudax::kernel_fault(site, "a wmma pointer is not 256-bit aligned");
  if ((ldm * sizeof(T)) % 16 != 0) zinf::cudax::kernel_fault(site, "a wmma ldm is not a multiple of 16 bytes");
  zinf::cudax::wmma_collective(name[0], p, ldm, site, name);
}
}  // namespace detail

#define ZINF_CUDAX_WMMA_SITE ::zinf::cudax::Site site = ::zinf::cudax::Site{__builtin_FILE(), __builtin_LINE()}

template <typename T>
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, T v, ZINF_CUDAX_WMMA_SITE) {
  zinf::cudax::wmma_collective('f', nullptr, 0, site, "wmma::fill_fragment");
  for (float& e : f.x) e = static_cast<float>(v);
}

template <typename Use, typename T, typename L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm, ZINF_CUDAX_WMMA_SITE) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its memory layout");
  detail::check_ptr(p, ldm, site, "load_matrix_sync");
  // matrix_a is M x K, matrix_b is K x N; both 16 x 16: element (r, c) of the operand.
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[r + c * ldm];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l,
                             ZINF_CUDAX_WMMA_SITE) {
  detail::check_ptr(p, ldm, site, "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[r + c * ldm];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l,
                              ZINF_CUDAX_WMMA_SITE) {
  detail::check_ptr(p, ldm, site, "store_matrix_sync");
  const int lane = zinf::cudax::lane_id();
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    (l == mem_row_major ? p[r * ldm + c] : p[r + c * ldm]) = f.x[e];
  }
}

namespace detail {
template <typename T, typename LA, typename LB>
struct MmaArgs {
  fragment<accumulator, 16, 16, 16, float>* d;
  const fragment<matrix_a, 16, 16, 16, T, LA>* a;
  const fragment<matrix_b, 16, 16, 16, T, LB>* b;
  const fragment<accumulator, 16, 16, 16, float>* c;
};
template <typename T, typename LA, typename LB>
inline void product(const MmaArgs<T, LA, LB>& m, float* out) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float acc = m.c->x[i * 16 + j];
      for (int k = 0; k < 16; ++k) acc += to_f(m.a->x[i * 16 + k]) * to_f(m.b->x[k * 16 + j]);
      out[i * 16 + j] = acc;
    }
}
// All lanes' products at once: lanes whose operands equal lane 0's (the usual case: they loaded the
// same tiles) share its product; any other lane gets its own.
template <typename T, typename LA, typename LB>
inline void warp_mma(void* const* lanes) {
  using Args = MmaArgs<T, LA, LB>;
  // Lane 0's operands, copied before any d is written (d may be the same fragment as c).
  const Args& l0 = *static_cast<const Args*>(lanes[0]);
  const fragment<matrix_a, 16, 16, 16, T, LA> a0 = *l0.a;
  const fragment<matrix_b, 16, 16, 16, T, LB> b0 = *l0.b;
  const fragment<accumulator, 16, 16, 16, float> c0 = *l0.c;
  const Args snap{nullptr, &a0, &b0, &c0};
  float p0[256];
  product(snap, p0);
  static_assert(sizeof(float[256]) == sizeof(c0.x));
  float out[32][256];
  for (int l = 0; l < 32; ++l) {
    const Args& m = *static_cast<const Args*>(lanes[l]);
    const bool same = std::memcmp(m.a->x, a0.x, sizeof a0.x) == 0 && std::memcmp(m.b->x, b0.x, sizeof b0.x) == 0 &&
                      std::memcmp(m.c->x, c0.x, sizeof c0.x) == 0;
    if (same) std::memcpy(out[l], p0, sizeof p0);
    else product(m, out[l]);
  }
  for (int l = 0; l < 32; ++l) std::memcpy(static_cast<const Args*>(lanes[l])->d->x, out[l], sizeof out[l]);
}
}  // namespace detail

template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c,
                     ZINF_CUDAX_WMMA_SITE) {
  detail::MmaArgs<T, LA, LB> args{&d, &a, &b, &c};
  zinf::cudax::warp_once('m', &args, &detail::warp_mma<T, LA, LB>, site, "mma_sync");
}

#undef ZINF_CUDAX_WMMA_SITE

}  // namespace nvcuda::wmma
