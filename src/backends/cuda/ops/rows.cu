// rows.cu — the fast path's row, column and elementwise kernels (rows.cuh), templated on the storage
// type S and dispatched on DType by each launcher.
//
// Layout of the work:
// - Row ops (norms): a warp per row up to C = 1024 columns, a 256-thread block per row above, so a
//   row's loads stay coalesced and the row statistics come from shuffles (xor butterflies: every lane
//   ends with the same bits) and, for a block, the warps' sums added in warp order.
// - Loads and stores move 16 bytes at a time (4 fp32 or 8 16-bit values) where every pointer is
//   16-byte aligned and the row length a multiple of the pack; otherwise the same kernel runs with
//   one element per access. The summation order of every reduction does not depend on that choice.
// - Column sums (norm weight gradients, column_sum): pass 1 gives each block a fixed tile of columns
//   and a fixed chunk of rows (eight row streams per column, added in stream order); pass 2 adds the
//   chunks in order into the fp32 gradient. The split depends on R and C only, never on the GPU.
// - Embedding gradients: one block sorts the row indices by token (a stable LSD radix sort, four bits
//   a pass, no atomics), then one thread per (token, column pack) adds its rows in row order.
// - Elementwise ops: grid-stride loops over 16-byte packs and a scalar tail.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.cuh"
#include "cuda/ops/rows.cuh"
#include "cuda/round16.cuh"

namespace zinf::cuda::fast {
namespace {

using ops::blocks_for;

// ---- storage types --------------------------------------------------------------------------------
template <class S>
__device__ __forceinline__ float widen(S v);
template <>
__device__ __forceinline__ float widen<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float widen<__half>(__half v) {
  return __half2float(v);
}
template <class S>
__device__ __forceinline__ S narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) {
  return v;
}
// 16-bit stores round by the one rule of cuda/round16.cuh: cpu_adam/spec.h's, which the CPU twin uses.
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return round_bf16(v);
}
template <>
__device__ __forceinline__ __half narrow<__half>(float v) {
  return round_fp16(v);
}

// Elements of S in one 16-byte access.
template <class S>
constexpr int kVec = static_cast<int>(16 / sizeof(S));

template <class S, int N>
struct alignas(sizeof(S) * N) Pack {
  S v[N];
};
template <class S, int N>
__device__ __forceinline__ void load(const S* p, float (&f)[N]) {
  const Pack<S, N> k = *reinterpret_cast<const Pack<S, N>*>(p);
#pragma unroll
  for (int j = 0; j < N; ++j) f[j] = widen<S>(k.v[j]);
}
template <class S, int N>
__device__ __forceinline__ void store(S* p, const float (&f)[N]) {
  Pack<S, N> k;
#pragma unroll
  for (int j = 0; j < N; ++j) k.v[j] = narrow<S>(f[j]);
  *reinterpret_cast<Pack<S, N>*>(p) = k;
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class T>
struct Tag {
  using type = T;
};
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::fp32: f(Tag<float>{}); return;
    case DType::bf16: f(Tag<__nv_bfloat16>{}); return;
    case DType::fp16: f(Tag<__half>{}); return;
  }
  throw Error("fast kernels: unknown storage dtype");
}

constexpr int kBlock = 256;        // threads of every row, column and elementwise block
constexpr int kWarpRowMax = 1024;  // widest row given to one warp; wider rows get a block
constexpr unsigned kFull = 0xffffffffu;

// ---- row reductions -------------------------------------------------------------------------------
// Sum over the TPR threads of a row group (a warp, or the whole block when TPR = kBlock). Every thread
// of the group gets the same bits. sm: kBlock / 32 floats of shared memory (block groups only).
template <int TPR>
__device__ __forceinline__ float group_sum(float v, float* sm) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  if constexpr (TPR > 32) {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if ((threadIdx.x & 31) == 0) sm[warp] = v;
    __syncthreads();
    v = 0;
#pragma unroll
    for (int i = 0; i < TPR / 32; ++i) v += sm[i];
    __syncthreads();  // sm is reused by the next reduction
  }
  return v;
}

// Row r of this thread's group and its lane in the group; rows past R exit whole groups.
template <int TPR>
__device__ __forceinline__ int group_row() {
  return static_cast<int>(blockIdx.x) * (kBlock / TPR) + static_cast<int>(threadIdx.x) / TPR;
}
template <int TPR>
__device__ __forceinline__ int group_lane() {
  return static_cast<int>(threadIdx.x) % TPR;
}

template <class S, int N, int TPR>
__global__ void __launch_bounds__(kBlock)
    layernorm_forward_kernel(S* out, float* mean, float* rstd, const S* inp, const S* w, const S* b, int R, int C) {
  __shared__ float sm[kBlock / 32];
  const int r = group_row<TPR>(), lane = group_lane<TPR>();
  if (r >= R) return;  // whole warps only (a block group always has its row)
  const S* x = inp + static_cast<std::size_t>(r) * C;
  float sum = 0;
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N];
    load<S, N>(x + i, v);
#pragma unroll
    for (int j = 0; j < N; ++j) sum += v[j];
  }
  const float m = group_sum<TPR>(sum, sm) / static_cast<float>(C);
  float var = 0;
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N];
    load<S, N>(x + i, v);
#pragma unroll
    for (int j = 0; j < N; ++j) var += (v[j] - m) * (v[j] - m);
  }
  const float s = 1.0f / sqrtf(group_sum<TPR>(var, sm) / static_cast<float>(C) + 1e-5f);
  S* o = out + static_cast<std::size_t>(r) * C;
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N], wv[N], bv[N], y[N];
    load<S, N>(x + i, v);
    load<S, N>(w + i, wv);
    load<S, N>(b + i, bv);
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = (v[j] - m) * s * wv[j] + bv[j];
    store<S, N>(o + i, y);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = s;
  }
}

// dinp += (w·dy − mean(w·dy) − norm·mean(w·dy·norm))·rstd, in the CPU reference's order of operations.
template <class S, int N, int TPR>
__global__ void __launch_bounds__(kBlock) layernorm_backward_rows(S* dinp, const S* dout, const S* inp, const S* w,
                                                                  const float* mean, const float* rstd, int R, int C) {
  __shared__ float sm[kBlock / 32];
  const int r = group_row<TPR>(), lane = group_lane<TPR>();
  if (r >= R) return;
  const std::size_t off = static_cast<std::size_t>(r) * C;
  const float m = mean[r], s = rstd[r];
  float a = 0, bsum = 0;
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N], dy[N], wv[N];
    load<S, N>(inp + off + i, v);
    load<S, N>(dout + off + i, dy);
    load<S, N>(w + i, wv);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float dn = wv[j] * dy[j];
      a += dn;
      bsum += dn * (v[j] - m) * s;
    }
  }
  a = group_sum<TPR>(a, sm) / static_cast<float>(C);
  bsum = group_sum<TPR>(bsum, sm) / static_cast<float>(C);
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N], dy[N], wv[N], dx[N];
    load<S, N>(inp + off + i, v);
    load<S, N>(dout + off + i, dy);
    load<S, N>(w + i, wv);
    load<S, N>(dinp + off + i, dx);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float norm = (v[j] - m) * s;
      dx[j] += (wv[j] * dy[j] - a - norm * bsum) * s;
    }
    store<S, N>(dinp + off + i, dx);
  }
}

template <class S, int N, int TPR>
__global__ void __launch_bounds__(kBlock)
    rmsnorm_forward_kernel(S* out, float* rstd, const S* inp, const S* w, int R, int C, float eps) {
  __shared__ float sm[kBlock / 32];
  const int r = group_row<TPR>(), lane = group_lane<TPR>();
  if (r >= R) return;
  const std::size_t off = static_cast<std::size_t>(r) * C;
  float ss = 0;
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N];
    load<S, N>(inp + off + i, v);
#pragma unroll
    for (int j = 0; j < N; ++j) ss += v[j] * v[j];
  }
  const float s = 1.0f / sqrtf(group_sum<TPR>(ss, sm) / static_cast<float>(C) + eps);
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N], wv[N], y[N];
    load<S, N>(inp + off + i, v);
    load<S, N>(w + i, wv);
#pragma unroll
    for (int j = 0; j < N; ++j) y[j] = v[j] * s * wv[j];
    store<S, N>(out + off + i, y);
  }
  if (lane == 0) rstd[r] = s;
}

// dinp += s·w·dy − s³/C · x · Σ w·dy·x
template <class S, int N, int TPR>
__global__ void __launch_bounds__(kBlock)
    rmsnorm_backward_rows(S* dinp, const S* dout, const S* inp, const S* w, const float* rstd, int R, int C) {
  __shared__ float sm[kBlock / 32];
  const int r = group_row<TPR>(), lane = group_lane<TPR>();
  if (r >= R) return;
  const std::size_t off = static_cast<std::size_t>(r) * C;
  const float s = rstd[r];
  float dot = 0;
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N], dy[N], wv[N];
    load<S, N>(inp + off + i, v);
    load<S, N>(dout + off + i, dy);
    load<S, N>(w + i, wv);
#pragma unroll
    for (int j = 0; j < N; ++j) dot += wv[j] * dy[j] * v[j];
  }
  const float k = s * s * s * group_sum<TPR>(dot, sm) / static_cast<float>(C);
  for (int i = lane * N; i < C; i += TPR * N) {
    float v[N], dy[N], wv[N], dx[N];
    load<S, N>(inp + off + i, v);
    load<S, N>(dout + off + i, dy);
    load<S, N>(w + i, wv);
    load<S, N>(dinp + off + i, dx);
#pragma unroll
    for (int j = 0; j < N; ++j) dx[j] += s * wv[j] * dy[j] - k * v[j];
    store<S, N>(dinp + off + i, dx);
  }
}

// Launches a row kernel: packs of 16 bytes when every row pointer allows it, a warp or a block per row.
#define ZINF_ROWS_LAUNCH(kernel, vec, R, C, s, ...)                                                  \
  do {                                                                                               \
    if ((C) <= kWarpRowMax) {                                                                        \
      const unsigned grid_ = blocks_for(static_cast<std::size_t>(R), kBlock / 32);                   \
      if (vec)                                                                                       \
        cuda::launch(kernel<S, kVec<S>, 32>, grid_, kBlock, 0, s, __VA_ARGS__);                      \
      else                                                                                           \
        cuda::launch(kernel<S, 1, 32>, grid_, kBlock, 0, s, __VA_ARGS__);                            \
    } else if (vec) {                                                                                \
      cuda::launch(kernel<S, kVec<S>, kBlock>, static_cast<unsigned>(R), kBlock, 0, s, __VA_ARGS__); \
    } else {                                                                                         \
      cuda::launch(kernel<S, 1, kBlock>, static_cast<unsigned>(R), kBlock, 0, s, __VA_ARGS__);       \
    }                                                                                                \
    ZINF_CUDA_LAUNCH_CHECK(#kernel);                                                                 \
  } while (0)

template <class S>
bool rows_vec(int C, std::initializer_list<const void*> ptrs) {
  if (C % kVec<S> != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned(p)) return false;
  return true;
}

// ---- column sums ----------------------------------------------------------------------------------
enum class Col { sum, layernorm, rmsnorm };
constexpr int kColStreams = 8;  // row streams per column in pass 1 (blockDim.y)

// The fixed split of R rows into chunks for pass 1: enough blocks for four per SM on a 132-SM H200
// when the columns alone do not give them, and at least 64 rows a chunk. It depends on R and C only
// (not on the GPU), so the bits do not either.
struct ColumnSplit {
  int chunks, rows;
};
ColumnSplit column_split(int R, int C) {
  const long tiles = (static_cast<long>(C) + 255) / 256;
  const long want = std::max(1L, (4L * 132 + tiles - 1) / tiles);
  const long by_rows = (static_cast<long>(R) + 63) / 64;
  const long n = std::max(1L, std::min(want, by_rows));
  const int rows = static_cast<int>((R + n - 1) / n);
  return {(R + rows - 1) / rows, rows};
}

// Pass 1: block (x: 32 column packs, y: 8 row streams) over columns [blockIdx.x·32N, +32N) and rows
// [blockIdx.y·chunk_rows, +chunk_rows). Stream y adds rows y, y+8, …; the streams are added in order.
// direct (one chunk): the sums go straight into o0/o1 (+=); otherwise they are written to the chunk's
// row of the partials o0/o1 [chunks, C].
template <class S, int N, Col K>
__global__ void __launch_bounds__(kBlock) column_pass1(float* o0, float* o1, const S* x, const S* dy, const float* mean,
                                                       const float* rstd, int R, int C, int chunk_rows, bool direct) {
  constexpr int NS = K == Col::layernorm ? 2 : 1;
  constexpr int W = 32 * N;
  __shared__ float red[kColStreams][NS][W];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int c0 = static_cast<int>(blockIdx.x) * W + tx * N;
  const int r0 = static_cast<int>(blockIdx.y) * chunk_rows, r1 = min(R, r0 + chunk_rows);
  float acc[NS][N];
#pragma unroll
  for (int k = 0; k < NS; ++k)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[k][j] = 0;
  if (c0 < C) {
    for (int r = r0 + ty; r < r1; r += kColStreams) {
      const std::size_t off = static_cast<std::size_t>(r) * C + c0;
      float xv[N];
      load<S, N>(x + off, xv);
      if constexpr (K == Col::sum) {
#pragma unroll
        for (int j = 0; j < N; ++j) acc[0][j] += xv[j];
      } else if constexpr (K == Col::layernorm) {
        float d[N];
        load<S, N>(dy + off, d);
        const float m = mean[r], s = rstd[r];
#pragma unroll
        for (int j = 0; j < N; ++j) {
          acc[0][j] += (xv[j] - m) * s * d[j];
          acc[1][j] += d[j];
        }
      } else {
        float d[N];
        load<S, N>(dy + off, d);
        const float s = rstd[r];
#pragma unroll
        for (int j = 0; j < N; ++j) acc[0][j] += xv[j] * s * d[j];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NS; ++k)
#pragma unroll
    for (int j = 0; j < N; ++j) red[ty][k][tx * N + j] = acc[k][j];
  __syncthreads();
  for (int lc = ty * 32 + tx; lc < W; lc += kBlock) {
    const int c = static_cast<int>(blockIdx.x) * W + lc;
    if (c >= C) break;
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      float t = 0;
#pragma unroll
      for (int y = 0; y < kColStreams; ++y) t += red[y][k][lc];
      float* o = k == 0 ? o0 : o1;
      if (direct)
        o[c] += t;
      else
        o[static_cast<std::size_t>(blockIdx.y) * C + c] = t;
    }
  }
}

// Pass 2: acc0[c] += Σ_chunks p0[chunk, c], chunks in order (and acc1 from p1 when given).
__global__ void column_pass2(float* acc0, const float* p0, float* acc1, const float* p1, int chunks, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float t = 0;
  for (int k = 0; k < chunks; ++k) t += p0[static_cast<std::size_t>(k) * C + c];
  acc0[c] += t;
  if (acc1) {
    t = 0;
    for (int k = 0; k < chunks; ++k) t += p1[static_cast<std::size_t>(k) * C + c];
    acc1[c] += t;
  }
}

// acc0 (+ acc1 for LayerNorm's bias) += the column sums of kind K. single: one chunk, no partials
// (used when the columns alone fill the GPU).
template <class S, Col K>
void column_launch(float* acc0, float* acc1, const S* x, const S* dy, const float* mean, const float* rstd, int R,
                   int C, float* partials, bool single, cudaStream_t s) {
  const ColumnSplit sp = single ? ColumnSplit{1, R} : column_split(R, C);
  const bool direct = sp.chunks == 1;
  if (!direct && !partials)
    throw Error("fast column sums: no partials scratch for " + std::to_string(sp.chunks) + " chunks");
  float* o0 = direct ? acc0 : partials;
  float* o1 = direct ? acc1 : partials + static_cast<std::size_t>(sp.chunks) * C;
  const dim3 block(32, kColStreams);
  if (rows_vec<S>(C, {x, dy})) {
    constexpr int N = kVec<S>;
    const dim3 grid((C + 32 * N - 1) / (32 * N), sp.chunks);
    cuda::launch(column_pass1<S, N, K>, grid, block, 0, s, o0, o1, x, dy, mean, rstd, R, C, sp.rows, direct);
  } else {
    const dim3 grid((C + 31) / 32, sp.chunks);
    cuda::launch(column_pass1<S, 1, K>, grid, block, 0, s, o0, o1, x, dy, mean, rstd, R, C, sp.rows, direct);
  }
  ZINF_CUDA_LAUNCH_CHECK("column_sums_pass1");
  if (!direct) {
    cuda::launch(column_pass2, blocks_for(C, kBlock), kBlock, 0, s, acc0, o0, acc1, o1, sp.chunks, C);
    ZINF_CUDA_LAUNCH_CHECK("column_sums_pass2");
  }
}

// ---- elementwise ----------------------------------------------------------------------------------
// Each op's run<M>(i) handles elements [i, i + M): M = the pack, or 1 for the tail.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

template <class S>
struct GeluForward {
  S* out;
  const S* inp;
  template <int M>
  __device__ void run(std::size_t i) const {
    float x[M], y[M];
    load<S, M>(inp + i, x);
#pragma unroll
    for (int j = 0; j < M; ++j)
      y[j] = 0.5f * x[j] * (1.0f + tanhf(kGeluScale * (x[j] + 0.044715f * x[j] * x[j] * x[j])));
    store<S, M>(out + i, y);
  }
};
template <class S>
struct GeluBackward {
  S* dinp;
  const S* inp;
  const S* dout;
  template <int M>
  __device__ void run(std::size_t i) const {
    float x[M], d[M], y[M];
    load<S, M>(inp + i, x);
    load<S, M>(dout + i, d);
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const float t = tanhf(kGeluScale * (x[j] + 0.044715f * x[j] * x[j] * x[j]));
      const float local =
          0.5f * (1.0f + t) + 0.5f * x[j] * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * x[j] * x[j]);
      y[j] = local * d[j];
    }
    store<S, M>(dinp + i, y);
  }
};
template <class S>
struct AddInplace {
  S* acc;
  const S* x;
  template <int M>
  __device__ void run(std::size_t i) const {
    float a[M], b[M];
    load<S, M>(acc + i, a);
    load<S, M>(x + i, b);
#pragma unroll
    for (int j = 0; j < M; ++j) a[j] += b[j];
    store<S, M>(acc + i, a);
  }
};
template <class S>
struct AddBias {
  S* out;
  const S* bias;
  int C;  // a pack never crosses a row: the packed path needs C % pack == 0
  template <int M>
  __device__ void run(std::size_t i) const {
    float a[M], b[M];
    load<S, M>(out + i, a);
    load<S, M>(bias + i % static_cast<std::size_t>(C), b);
#pragma unroll
    for (int j = 0; j < M; ++j) a[j] += b[j];
    store<S, M>(out + i, a);
  }
};
template <class S>
struct SwigluForward {
  S* out;
  const S* gate;
  const S* up;
  template <int M>
  __device__ void run(std::size_t i) const {
    float g[M], u[M], y[M];
    load<S, M>(gate + i, g);
    load<S, M>(up + i, u);
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const float sig = 1.0f / (1.0f + expf(-g[j]));
      y[j] = g[j] * sig * u[j];
    }
    store<S, M>(out + i, y);
  }
};
template <class S>
struct SwigluBackward {
  S* dgate;
  S* dup;
  const S* dout;
  const S* gate;
  const S* up;
  template <int M>
  __device__ void run(std::size_t i) const {
    float d[M], g[M], u[M], dg[M], du[M];
    load<S, M>(dout + i, d);
    load<S, M>(gate + i, g);
    load<S, M>(up + i, u);
#pragma unroll
    for (int j = 0; j < M; ++j) {
      const float sig = 1.0f / (1.0f + expf(-g[j])), silu = g[j] * sig;
      du[j] = d[j] * silu;
      dg[j] = d[j] * u[j] * (sig + silu * (1.0f - sig));  // silu' = σ + g·σ·(1 − σ)
    }
    store<S, M>(dup + i, du);
    store<S, M>(dgate + i, dg);
  }
};
// The unfused end of a GEMM whose epilogue cuBLASLt could not fuse: v = acc + bias from the GEMM's fp32
// result, then pre = v and out = gelu(v) (gelu) or out = v, each rounded once — as the fused epilogue
// rounds. One element per thread (a fallback path).
template <class S>
struct BiasActFromFp32 {
  S* pre;
  S* out;
  const float* acc;
  const S* bias;  // may be null
  int C;
  bool gelu;
  template <int M>
  __device__ void run(std::size_t i) const {
    float v = acc[i];
    if (bias) v += widen<S>(bias[i % static_cast<std::size_t>(C)]);
    if (!gelu) {
      out[i] = narrow<S>(v);
      return;
    }
    pre[i] = narrow<S>(v);
    out[i] = narrow<S>(0.5f * v * (1.0f + tanhf(kGeluScale * (v + 0.044715f * v * v * v))));
  }
};
template <class D, class Src>
struct Convert {
  D* dst;
  const Src* src;
  template <int M>
  __device__ void run(std::size_t i) const {
    float v[M];
    load<Src, M>(src + i, v);
    store<D, M>(dst + i, v);
  }
};

template <int N, class Op>
__global__ void __launch_bounds__(kBlock) elementwise_kernel(Op op, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t packs = n / N;
  for (std::size_t p = t; p < packs; p += stride) op.template run<N>(p * N);
  for (std::size_t i = packs * N + t; i < n; i += stride) op.template run<1>(i);
}

constexpr unsigned kMaxGrid = 4096;  // grid-stride beyond 4096 blocks of 256 threads

template <int N, class Op>
void elementwise_launch(const Op& op, std::size_t n, bool vec, const char* name, cudaStream_t s) {
  if (vec) {
    const unsigned grid = std::max(1u, std::min(kMaxGrid, blocks_for((n + N - 1) / N, kBlock)));
    cuda::launch(elementwise_kernel<N, Op>, grid, kBlock, 0, s, op, n);
  } else {
    const unsigned grid = std::min(kMaxGrid, blocks_for(n, kBlock));
    cuda::launch(elementwise_kernel<1, Op>, grid, kBlock, 0, s, op, n);
  }
  ZINF_CUDA_LAUNCH_CHECK(name);
}

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!aligned(p)) return false;
  return true;
}

// ---- rotary positions -----------------------------------------------------------------------------
// One thread per N consecutive pairs (i, i + D/2) of one head of one row.
template <class S, int N>
__global__ void __launch_bounds__(kBlock)
    rope_kernel(S* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int half, float sign) {
  const int per_head = half / N;
  const std::size_t n = static_cast<std::size_t>(R) * heads * per_head;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const int i = static_cast<int>(idx % per_head) * N;
    const std::size_t rh = idx / per_head;  // row · heads + head
    const std::size_t t = static_cast<std::size_t>(static_cast<int>(rh / heads) % T);
    S* v = x + rh * 2 * half;
    float a[N], b[N], na[N], nb[N];
    load<S, N>(v + i, a);
    load<S, N>(v + i + half, b);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float co = cos_t[t * half + i + j], si = sign * sin_t[t * half + i + j];
      na[j] = a[j] * co - b[j] * si;
      nb[j] = b[j] * co + a[j] * si;
    }
    store<S, N>(v + i, na);
    store<S, N>(v + i + half, nb);
  }
}

// ---- embeddings -----------------------------------------------------------------------------------
// out[r] = wte[tokens[r]] (+ wpe[r mod T] when given), one thread per pack.
template <class S, int N>
__global__ void __launch_bounds__(kBlock)
    embed_forward_kernel(S* out, const int* tokens, const S* wte, const S* wpe, int R, int T, int C) {
  const std::size_t P = static_cast<std::size_t>(C / N), n = static_cast<std::size_t>(R) * P;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const std::size_t r = idx / P, c = (idx % P) * N;
    float e[N];
    load<S, N>(wte + static_cast<std::size_t>(tokens[r]) * C + c, e);
    if (wpe) {
      float p[N];
      load<S, N>(wpe + (r % static_cast<std::size_t>(T)) * C + c, p);
#pragma unroll
      for (int j = 0; j < N; ++j) e[j] += p[j];
    }
    store<S, N>(out + r * C + c, e);
  }
}

// The sort's scratch (token_sort_ints): order [R] (rows sorted by token, stable), keys [R] (their
// tokens), two more [R] for the passes, starts [R + 1] (where each token's run begins in sorted
// order; starts[runs] = R), runs [1].
constexpr int kSortThreads = 512;
constexpr int kRadixBits = 4, kBins = 1 << kRadixBits;
struct SortScratch {
  int *order, *keys, *tmp_order, *tmp_keys, *starts, *runs;
  __host__ __device__ SortScratch(int* p, int R) {
    const std::size_t r = static_cast<std::size_t>(R);
    order = p, keys = p + r, tmp_order = p + 2 * r, tmp_keys = p + 3 * r, starts = p + 4 * r, runs = p + 5 * r + 1;
  }
};

// Exclusive prefix sum over the block (kSortThreads threads); *total gets the sum of all.
__device__ int block_exclusive_scan(int v, int* total, int* sm) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) / 32;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += u;
  }
  if (lane == 31) sm[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int wv = lane < kSortThreads / 32 ? sm[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(kFull, wv, o);
      if (lane >= o) wv += u;
    }
    if (lane < kSortThreads / 32) sm[lane] = wv;
  }
  __syncthreads();
  const int base = (warp > 0 ? sm[warp - 1] : 0) + inc - v;
  *total = sm[kSortThreads / 32 - 1];
  __syncthreads();
  return base;
}

// One block: sorts the rows by token with a stable LSD radix sort (each thread owns a contiguous
// segment and its own bin counters, so the scatter keeps row order without atomics), then lists
// where each token's run starts.
__global__ void __launch_bounds__(kSortThreads) sort_rows_by_token(int* scratch, const int* tokens, int R) {
  __shared__ int counts[kBins * kSortThreads];  // [bin][thread]
  __shared__ int sm[32];
  __shared__ unsigned maxkey_sm[kSortThreads / 32];
  const SortScratch sc(scratch, R);
  const int tid = static_cast<int>(threadIdx.x);
  unsigned mk = 0;
  for (int j = tid; j < R; j += kSortThreads) {
    sc.order[j] = j;
    sc.keys[j] = tokens[j];
    mk = max(mk, static_cast<unsigned>(tokens[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mk = max(mk, __shfl_xor_sync(kFull, mk, o));
  if ((tid & 31) == 0) maxkey_sm[tid / 32] = mk;
  __syncthreads();
  mk = 0;
  for (int w = 0; w < kSortThreads / 32; ++w) mk = max(mk, maxkey_sm[w]);
  const int bits = mk == 0 ? 0 : 32 - __clz(static_cast<int>(mk));
  int passes = (bits + kRadixBits - 1) / kRadixBits;
  passes += passes & 1;  // an even count leaves the result in order/keys
  const int seg = (R + kSortThreads - 1) / kSortThreads;
  const int j0 = min(R, tid * seg), j1 = min(R, j0 + seg);
  for (int pass = 0; pass < passes; ++pass) {
    const bool even = pass % 2 == 0;
    const int* src = even ? sc.order : sc.tmp_order;
    const int* ksrc = even ? sc.keys : sc.tmp_keys;
    int* dst = even ? sc.tmp_order : sc.order;
    int* kdst = even ? sc.tmp_keys : sc.keys;
    const int shift = pass * kRadixBits;
    for (int d = 0; d < kBins; ++d) counts[d * kSortThreads + tid] = 0;
    for (int j = j0; j < j1; ++j)
      ++counts[((static_cast<unsigned>(ksrc[j]) >> shift) & (kBins - 1)) * kSortThreads + tid];
    __syncthreads();
    // Exclusive scan over counts in (bin, thread) order: thread t scans entries [t·kBins, +kBins).
    int local = 0;
    for (int f = tid * kBins; f < (tid + 1) * kBins; ++f) local += counts[f];
    int total;
    int run = block_exclusive_scan(local, &total, sm);
    for (int f = tid * kBins; f < (tid + 1) * kBins; ++f) {
      const int c = counts[f];
      counts[f] = run;
      run += c;
    }
    __syncthreads();
    for (int j = j0; j < j1; ++j) {
      const int key = ksrc[j];
      const int d = static_cast<int>((static_cast<unsigned>(key) >> shift) & (kBins - 1));
      const int at = counts[d * kSortThreads + tid]++;
      dst[at] = src[j];
      kdst[at] = key;
    }
    __syncthreads();
  }
  // Runs: position j starts one when its token differs from position j − 1's.
  int mine = 0;
  for (int j = j0; j < j1; ++j) mine += j == 0 || sc.keys[j] != sc.keys[j - 1];
  int runs;
  int at = block_exclusive_scan(mine, &runs, sm);
  for (int j = j0; j < j1; ++j)
    if (j == 0 || sc.keys[j] != sc.keys[j - 1]) sc.starts[at++] = j;
  if (tid == 0) {
    sc.starts[runs] = R;
    *sc.runs = runs;
  }
}

// dwte[token, c…c+N) += its rows' dout, in row order, starting from dwte's value: one thread per
// (run, column pack); runs blockIdx.y, blockIdx.y + gridDim.y, …
template <class S, int N>
__global__ void __launch_bounds__(kBlock) embedding_accumulate(float* dwte, const S* dout, int* scratch, int R, int C) {
  const int pack = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (pack >= C / N) return;
  const int c = pack * N;
  const SortScratch sc(scratch, R);
  const int* order = sc.order;
  const int runs = *sc.runs;
  for (int run = static_cast<int>(blockIdx.y); run < runs; run += static_cast<int>(gridDim.y)) {
    const int k0 = sc.starts[run], k1 = sc.starts[run + 1];
    float* d = dwte + static_cast<std::size_t>(sc.keys[k0]) * C + c;
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = d[j];
    for (int k = k0; k < k1; ++k) {
      float v[N];
      load<S, N>(dout + static_cast<std::size_t>(order[k]) * C + c, v);
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] += v[j];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) d[j] = acc[j];
  }
}

template <class S>
void embedding_backward_impl(float* dwte, const S* dout, const int* tokens, int R, int C, int* scratch,
                             cudaStream_t s) {
  cuda::launch(sort_rows_by_token, 1, kSortThreads, 0, s, scratch, tokens, R);
  ZINF_CUDA_LAUNCH_CHECK("embedding_backward_sort");
  const bool vec = rows_vec<S>(C, {dout});
  const int N = vec ? kVec<S> : 1;
  const int packs = C / N;
  const unsigned threads = static_cast<unsigned>(std::min(kBlock, (packs + 31) / 32 * 32));
  const dim3 grid(blocks_for(static_cast<std::size_t>(packs), threads), static_cast<unsigned>(std::min(R, 16384)));
  if (vec)
    cuda::launch(embedding_accumulate<S, kVec<S>>, grid, threads, 0, s, dwte, dout, scratch, R, C);
  else
    cuda::launch(embedding_accumulate<S, 1>, grid, threads, 0, s, dwte, dout, scratch, R, C);
  ZINF_CUDA_LAUNCH_CHECK("embedding_backward_accumulate");
}

template <class S>
void embed_forward_impl(S* out, const int* tokens, const S* wte, const S* wpe, int R, int T, int C, cudaStream_t s) {
  const bool vec = rows_vec<S>(C, {out, wte, wpe});
  const int N = vec ? kVec<S> : 1;
  const unsigned grid =
      std::min(kMaxGrid, blocks_for(static_cast<std::size_t>(R) * static_cast<std::size_t>(C / N), kBlock));
  if (vec)
    cuda::launch(embed_forward_kernel<S, kVec<S>>, grid, kBlock, 0, s, out, tokens, wte, wpe, R, T, C);
  else
    cuda::launch(embed_forward_kernel<S, 1>, grid, kBlock, 0, s, out, tokens, wte, wpe, R, T, C);
  ZINF_CUDA_LAUNCH_CHECK("embedding_forward");
}

// ---- softmax cross-entropy ------------------------------------------------------------------------
// Visits a row of n elements with the block's threads: an unaligned head, 16-byte packs, a tail.
template <class S, class F>
__device__ __forceinline__ void visit_row(const S* p, int n, F&& f) {
  constexpr int N = kVec<S>;
  const int head = min(n, static_cast<int>(((16 - (reinterpret_cast<std::uintptr_t>(p) & 15)) & 15) / sizeof(S)));
  const int packs = (n - head) / N;
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (int i = tid; i < head; i += nt) f(i, widen<S>(p[i]));
  for (int k = tid; k < packs; k += nt) {
    float v[N];
    load<S, N>(p + head + k * N, v);
#pragma unroll
    for (int j = 0; j < N; ++j) f(head + k * N + j, v[j]);
  }
  for (int i = head + packs * N + tid; i < n; i += nt) f(i, widen<S>(p[i]));
}
// dst[i] = f(i, src[i]) over a row (dst may be src): packs where both share their alignment.
template <class S, class F>
__device__ __forceinline__ void map_row(S* dst, const S* src, int n, F&& f) {
  constexpr int N = kVec<S>;
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  if (((reinterpret_cast<std::uintptr_t>(dst) ^ reinterpret_cast<std::uintptr_t>(src)) & 15) != 0) {
    for (int i = tid; i < n; i += nt) dst[i] = narrow<S>(f(i, widen<S>(src[i])));
    return;
  }
  const int head = min(n, static_cast<int>(((16 - (reinterpret_cast<std::uintptr_t>(src) & 15)) & 15) / sizeof(S)));
  const int packs = (n - head) / N;
  for (int i = tid; i < head; i += nt) dst[i] = narrow<S>(f(i, widen<S>(src[i])));
  for (int k = tid; k < packs; k += nt) {
    const int i0 = head + k * N;
    float v[N];
    load<S, N>(src + i0, v);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = f(i0 + j, v[j]);
    store<S, N>(dst + i0, v);
  }
  for (int i = head + packs * N + tid; i < n; i += nt) dst[i] = narrow<S>(f(i, widen<S>(src[i])));
}

// A running (max, Σ exp(x − max)); −inf max means nothing seen yet.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  const float sa = a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m);
  const float sb = b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m);
  return {m, sa + sb};  // symmetric in a and b: every lane of a butterfly gets the same bits
}

// One block per row (rows `ld` elements apart; the V classes of each are all it reads or writes):
// pass 1 keeps an online max and sum (one exp per element) for the row's log-sum-exp;
// loss = logsumexp − logit[target] (capped where the reference clamps p at 1e-30); pass 2 writes
// probs = exp(x − max) / sum in place.
template <class S>
__global__ void __launch_bounds__(kBlock)
    softmax_crossentropy_kernel(S* probs, float* losses, const int* targets, int V, int ld) {
  __shared__ MaxSum sm[kBlock / 32];
  const int r = static_cast<int>(blockIdx.x);
  S* row = probs + static_cast<std::size_t>(r) * static_cast<std::size_t>(ld);
  const int target = targets[r];
  const float xt = target >= 0 && target < V ? widen<S>(row[target]) : NAN;  // read before pass 2 writes
  MaxSum ms{-INFINITY, 0.0f};
  visit_row<S>(row, V, [&](int, float x) {
    if (x > ms.m) {
      ms.s = ms.s * expf(ms.m - x) + 1.0f;  // 0 · exp(−inf) = 0 the first time
      ms.m = x;
    } else if (ms.m != -INFINITY) {
      ms.s += expf(x - ms.m);
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(kFull, ms.m, o), __shfl_xor_sync(kFull, ms.s, o)};
    ms = merge(ms, other);
  }
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x / 32] = ms;
  __syncthreads();
  ms = sm[0];
  for (int w = 1; w < kBlock / 32; ++w) ms = merge(ms, sm[w]);
  if (threadIdx.x == 0) {
    const float loss = ms.m + logf(ms.s) - xt, cap = -logf(1e-30f);
    // A NaN (a target outside [0, V)) stays NaN; -1 (kIgnoreTarget) is a masked position: loss 0.
    losses[r] = target == -1 ? 0.0f : loss > cap ? cap : loss;
  }
  const float m = ms.m, inv = 1.0f / ms.s;
  map_row<S>(row, row, V, [&](int, float x) { return expf(x - m) * inv; });
}

template <class S>
__global__ void __launch_bounds__(kBlock)
    crossentropy_backward_kernel(S* dlogits, const S* probs, const int* targets, float dscale, int V, int ld) {
  const std::size_t off = static_cast<std::size_t>(blockIdx.x) * static_cast<std::size_t>(ld);
  const int target = targets[blockIdx.x];
  if (target == -1) {  // kIgnoreTarget: a masked position has no gradient
    map_row<S>(dlogits + off, probs + off, V, [&](int, float) { return 0.0f; });
    return;
  }
  map_row<S>(dlogits + off, probs + off, V, [&](int v, float p) { return (p - (v == target ? 1.0f : 0.0f)) * dscale; });
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------------
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, int R, int C,
                       DType dt, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const bool vec = rows_vec<S>(C, {out, inp, w, b});
    ZINF_ROWS_LAUNCH(layernorm_forward_kernel, vec, R, C, s, static_cast<S*>(out), mean, rstd,
                     static_cast<const S*>(inp), static_cast<const S*>(w), static_cast<const S*>(b), R, C);
  });
}

void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, int R, int C, DType dt, float* partials, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const bool vec = rows_vec<S>(C, {dinp, dout, inp, w});
    ZINF_ROWS_LAUNCH(layernorm_backward_rows, vec, R, C, s, static_cast<S*>(dinp), static_cast<const S*>(dout),
                     static_cast<const S*>(inp), static_cast<const S*>(w), mean, rstd, R, C);
    column_launch<S, Col::layernorm>(dw, db, static_cast<const S*>(inp), static_cast<const S*>(dout), mean, rstd, R, C,
                                     partials, false, s);
  });
}

void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, int R, int C, float eps, DType dt,
                     cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const bool vec = rows_vec<S>(C, {out, inp, w});
    ZINF_ROWS_LAUNCH(rmsnorm_forward_kernel, vec, R, C, s, static_cast<S*>(out), rstd, static_cast<const S*>(inp),
                     static_cast<const S*>(w), R, C, eps);
  });
}

void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const void* w, const float* rstd, int R,
                      int C, DType dt, float* partials, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const bool vec = rows_vec<S>(C, {dinp, dout, inp, w});
    ZINF_ROWS_LAUNCH(rmsnorm_backward_rows, vec, R, C, s, static_cast<S*>(dinp), static_cast<const S*>(dout),
                     static_cast<const S*>(inp), static_cast<const S*>(w), rstd, R, C);
    column_launch<S, Col::rmsnorm>(dw, nullptr, static_cast<const S*>(inp), static_cast<const S*>(dout), nullptr, rstd,
                                   R, C, partials, false, s);
  });
}

std::size_t column_partials_floats(int R, int C) {
  if (R <= 0 || C <= 0) return 0;
  const ColumnSplit sp = column_split(R, C);
  return sp.chunks == 1 ? 0 : 2 * static_cast<std::size_t>(sp.chunks) * static_cast<std::size_t>(C);
}

void column_sum(float* acc, const void* x, int R, int C, DType dt, float* partials, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    column_launch<S, Col::sum>(acc, nullptr, static_cast<const S*>(x), nullptr, nullptr, nullptr, R, C, partials, false,
                               s);
  });
}

void add_bias(void* out, const void* bias, int R, int C, DType dt, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const AddBias<S> op{static_cast<S*>(out), static_cast<const S*>(bias), C};
    elementwise_launch<kVec<S>>(op, static_cast<std::size_t>(R) * C, rows_vec<S>(C, {out, bias}), "add_bias", s);
  });
}

void bias_act_from_fp32(void* pre, void* out, const float* acc, const void* bias, int R, int C, bool gelu, DType dt,
                        cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const BiasActFromFp32<S> op{static_cast<S*>(pre), static_cast<S*>(out), acc, static_cast<const S*>(bias), C, gelu};
    elementwise_launch<1>(op, static_cast<std::size_t>(R) * C, false, "bias_act_from_fp32", s);
  });
}

void gelu_forward(void* out, const void* inp, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const GeluForward<S> op{static_cast<S*>(out), static_cast<const S*>(inp)};
    elementwise_launch<kVec<S>>(op, n, all_aligned({out, inp}), "gelu_forward", s);
  });
}

void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const GeluBackward<S> op{static_cast<S*>(dinp), static_cast<const S*>(inp), static_cast<const S*>(dout)};
    elementwise_launch<kVec<S>>(op, n, all_aligned({dinp, inp, dout}), "gelu_backward", s);
  });
}

void add_inplace(void* acc, const void* x, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const AddInplace<S> op{static_cast<S*>(acc), static_cast<const S*>(x)};
    elementwise_launch<kVec<S>>(op, n, all_aligned({acc, x}), "add_inplace", s);
  });
}

void swiglu_forward(void* out, const void* gate, const void* up, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const SwigluForward<S> op{static_cast<S*>(out), static_cast<const S*>(gate), static_cast<const S*>(up)};
    elementwise_launch<kVec<S>>(op, n, all_aligned({out, gate, up}), "swiglu_forward", s);
  });
}

void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, std::size_t n,
                     DType dt, cudaStream_t s) {
  if (n == 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const SwigluBackward<S> op{static_cast<S*>(dgate), static_cast<S*>(dup), static_cast<const S*>(dout),
                               static_cast<const S*>(gate), static_cast<const S*>(up)};
    elementwise_launch<kVec<S>>(op, n, all_aligned({dgate, dup, dout, gate, up}), "swiglu_backward", s);
  });
}

void rope_apply(void* x, const float* cos_t, const float* sin_t, int R, int T, int heads, int D, bool backward,
                DType dt, cudaStream_t s) {
  if (R <= 0 || heads <= 0 || D < 2) return;
  const int half = D / 2;
  const float sign = backward ? -1.0f : 1.0f;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const bool vec = half % kVec<S> == 0 && aligned(x);
    const std::size_t n = static_cast<std::size_t>(R) * heads * (vec ? half / kVec<S> : half);
    const unsigned grid = std::min(kMaxGrid, blocks_for(n, kBlock));
    if (vec)
      cuda::launch(rope_kernel<S, kVec<S>>, grid, kBlock, 0, s, static_cast<S*>(x), cos_t, sin_t, R, T, heads, half,
                   sign);
    else
      cuda::launch(rope_kernel<S, 1>, grid, kBlock, 0, s, static_cast<S*>(x), cos_t, sin_t, R, T, heads, half, sign);
    ZINF_CUDA_LAUNCH_CHECK("rope_apply");
  });
}

void encoder_forward(void* out, const int* tokens, const void* wte, const void* wpe, int B, int T, int C, DType dt,
                     cudaStream_t s) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    embed_forward_impl<S>(static_cast<S*>(out), tokens, static_cast<const S*>(wte), static_cast<const S*>(wpe), B * T,
                          T, C, s);
  });
}

void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* tokens, int B, int T, int C, DType dt,
                      int* sort_scratch, cudaStream_t s) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    embedding_backward_impl<S>(dwte, static_cast<const S*>(dout), tokens, B * T, C, sort_scratch, s);
    // dwpe[t] += Σ_b dout[b, t]: a column sum over B rows of T·C columns, which alone fill the GPU.
    column_launch<S, Col::sum>(dwpe, nullptr, static_cast<const S*>(dout), nullptr, nullptr, nullptr, B, T * C, nullptr,
                               true, s);
  });
}

void embedding_forward(void* out, const int* tokens, const void* wte, int R, int C, DType dt, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    embed_forward_impl<S>(static_cast<S*>(out), tokens, static_cast<const S*>(wte), nullptr, R, 1, C, s);
  });
}

void embedding_backward(float* dwte, const void* dout, const int* tokens, int R, int C, DType dt, int* sort_scratch,
                        cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    embedding_backward_impl<S>(dwte, static_cast<const S*>(dout), tokens, R, C, sort_scratch, s);
  });
}

std::size_t token_sort_ints(int R) { return R <= 0 ? 0 : 5 * static_cast<std::size_t>(R) + 2; }

void softmax_crossentropy(void* probs, float* losses, const int* targets, int R, int V, int ld, DType dt,
                          cudaStream_t s) {
  if (R <= 0 || V <= 0) return;
  ZINF_CHECK(ld >= V);
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    cuda::launch(softmax_crossentropy_kernel<S>, static_cast<unsigned>(R), kBlock, 0, s, static_cast<S*>(probs), losses,
                 targets, V, ld);
    ZINF_CUDA_LAUNCH_CHECK("softmax_crossentropy");
  });
}

void crossentropy_backward(void* dlogits, const void* probs, const int* targets, float dscale, int R, int V, int ld,
                           DType dt, cudaStream_t s) {
  if (R <= 0 || V <= 0) return;
  ZINF_CHECK(ld >= V);
  dispatch(dt, [&](auto tag) {
    using S = typename decltype(tag)::type;
    cuda::launch(crossentropy_backward_kernel<S>, static_cast<unsigned>(R), kBlock, 0, s, static_cast<S*>(dlogits),
                 static_cast<const S*>(probs), targets, dscale, V, ld);
    ZINF_CUDA_LAUNCH_CHECK("crossentropy_backward");
  });
}

void convert(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  if (dst_t == src_t) {
    ZINF_CUDA(cudaMemcpyAsync(dst, src, n * dtype_bytes(dst_t), cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch(dst_t, [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch(src_t, [&](auto stag) {
      using Src = typename decltype(stag)::type;
      constexpr int N = kVec<D> < kVec<Src> ? kVec<D> : kVec<Src>;
      const Convert<D, Src> op{static_cast<D*>(dst), static_cast<const Src*>(src)};
      elementwise_launch<N>(op, n, all_aligned({dst, src}), "convert", s);
    });
  });
}

}  // namespace zinf::cuda::fast
