// flash_attention.cu — the flash-attention kernels (flash_attention.cuh). Every tile lives in shared
// memory; products are done tile by tile (tile_gemm: wmma on tensor cores, or plain FMA loops), the
// softmax row by row with one thread per row, keys in order. Each step mirrors a loop of the CPU twin
// (cpu/ops_attention_tiled.cpp), with the same tiles and rounding points:
//   forward   one CTA per (b, h, query block): key blocks 0… up to the causal limit, online softmax,
//             P rounded to S before P·V, out = acc / l, lse = m + log l.
//   backward  delta_kernel: D_t = dout_t·out_t into scratch; dkdv_kernel: one CTA per (b, kv head,
//             key block), the group's query heads in order and for each the query blocks in order;
//             dq_kernel: one CTA per (b, h, query block), key blocks in order. No atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.cuh"
#include "cuda/ops/flash_attention.cuh"
#include "cuda/round16.cuh"

namespace zinf::cuda::fast {
namespace {

constexpr int kThreads = 128;  // 4 warps per CTA

// Everything a kernel needs to know about the launch. tc: the products run on tensor cores (16-bit
// S and D, BQ, BK multiples of 16); otherwise the plain-FMA tiles.
struct Geometry {
  int B, T, H, KV, D, BQ, BK;
  int W;                // the sliding window (0: none): query t sees key s iff s <= t and t - s < W
  long qs, ks, vs, os;  // row strides of q, k, v and out/dout
  float scale;
  bool tc;
  // Leading dimensions of the shared tiles, padded against bank conflicts; all keep wmma's alignment
  // (16-bit rows a multiple of 8 elements, fp32 rows of 4; a 16-row step a multiple of 32 bytes).
  __host__ __device__ int ldh() const { return D + 8; }   // q, k, v, dout rows (S)
  __host__ __device__ int ldp() const { return BK + 8; }  // the P / dS tile (S)
  __host__ __device__ int lds() const { return BK + 4; }  // the score and dP tiles (fp32)
  __host__ __device__ int ldo() const { return D + 4; }   // the accumulators (fp32)
  __host__ __device__ bool sees(int t, int s) const { return s <= t && (W == 0 || t - s < W); }
  // The first key query t sees; one past the last query that sees key s.
  __host__ __device__ int first_key(int t) const { return W > 0 ? (t - W + 1 > 0 ? t - W + 1 : 0) : 0; }
  __host__ __device__ int query_end(int s) const { return W > 0 ? (s + W < T ? s + W : T) : T; }
};

// Carves the dynamic shared memory into 128-byte aligned pieces; run with base = 0 on the host to
// size it, with the real base on the device.
struct Bump {
  std::size_t off = 0;
  __host__ __device__ std::size_t take(std::size_t bytes) {
    const std::size_t at = off;
    off += (bytes + 127) / 128 * 128;
    return at;
  }
};

__device__ inline float to_f(float x) { return x; }
__device__ inline float to_f(__half x) { return __half2float(x); }
__device__ inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round to S by the one rule of cuda/round16.cuh (cpu_adam/spec.h's: to nearest even, fp32 subnormals
// to ±0 for bf16), as the CPU twin's round_to does: the outputs and the P and dS tiles wmma reads.
template <class T>
__device__ inline T from_f(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return round_fp16(x);
  } else {
    return round_bf16(x);
  }
}

// C[M×N] (+)= op(A)·op(B) on shared tiles, K the inner size. A is [M][K] (kTA: stored [K][M]), B is
// [K][N] (kTB: stored [N][K]); C is fp32 row-major. The CTA's warps split C into 16×16 tiles; the
// FMA path gives each thread whole elements, summed in k order from C (or from 0).
template <class T, bool kTA, bool kTB>
__device__ void tile_gemm(float* C, int ldc, const T* A, int lda, const T* Bm, int ldb, int M, int N, int K,
                          bool accumulate, bool tc) {
  if constexpr (!std::is_same_v<T, float>) {
    if (tc) {
      namespace wmma = nvcuda::wmma;
      using LA = std::conditional_t<kTA, wmma::col_major, wmma::row_major>;
      using LB = std::conditional_t<kTB, wmma::col_major, wmma::row_major>;
      const int warp = static_cast<int>(threadIdx.x) / 32, nwarps = static_cast<int>(blockDim.x) / 32;
      const int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
      for (int tile = warp; tile < tiles; tile += nwarps) {
        const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 16;
        float* cp = C + static_cast<std::size_t>(m0) * ldc + n0;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        if (accumulate)
          wmma::load_matrix_sync(c, cp, ldc, wmma::mem_row_major);
        else
          wmma::fill_fragment(c, 0.0f);
        for (int k0 = 0; k0 < K; k0 += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
          wmma::load_matrix_sync(
              fa, kTA ? A + static_cast<std::size_t>(k0) * lda + m0 : A + static_cast<std::size_t>(m0) * lda + k0, lda);
          wmma::load_matrix_sync(
              fb, kTB ? Bm + static_cast<std::size_t>(n0) * ldb + k0 : Bm + static_cast<std::size_t>(k0) * ldb + n0,
              ldb);
          wmma::mma_sync(c, fa, fb, c);
        }
        wmma::store_matrix_sync(cp, c, ldc, wmma::mem_row_major);
      }
      return;
    }
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < M * N; idx += static_cast<int>(blockDim.x)) {
    const int m = idx / N, n = idx % N;
    float sum = accumulate ? C[static_cast<std::size_t>(m) * ldc + n] : 0.0f;
    for (int k = 0; k < K; ++k) {
      const float a = to_f(kTA ? A[static_cast<std::size_t>(k) * lda + m] : A[static_cast<std::size_t>(m) * lda + k]);
      const float b = to_f(kTB ? Bm[static_cast<std::size_t>(n) * ldb + k] : Bm[static_cast<std::size_t>(k) * ldb + n]);
      sum += a * b;
    }
    C[static_cast<std::size_t>(m) * ldc + n] = sum;
  }
}

// rows × D elements of head `head` from rows row0… of x (stride `stride`) into a shared tile; rows at
// or past `row_end` are zero (a partial last block: their products then add exact zeros).
template <class T>
__device__ void load_rows(T* tile, int ld, const T* x, long stride, std::size_t row0, int rows, int valid, int head,
                          int D) {
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * D; idx += static_cast<int>(blockDim.x)) {
    const int r = idx / D, d = idx % D;
    tile[static_cast<std::size_t>(r) * ld + d] =
        r < valid ? x[(row0 + r) * stride + static_cast<std::size_t>(head) * D + d] : from_f<T>(0.0f);
  }
}

__device__ inline void fill(float* tile, int ld, int rows, int cols, float v) {
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * cols; idx += static_cast<int>(blockDim.x))
    tile[static_cast<std::size_t>(idx / cols) * ld + idx % cols] = v;
}

// ---- forward ------------------------------------------------------------------------------------

struct FwdSmem {
  std::size_t q, k, v, s, p, o, m, l, alpha, total;
};
__host__ __device__ inline FwdSmem fwd_smem(const Geometry& g, std::size_t es) {
  Bump b;
  FwdSmem r;
  r.q = b.take(static_cast<std::size_t>(g.BQ) * g.ldh() * es);
  r.k = b.take(static_cast<std::size_t>(g.BK) * g.ldh() * es);
  r.v = b.take(static_cast<std::size_t>(g.BK) * g.ldh() * es);
  r.s = b.take(static_cast<std::size_t>(g.BQ) * g.lds() * 4);
  r.p = b.take(static_cast<std::size_t>(g.BQ) * g.ldp() * es);
  r.o = b.take(static_cast<std::size_t>(g.BQ) * g.ldo() * 4);
  r.m = b.take(static_cast<std::size_t>(g.BQ) * 4);
  r.l = b.take(static_cast<std::size_t>(g.BQ) * 4);
  r.alpha = b.take(static_cast<std::size_t>(g.BQ) * 4);
  r.total = b.off;
  return r;
}

// Grid (query blocks, H, B); the latest query blocks (the most key blocks) start first.
template <class T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, const Geometry g) {
  ZINF_DYNAMIC_SHARED(smem);
  const FwdSmem L = fwd_smem(g, sizeof(T));
  T* Qs = reinterpret_cast<T*>(smem + L.q);
  T* Ks = reinterpret_cast<T*>(smem + L.k);
  T* Vs = reinterpret_cast<T*>(smem + L.v);
  float* Ss = reinterpret_cast<float*>(smem + L.s);
  T* Ps = reinterpret_cast<T*>(smem + L.p);
  float* Os = reinterpret_cast<float*>(smem + L.o);
  float* m = reinterpret_cast<float*>(smem + L.m);
  float* l = reinterpret_cast<float*>(smem + L.l);
  float* alpha = reinterpret_cast<float*>(smem + L.alpha);

  const int nq = static_cast<int>(gridDim.x);
  const int qb = nq - 1 - static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const int j = h / (g.H / g.KV), BQ = g.BQ, BK = g.BK, D = g.D, seq = g.T;
  const int t0 = qb * BQ, t1 = min(seq, t0 + BQ);
  const std::size_t brow = static_cast<std::size_t>(b) * seq;
  const int tid = static_cast<int>(threadIdx.x);

  load_rows(Qs, g.ldh(), q, g.qs, brow + t0, BQ, t1 - t0, h, D);
  fill(Os, g.ldo(), BQ, D, 0.0f);
  for (int r = tid; r < BQ; r += kThreads) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  __syncthreads();

  // Key blocks from the one holding the first row's first key up to the one holding the last row's own key.
  const int kb_end = (t1 + BK - 1) / BK;
  for (int kb = g.first_key(t0) / BK; kb < kb_end; ++kb) {
    const int s0 = kb * BK;
    load_rows(Ks, g.ldh(), k, g.ks, brow + s0, BK, min(BK, seq - s0), j, D);
    load_rows(Vs, g.ldh(), v, g.vs, brow + s0, BK, min(BK, seq - s0), j, D);
    __syncthreads();
    tile_gemm<T, false, true>(Ss, g.lds(), Qs, g.ldh(), Ks, g.ldh(), BQ, BK, D, false, g.tc);  // S = Q·Kᵀ
    __syncthreads();
    // The online softmax, one thread per row, keys in order. A row that sees no key of the block (all
    // in its future, s0 > t, or before its window) keeps m and l (alpha = 1, P = 0), as the CPU twin
    // skips it.
    for (int r = tid; r < BQ; r += kThreads) {
      const int t = t0 + r;
      float* srow = Ss + static_cast<std::size_t>(r) * g.lds();
      T* prow = Ps + static_cast<std::size_t>(r) * g.ldp();
      float mx = m[r];
      bool any = false;
      for (int c = 0; c < BK; ++c) {
        const int sk = s0 + c;
        if (g.sees(t, sk) && sk < seq) {
          srow[c] = srow[c] * g.scale;
          mx = fmaxf(mx, srow[c]);
          any = true;
        }
      }
      // 0 on the row's first block (m = −inf), 1 when nothing is new; a row that has seen no key yet
      // (m = mx = −inf, only with a window) stays as it is.
      const float a = any ? expf(m[r] - mx) : 1.0f;
      float sum = 0.0f;
      for (int c = 0; c < BK; ++c) {
        const int sk = s0 + c;
        const float p = (g.sees(t, sk) && sk < seq) ? expf(srow[c] - mx) : 0.0f;
        sum += p;
        prow[c] = from_f<T>(p);
      }
      l[r] = l[r] * a + sum;
      m[r] = mx;
      alpha[r] = a;
    }
    __syncthreads();
    for (int idx = tid; idx < BQ * D; idx += kThreads)
      Os[static_cast<std::size_t>(idx / D) * g.ldo() + idx % D] *= alpha[idx / D];
    __syncthreads();
    tile_gemm<T, false, false>(Os, g.ldo(), Ps, g.ldp(), Vs, g.ldh(), BQ, D, BK, true, g.tc);  // O += P·V
    __syncthreads();  // Ks, Vs and Ps are reloaded next
  }
  for (int idx = tid; idx < (t1 - t0) * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const float inv = 1.0f / l[r];
    out[(brow + t0 + r) * g.os + static_cast<std::size_t>(h) * D + d] =
        from_f<T>(Os[static_cast<std::size_t>(r) * g.ldo() + d] * inv);
  }
  for (int r = tid; r < t1 - t0; r += kThreads)
    lse[(static_cast<std::size_t>(b) * g.H + h) * seq + t0 + r] = m[r] + logf(l[r]);
}

// ---- backward -----------------------------------------------------------------------------------

// D_t = Σ_d dout·out per (b, h, t), d in order; one thread per row.
template <class T>
__global__ void delta_kernel(float* delta, const T* dout, const T* out, const Geometry g) {
  const std::size_t n = static_cast<std::size_t>(g.B) * g.H * g.T;
  const std::size_t idx = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int t = static_cast<int>(idx % g.T), h = static_cast<int>(idx / g.T % g.H);
  const std::size_t b = idx / g.T / g.H;
  const std::size_t at = (b * g.T + t) * g.os + static_cast<std::size_t>(h) * g.D;
  float s = 0.0f;
  for (int d = 0; d < g.D; ++d) s += to_f(dout[at + d]) * to_f(out[at + d]);
  delta[idx] = s;
}

// The tiles both backward kernels share: the score and dP tiles (fp32), the P / dS tile (S), and the
// rows' lse and D.
struct BwdSmem {
  std::size_t q, dout, k, v, acc1, acc2, s, dp, p, lse, delta, total;
};
// acc_rows: rows of the accumulators (BK for dK/dV, BQ for dQ); two accumulators when `two`.
__host__ __device__ inline BwdSmem bwd_smem(const Geometry& g, std::size_t es, int acc_rows, bool two) {
  Bump b;
  BwdSmem r;
  r.q = b.take(static_cast<std::size_t>(g.BQ) * g.ldh() * es);
  r.dout = b.take(static_cast<std::size_t>(g.BQ) * g.ldh() * es);
  r.k = b.take(static_cast<std::size_t>(g.BK) * g.ldh() * es);
  r.v = b.take(static_cast<std::size_t>(g.BK) * g.ldh() * es);
  r.acc1 = b.take(static_cast<std::size_t>(acc_rows) * g.ldo() * 4);
  r.acc2 = two ? b.take(static_cast<std::size_t>(acc_rows) * g.ldo() * 4) : r.acc1;
  r.s = b.take(static_cast<std::size_t>(g.BQ) * g.lds() * 4);
  r.dp = b.take(static_cast<std::size_t>(g.BQ) * g.lds() * 4);
  r.p = b.take(static_cast<std::size_t>(g.BQ) * g.ldp() * es);
  r.lse = b.take(static_cast<std::size_t>(g.BQ) * 4);
  r.delta = b.take(static_cast<std::size_t>(g.BQ) * 4);
  r.total = b.off;
  return r;
}

// For the query block at t0 and key block at s0 whose q, dout, k, v tiles are loaded (and the rows'
// lse and D): Ss = P (fp32, recomputed from lse), dPs = dS = P·(dP − D) (fp32), Ps = P rounded to S.
// Masked and padded elements get P = dS = 0.
template <class T>
__device__ void recompute_p_ds(float* Ss, float* dPs, T* Ps, const T* Qs, const T* dOs, const T* Ks, const T* Vs,
                               const float* lse_s, const float* delta_s, int t0, int s0, const Geometry& g) {
  tile_gemm<T, false, true>(Ss, g.lds(), Qs, g.ldh(), Ks, g.ldh(), g.BQ, g.BK, g.D, false, g.tc);    // Q·Kᵀ
  tile_gemm<T, false, true>(dPs, g.lds(), dOs, g.ldh(), Vs, g.ldh(), g.BQ, g.BK, g.D, false, g.tc);  // dO·Vᵀ
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < g.BQ * g.BK; idx += static_cast<int>(blockDim.x)) {
    const int r = idx / g.BK, c = idx % g.BK, t = t0 + r, sk = s0 + c;
    const std::size_t si = static_cast<std::size_t>(r) * g.lds() + c;
    const float p = (t < g.T && g.sees(t, sk)) ? expf(Ss[si] * g.scale - lse_s[r]) : 0.0f;
    Ss[si] = p;
    dPs[si] = p * (dPs[si] - delta_s[r]);
    Ps[static_cast<std::size_t>(r) * g.ldp() + c] = from_f<T>(p);
  }
  __syncthreads();
}

template <class T>
__device__ void load_query_rows(T* Qs, T* dOs, float* lse_s, float* delta_s, const T* q, const T* dout,
                                const float* lse, const float* delta, int b, int h, int t0, const Geometry& g) {
  const std::size_t brow = static_cast<std::size_t>(b) * g.T;
  const int valid = min(g.BQ, g.T - t0);
  load_rows(Qs, g.ldh(), q, g.qs, brow + t0, g.BQ, valid, h, g.D);
  load_rows(dOs, g.ldh(), dout, g.os, brow + t0, g.BQ, valid, h, g.D);
  const std::size_t bh = (static_cast<std::size_t>(b) * g.H + h) * g.T;
  for (int r = static_cast<int>(threadIdx.x); r < g.BQ; r += static_cast<int>(blockDim.x)) {
    lse_s[r] = r < valid ? lse[bh + t0 + r] : 0.0f;
    delta_s[r] = r < valid ? delta[bh + t0 + r] : 0.0f;
  }
}

// Grid (key blocks, KV, B): dK and dV of one key block of one kv head, summed over the group's query
// heads in head order and, for each, the query blocks that see the block, in order.
template <class T>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                                        const float* lse, const float* delta, const Geometry g) {
  ZINF_DYNAMIC_SHARED(smem);
  const BwdSmem L = bwd_smem(g, sizeof(T), g.BK, true);
  T* Qs = reinterpret_cast<T*>(smem + L.q);
  T* dOs = reinterpret_cast<T*>(smem + L.dout);
  T* Ks = reinterpret_cast<T*>(smem + L.k);
  T* Vs = reinterpret_cast<T*>(smem + L.v);
  float* dKs = reinterpret_cast<float*>(smem + L.acc1);
  float* dVs = reinterpret_cast<float*>(smem + L.acc2);
  float* Ss = reinterpret_cast<float*>(smem + L.s);
  float* dPs = reinterpret_cast<float*>(smem + L.dp);
  T* Ps = reinterpret_cast<T*>(smem + L.p);
  float* lse_s = reinterpret_cast<float*>(smem + L.lse);
  float* delta_s = reinterpret_cast<float*>(smem + L.delta);

  // Key block 0 meets every query block and the last one the fewest. Taking them in launch order
  // (heaviest first) would be the better schedule, but then ptxas spills 4 bytes of the bf16 kernel on
  // sm_90; the reversed order keeps it in registers until a GPU run says which is faster.
  const int kb = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x), j = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const int BQ = g.BQ, BK = g.BK, D = g.D, seq = g.T, group = g.H / g.KV;
  const int s0 = kb * BK, s1 = min(seq, s0 + BK);
  const int qb_end = (g.query_end(s1 - 1) + BQ - 1) / BQ;  // to the block of the last row that sees the block
  const std::size_t brow = static_cast<std::size_t>(b) * seq;

  load_rows(Ks, g.ldh(), k, g.ks, brow + s0, BK, s1 - s0, j, D);
  load_rows(Vs, g.ldh(), v, g.vs, brow + s0, BK, s1 - s0, j, D);
  fill(dKs, g.ldo(), BK, D, 0.0f);
  fill(dVs, g.ldo(), BK, D, 0.0f);
  for (int h = j * group; h < (j + 1) * group; ++h)
    for (int qb = s0 / BQ; qb < qb_end; ++qb) {
      const int t0 = qb * BQ;
      __syncthreads();  // the previous block's products are done with Qs, dOs and Ps
      load_query_rows(Qs, dOs, lse_s, delta_s, q, dout, lse, delta, b, h, t0, g);
      __syncthreads();
      recompute_p_ds(Ss, dPs, Ps, Qs, dOs, Ks, Vs, lse_s, delta_s, t0, s0, g);
      tile_gemm<T, true, false>(dVs, g.ldo(), Ps, g.ldp(), dOs, g.ldh(), BK, D, BQ, true, g.tc);  // dV += Pᵀ·dO
      __syncthreads();
      for (int idx = static_cast<int>(threadIdx.x); idx < BQ * BK; idx += kThreads)  // Ps = dS rounded to S
        Ps[static_cast<std::size_t>(idx / BK) * g.ldp() + idx % BK] =
            from_f<T>(dPs[static_cast<std::size_t>(idx / BK) * g.lds() + idx % BK]);
      __syncthreads();
      tile_gemm<T, true, false>(dKs, g.ldo(), Ps, g.ldp(), Qs, g.ldh(), BK, D, BQ, true, g.tc);  // dK += dSᵀ·Q
    }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < (s1 - s0) * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const std::size_t row = brow + s0 + r;
    dk[row * g.ks + static_cast<std::size_t>(j) * D + d] =
        from_f<T>(dKs[static_cast<std::size_t>(r) * g.ldo() + d] * g.scale);
    dv[row * g.vs + static_cast<std::size_t>(j) * D + d] = from_f<T>(dVs[static_cast<std::size_t>(r) * g.ldo() + d]);
  }
}

// Grid (query blocks, H, B): dQ of one query block, key blocks in order up to the causal limit.
template <class T>
__global__ void __launch_bounds__(kThreads) dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v,
                                                      const float* lse, const float* delta, const Geometry g) {
  ZINF_DYNAMIC_SHARED(smem);
  const BwdSmem L = bwd_smem(g, sizeof(T), g.BQ, false);
  T* Qs = reinterpret_cast<T*>(smem + L.q);
  T* dOs = reinterpret_cast<T*>(smem + L.dout);
  T* Ks = reinterpret_cast<T*>(smem + L.k);
  T* Vs = reinterpret_cast<T*>(smem + L.v);
  float* dQs = reinterpret_cast<float*>(smem + L.acc1);
  float* Ss = reinterpret_cast<float*>(smem + L.s);
  float* dPs = reinterpret_cast<float*>(smem + L.dp);
  T* Ps = reinterpret_cast<T*>(smem + L.p);
  float* lse_s = reinterpret_cast<float*>(smem + L.lse);
  float* delta_s = reinterpret_cast<float*>(smem + L.delta);

  const int nq = static_cast<int>(gridDim.x);
  const int qb = nq - 1 - static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y),
            b = static_cast<int>(blockIdx.z);
  const int j = h / (g.H / g.KV), BQ = g.BQ, BK = g.BK, D = g.D, seq = g.T;
  const int t0 = qb * BQ, t1 = min(seq, t0 + BQ);
  const std::size_t brow = static_cast<std::size_t>(b) * seq;

  load_query_rows(Qs, dOs, lse_s, delta_s, q, dout, lse, delta, b, h, t0, g);
  fill(dQs, g.ldo(), BQ, D, 0.0f);
  const int kb_end = (t1 + BK - 1) / BK;
  for (int kb = g.first_key(t0) / BK; kb < kb_end; ++kb) {
    const int s0 = kb * BK;
    __syncthreads();  // the previous block's products are done with Ks, Vs and Ps
    load_rows(Ks, g.ldh(), k, g.ks, brow + s0, BK, min(BK, seq - s0), j, D);
    load_rows(Vs, g.ldh(), v, g.vs, brow + s0, BK, min(BK, seq - s0), j, D);
    __syncthreads();
    recompute_p_ds(Ss, dPs, Ps, Qs, dOs, Ks, Vs, lse_s, delta_s, t0, s0, g);
    for (int idx = static_cast<int>(threadIdx.x); idx < BQ * BK; idx += kThreads)  // Ps = dS rounded to S
      Ps[static_cast<std::size_t>(idx / BK) * g.ldp() + idx % BK] =
          from_f<T>(dPs[static_cast<std::size_t>(idx / BK) * g.lds() + idx % BK]);
    __syncthreads();
    tile_gemm<T, false, false>(dQs, g.ldo(), Ps, g.ldp(), Ks, g.ldh(), BQ, D, BK, true, g.tc);  // dQ += dS·K
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < (t1 - t0) * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    dq[(brow + t0 + r) * g.qs + static_cast<std::size_t>(h) * D + d] =
        from_f<T>(dQs[static_cast<std::size_t>(r) * g.ldo() + d] * g.scale);
  }
}

// ---- host side ----------------------------------------------------------------------------------

Geometry geometry(const AttnShape& a, DType S) {
  if (a.H <= 0 || a.KV <= 0 || a.H % a.KV != 0 || a.D <= 0 || a.W < 0)
    throw Error("flash attention: bad head counts (H " + std::to_string(a.H) + ", KV " + std::to_string(a.KV) + ", D " +
                std::to_string(a.D) + "): H must be a positive multiple of KV");
  const ::zinf::ops::TiledAttention tl =
      ::zinf::ops::cuda_tiling(a.D, S);  // throws for heads wider than the kernels take
  Geometry g{};
  g.B = a.B, g.T = a.T, g.H = a.H, g.KV = a.KV, g.D = a.D, g.BQ = tl.block_q, g.BK = tl.block_k, g.W = a.W;
  g.qs = a.q_stride, g.ks = a.k_stride, g.vs = a.v_stride, g.os = a.o_stride;
  g.scale = 1.0f / std::sqrt(static_cast<float>(a.D));  // the float the CPU uses
  // The tensor-core branch of cuda_tiling: 16-bit S, D and both tiles multiples of 16 (wmma's shape).
  g.tc = S != DType::fp32 && a.D % 16 == 0 && tl.block_q % 16 == 0 && tl.block_k % 16 == 0;
  return g;
}

// Opts the kernel in to `bytes` of dynamic shared memory, or says why the device cannot give it.
// Once per kernel, device and larger size: the attribute calls go to the driver, and attention runs
// three times a layer per micro batch (forward, recompute, backward).
template <class K>
void allow_smem(K kernel, std::size_t bytes, const char* name) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, std::size_t> allowed;  // (kernel, device) → bytes opted in
  int dev = 0, optin = 0;
  ZINF_CUDA(cudaGetDevice(&dev));
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), dev};
  {
    std::lock_guard<std::mutex> lk(mu);
    if (auto it = allowed.find(key); it != allowed.end() && it->second >= bytes) return;
  }
  ZINF_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > static_cast<std::size_t>(optin))
    throw Error(std::string("flash attention: ") + name + " needs " + std::to_string(bytes) +
                    " bytes of shared memory per block, this GPU gives " + std::to_string(optin),
                "use device.kernels = \"reference\" on this GPU");
  ZINF_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  std::lock_guard<std::mutex> lk(mu);
  std::size_t& b = allowed[key];
  b = std::max(b, bytes);
}

template <class T>
void forward_t(void* out, float* lse, const void* q, const void* k, const void* v, const Geometry& g, cudaStream_t s) {
  const std::size_t bytes = fwd_smem(g, sizeof(T)).total;
  allow_smem(forward_kernel<T>, bytes, "flash_attention_forward");
  const dim3 grid((g.T + g.BQ - 1) / g.BQ, g.H, g.B);
  cuda::launch(forward_kernel<T>, grid, kThreads, bytes, s, static_cast<T*>(out), lse, static_cast<const T*>(q),
               static_cast<const T*>(k), static_cast<const T*>(v), g);
  ZINF_CUDA_LAUNCH_CHECK("flash_attention_forward");
}

template <class T>
void backward_t(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                const void* out, const float* lse, const Geometry& g, float* delta, cudaStream_t s) {
  const std::size_t rows = static_cast<std::size_t>(g.B) * g.H * g.T;
  cuda::launch(delta_kernel<T>, ops::blocks_for(rows, 128), 128, 0, s, delta, static_cast<const T*>(dout),
               static_cast<const T*>(out), g);
  ZINF_CUDA_LAUNCH_CHECK("flash_attention_backward_delta");
  const std::size_t kv_bytes = bwd_smem(g, sizeof(T), g.BK, true).total;
  allow_smem(dkdv_kernel<T>, kv_bytes, "flash_attention_backward_dkdv");
  cuda::launch(dkdv_kernel<T>, dim3((g.T + g.BK - 1) / g.BK, g.KV, g.B), kThreads, kv_bytes, s, static_cast<T*>(dk),
               static_cast<T*>(dv), static_cast<const T*>(dout), static_cast<const T*>(q), static_cast<const T*>(k),
               static_cast<const T*>(v), lse, delta, g);
  ZINF_CUDA_LAUNCH_CHECK("flash_attention_backward_dkdv");
  const std::size_t q_bytes = bwd_smem(g, sizeof(T), g.BQ, false).total;
  allow_smem(dq_kernel<T>, q_bytes, "flash_attention_backward_dq");
  cuda::launch(dq_kernel<T>, dim3((g.T + g.BQ - 1) / g.BQ, g.H, g.B), kThreads, q_bytes, s, static_cast<T*>(dq),
               static_cast<const T*>(dout), static_cast<const T*>(q), static_cast<const T*>(k),
               static_cast<const T*>(v), lse, delta, g);
  ZINF_CUDA_LAUNCH_CHECK("flash_attention_backward_dq");
}

}  // namespace

std::size_t flash_backward_scratch_bytes(const AttnShape& a) {
  const std::size_t n = static_cast<std::size_t>(a.B) * a.H * a.T * sizeof(float);
  return (n + 255) / 256 * 256;
}

void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const AttnShape& a,
                             DType S, cudaStream_t s) {
  if (a.B == 0 || a.T == 0) return;
  const Geometry g = geometry(a, S);
  switch (S) {
    case DType::fp32: forward_t<float>(out, lse, q, k, v, g, s); break;
    case DType::fp16: forward_t<__half>(out, lse, q, k, v, g, s); break;
    case DType::bf16: forward_t<__nv_bfloat16>(out, lse, q, k, v, g, s); break;
  }
}

void flash_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const AttnShape& a, DType S,
                              void* scratch, cudaStream_t s) {
  if (a.B == 0 || a.T == 0) return;
  const Geometry g = geometry(a, S);
  float* delta = static_cast<float*>(scratch);
  switch (S) {
    case DType::fp32: backward_t<float>(dq, dk, dv, dout, q, k, v, out, lse, g, delta, s); break;
    case DType::fp16: backward_t<__half>(dq, dk, dv, dout, q, k, v, out, lse, g, delta, s); break;
    case DType::bf16: backward_t<__nv_bfloat16>(dq, dk, dv, dout, q, k, v, out, lse, g, delta, s); break;
  }
}

}  // namespace zinf::cuda::fast
