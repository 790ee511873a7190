// ops_gpt.cpp — the reference GPT ops, the CPU backend (see ops_gpt.h for the determinism rules).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/ops_gpt.h"
#include "cpu/reference_rows.h"
#include "model/fixed_math.h"
#include "model/op_list.h"
#include "zinf/error.h"

namespace zinf::ops {

struct ChunkPool::Impl {
  tbb::task_arena arena;
  explicit Impl(int t) : arena(t) {}
};

ChunkPool::ChunkPool(int threads) : threads_(threads), impl_(std::make_unique<Impl>(threads)) {
  ZINF_CHECK(threads >= 1);
}
ChunkPool::~ChunkPool() = default;

void ChunkPool::chunks(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || threads_ == 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  impl_->arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, n, 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          for (std::size_t i = r.begin(); i != r.end(); ++i) fn(i);
        },
        tbb::simple_partitioner());
  });
}

namespace {
std::size_t nchunks(std::size_t n, std::size_t c) { return (n + c - 1) / c; }

// ---- the reference GEMM ---------------------------------------------------------------------------
// C (+)= A·B with one summation order on every machine: each output element is the sum over k of
// A(i,k)·B(k,j), added in k order starting from zero (each product and each sum one fp32 rounding),
// and only then stored into C or added to it. Vector lanes run across output columns, never along k,
// so the width of the vectors, the tile sizes and the cache sizes change only the speed, never the
// bits — unlike a tuned BLAS (or Eigen), whose k-blocking follows the caches of the CPU it runs on.
// The files are compiled with -ffp-contract=off, so no multiply and add are fused either.
using V4 = float __attribute__((vector_size(16)));
constexpr int kMr = 4;  // rows of A per micro-tile
constexpr int kNr = 8;  // columns of B per micro-tile (two 4-lane vectors)

// A strided matrix view: element (r, c) is p[r·row + c·col].
struct Operand {
  const float* p;
  std::ptrdiff_t row, col;
  float at(std::ptrdiff_t r, std::ptrdiff_t c) const { return p[r * row + c * col]; }
};

// B (K×N) copied into kNr-column panels, k-major inside a panel, zero columns past N.
class PackedB {
 public:
  PackedB(Operand b, int K, int N) : K_(K), N_(N), panels_(static_cast<int>(nchunks(N, kNr))) {
    data_.assign(static_cast<std::size_t>(panels_) * K * kNr, 0.0f);
    for (int jp = 0; jp < panels_; ++jp) {
      const int j0 = jp * kNr, nj = std::min(kNr, N - j0);
      float* d = panel(jp);
      for (int k = 0; k < K; ++k)
        for (int jj = 0; jj < nj; ++jj) d[static_cast<std::size_t>(k) * kNr + jj] = b.at(k, j0 + jj);
    }
  }
  int K() const { return K_; }
  int N() const { return N_; }
  int panels() const { return panels_; }
  const float* panel(int jp) const { return data_.data() + static_cast<std::size_t>(jp) * K_ * kNr; }

 private:
  float* panel(int jp) { return data_.data() + static_cast<std::size_t>(jp) * K_ * kNr; }
  int K_, N_, panels_;
  std::vector<float> data_;
};

// out[kMr×kNr] = Σ_k a[k]ᵀ·b[k] over one packed A panel (k-major, kMr per k) and one B panel.
void micro_kernel(int K, const float* __restrict a, const float* __restrict b, float* __restrict out) {
  V4 c[kMr][2];
  for (auto& row : c) row[0] = row[1] = V4{0, 0, 0, 0};
  for (int k = 0; k < K; ++k) {
    V4 b0, b1;
    std::memcpy(&b0, b + static_cast<std::size_t>(k) * kNr, sizeof b0);
    std::memcpy(&b1, b + static_cast<std::size_t>(k) * kNr + 4, sizeof b1);
    for (int i = 0; i < kMr; ++i) {
      const float ai = a[static_cast<std::size_t>(k) * kMr + static_cast<std::size_t>(i)];
      const V4 x = {ai, ai, ai, ai};  // a broadcast (GCC and clang both spell it so)
      c[i][0] = c[i][0] + x * b0;
      c[i][1] = c[i][1] + x * b1;
    }
  }
  for (int i = 0; i < kMr; ++i) {
    std::memcpy(out + i * kNr, &c[i][0], sizeof(V4));
    std::memcpy(out + i * kNr + 4, &c[i][1], sizeof(V4));
  }
}

// A (M×K) copied into kMr-row panels, k-major inside a panel, zero rows past M: for an A that several
// chunks share (the activations in a weight gradient), packed once.
class PackedA {
 public:
  PackedA(Operand a, int M, int K) : M_(M), K_(K), panels_(static_cast<int>(nchunks(M, kMr))) {
    data_.assign(static_cast<std::size_t>(panels_) * K * kMr, 0.0f);
    for (int k = 0; k < K; ++k)  // k outer: a transposed A (X[r, i] read as A(i, r)) is read row by row
      for (int i = 0; i < M; ++i) data_[(static_cast<std::size_t>(i / kMr) * K + k) * kMr + i % kMr] = a.at(i, k);
  }
  int M() const { return M_; }
  int K() const { return K_; }
  const float* panel(int ip) const { return data_.data() + static_cast<std::size_t>(ip) * K_ * kMr; }

 private:
  int M_, K_, panels_;
  std::vector<float> data_;
};

// Rows [i0, i0 + mi) of C from one packed A panel: C = A·B, or += A·B with `accumulate` (A·B summed
// first, then added).
void gemm_panel(const float* ap, int i0, int mi, const PackedB& b, float* c, std::ptrdiff_t ldc, bool accumulate) {
  float tile[kMr * kNr];
  for (int jp = 0; jp < b.panels(); ++jp) {
    const int j0 = jp * kNr, nj = std::min(kNr, b.N() - j0);
    micro_kernel(b.K(), ap, b.panel(jp), tile);
    for (int ii = 0; ii < mi; ++ii) {
      float* dst = c + (i0 + ii) * ldc + j0;
      const float* t = tile + ii * kNr;
      if (accumulate)
        for (int jj = 0; jj < nj; ++jj) dst[jj] += t[jj];
      else
        for (int jj = 0; jj < nj; ++jj) dst[jj] = t[jj];
    }
  }
}

// C[M×N] (row stride ldc) = A·B, or += A·B with `accumulate`; A read through a view, a panel at a time.
void gemm(Operand a, const PackedB& b, int M, float* c, std::ptrdiff_t ldc, bool accumulate) {
  const int K = b.K();
  thread_local std::vector<float> apack;
  apack.resize(static_cast<std::size_t>(K) * kMr);
  for (int i0 = 0; i0 < M; i0 += kMr) {
    const int mi = std::min(kMr, M - i0);
    for (int k = 0; k < K; ++k)
      for (int ii = 0; ii < kMr; ++ii)
        apack[static_cast<std::size_t>(k) * kMr + ii] = ii < mi ? a.at(i0 + ii, k) : 0.0f;
    gemm_panel(apack.data(), i0, mi, b, c, ldc, accumulate);
  }
}

// The same with A packed beforehand.
void gemm(const PackedA& a, const PackedB& b, float* c, std::ptrdiff_t ldc, bool accumulate) {
  for (int i0 = 0; i0 < a.M(); i0 += kMr)
    gemm_panel(a.panel(i0 / kMr), i0, std::min(kMr, a.M() - i0), b, c, ldc, accumulate);
}
}  // namespace

void matmul_forward(ChunkPool& p, float* out, const float* inp, const float* w, const float* bias, int R, int IC,
                    int OC) {
  const PackedB W({w, OC, 1}, IC, OC);
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, rows = std::min(kRowChunk, R - r0);
    float* o = out + static_cast<std::size_t>(r0) * OC;
    gemm({inp + static_cast<std::size_t>(r0) * IC, IC, 1}, W, rows, o, OC, false);
    if (bias)
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < OC; ++j) o[static_cast<std::size_t>(r) * OC + j] += bias[j];
  });
}

void matmul_gelu_forward(ChunkPool& p, float* pre, float* out, const float* inp, const float* w, const float* bias,
                         int R, int IC, int OC) {
  matmul_forward(p, pre, inp, w, bias, R, IC, OC);
  gelu_forward(p, out, pre, static_cast<std::size_t>(R) * OC);
}

void matmul_backward(ChunkPool& p, float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int R, int IC, int OC) {
  if (dinp) {
    const PackedB Wt({w, 1, OC}, OC, IC);  // B(o, i) = W[i, o]
    p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
      const int r0 = static_cast<int>(c) * kRowChunk, rows = std::min(kRowChunk, R - r0);
      gemm({dout + static_cast<std::size_t>(r0) * OC, OC, 1}, Wt, rows, dinp + static_cast<std::size_t>(r0) * IC, IC,
           true);
    });
  }
  const PackedA Xt({inp, 1, IC}, IC, R);  // A(i, r) = X[r, i]
  p.chunks(nchunks(OC, kColChunk), [&](std::size_t c) {
    const int o0 = static_cast<int>(c) * kColChunk, cols = std::min(kColChunk, OC - o0);
    const PackedB DY({dout + o0, OC, 1}, R, cols);
    gemm(Xt, DY, dw + o0, OC, true);
    if (dbias)
      for (int r = 0; r < R; ++r)
        for (int o = 0; o < cols; ++o) dbias[o0 + o] += dout[static_cast<std::size_t>(r) * OC + o0 + o];
  });
}

void layernorm_forward(ChunkPool& p, float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int R, int C) {
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * C;
      reference_rows::layernorm_forward(out + at, mean[r], rstd[r], inp + at, w, b, C);
    }
  });
}

void layernorm_backward(ChunkPool& p, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int R, int C) {
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * C;
      reference_rows::layernorm_backward(dinp + at, dout + at, inp + at, w, mean[r], rstd[r], C);
    }
  });
  p.chunks(nchunks(C, kColChunk), [&](std::size_t c) {
    const int i0 = static_cast<int>(c) * kColChunk, i1 = std::min(C, i0 + kColChunk);
    for (int r = 0; r < R; ++r) {
      const float* x = inp + static_cast<std::size_t>(r) * C;
      const float* dy = dout + static_cast<std::size_t>(r) * C;
      for (int i = i0; i < i1; ++i) {
        db[i] += dy[i];
        dw[i] += (x[i] - mean[r]) * rstd[r] * dy[i];
      }
    }
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr std::size_t kElemChunk = 1 << 14;
}  // namespace

void gelu_forward(ChunkPool& p, float* out, const float* inp, std::size_t n) {
  p.chunks(nchunks(n, kElemChunk), [&](std::size_t c) {
    const std::size_t i1 = std::min(n, (c + 1) * kElemChunk);
    for (std::size_t i = c * kElemChunk; i < i1; ++i) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + fixed::tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
    }
  });
}

void gelu_backward(ChunkPool& p, float* dinp, const float* inp, const float* dout, std::size_t n) {
  p.chunks(nchunks(n, kElemChunk), [&](std::size_t c) {
    const std::size_t i1 = std::min(n, (c + 1) * kElemChunk);
    for (std::size_t i = c * kElemChunk; i < i1; ++i) {
      const float x = inp[i];
      const float u = kGeluScale * (x + 0.044715f * x * x * x);
      const float t = fixed::tanhf(u);
      const float sech2 = 1.0f - t * t;
      const float local = 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      dinp[i] = local * dout[i];
    }
  });
}

void residual_forward(ChunkPool& p, float* out, const float* a, const float* b, std::size_t n) {
  p.chunks(nchunks(n, kElemChunk), [&](std::size_t c) {
    const std::size_t i1 = std::min(n, (c + 1) * kElemChunk);
    for (std::size_t i = c * kElemChunk; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void add_inplace(ChunkPool& p, float* acc, const float* x, std::size_t n) {
  p.chunks(nchunks(n, kElemChunk), [&](std::size_t c) {
    const std::size_t i1 = std::min(n, (c + 1) * kElemChunk);
    for (std::size_t i = c * kElemChunk; i < i1; ++i) acc[i] += x[i];
  });
}

void attention_forward(ChunkPool& p, float* out, float* att, const float* qkv, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  p.chunks(static_cast<std::size_t>(B) * H, [&](std::size_t bh) {
    const int b = static_cast<int>(bh) / H, h = static_cast<int>(bh) % H;
    for (int t = 0; t < T; ++t) {
      const float* q = qkv + (static_cast<std::size_t>(b) * T + t) * 3 * C + h * hs;
      float* a = att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
      float maxv = -INFINITY;
      for (int s = 0; s <= t; ++s) {
        const float* k = qkv + (static_cast<std::size_t>(b) * T + s) * 3 * C + C + h * hs;
        float dot = 0;
        for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
        a[s] = dot * scale;
        maxv = std::max(maxv, a[s]);
      }
      float sum = 0;
      for (int s = 0; s <= t; ++s) {
        a[s] = fixed::expf(a[s] - maxv);
        sum += a[s];
      }
      const float inv = 1.0f / sum;
      for (int s = 0; s <= t; ++s) a[s] *= inv;
      for (int s = t + 1; s < T; ++s) a[s] = 0;
      float* o = out + (static_cast<std::size_t>(b) * T + t) * C + h * hs;
      for (int i = 0; i < hs; ++i) o[i] = 0;
      for (int s = 0; s <= t; ++s) {
        const float* v = qkv + (static_cast<std::size_t>(b) * T + s) * 3 * C + 2 * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] += a[s] * v[i];
      }
    }
  });
}

void attention_backward(ChunkPool& p, float* dqkv, const float* dout, const float* qkv, const float* att,
                        const float* /*out: not needed, see ops_gpt.h*/, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  p.chunks(static_cast<std::size_t>(B) * H, [&](std::size_t bh) {
    const int b = static_cast<int>(bh) / H, h = static_cast<int>(bh) % H;
    std::vector<float> datt(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t)  // this head's slots of dqkv start at zero
      for (int part = 0; part < 3; ++part) {
        float* d = dqkv + (static_cast<std::size_t>(b) * T + t) * 3 * C + part * C + h * hs;
        for (int i = 0; i < hs; ++i) d[i] = 0;
      }
    for (int t = 0; t < T; ++t) {
      const float* a = att + ((static_cast<std::size_t>(b) * H + h) * T + t) * T;
      const float* dy = dout + (static_cast<std::size_t>(b) * T + t) * C + h * hs;
      // through the value sum: datt[s] = dy·v_s, dv_s += a[s]·dy
      for (int s = 0; s <= t; ++s) {
        const float* v = qkv + (static_cast<std::size_t>(b) * T + s) * 3 * C + 2 * C + h * hs;
        float* dv = dqkv + (static_cast<std::size_t>(b) * T + s) * 3 * C + 2 * C + h * hs;
        float d = 0;
        for (int i = 0; i < hs; ++i) {
          d += dy[i] * v[i];
          dv[i] += a[s] * dy[i];
        }
        datt[static_cast<std::size_t>(s)] = d;
      }
      // through the softmax: dpre[s] = a[s]·(datt[s] − Σ a·datt)
      float dot = 0;
      for (int s = 0; s <= t; ++s) dot += a[s] * datt[static_cast<std::size_t>(s)];
      const float* q = qkv + (static_cast<std::size_t>(b) * T + t) * 3 * C + h * hs;
      float* dq = dqkv + (static_cast<std::size_t>(b) * T + t) * 3 * C + h * hs;
      for (int s = 0; s <= t; ++s) {
        const float dpre = a[s] * (datt[static_cast<std::size_t>(s)] - dot) * scale;
        const float* k = qkv + (static_cast<std::size_t>(b) * T + s) * 3 * C + C + h * hs;
        float* dk = dqkv + (static_cast<std::size_t>(b) * T + s) * 3 * C + C + h * hs;
        for (int i = 0; i < hs; ++i) {
          dq[i] += dpre * k[i];
          dk[i] += dpre * q[i];
        }
      }
    }
  });
}

void encoder_forward(ChunkPool& p, float* out, const int* tokens, const float* wte, const float* wpe, int B, int T,
                     int C) {
  p.chunks(nchunks(static_cast<std::size_t>(B) * T, kRowChunk), [&](std::size_t c) {
    const std::size_t r1 = std::min(static_cast<std::size_t>(B) * T, (c + 1) * kRowChunk);
    for (std::size_t r = c * kRowChunk; r < r1; ++r) {
      const int t = static_cast<int>(r % static_cast<std::size_t>(T));
      const float* e = wte + static_cast<std::size_t>(tokens[r]) * C;
      const float* pe = wpe + static_cast<std::size_t>(t) * C;
      float* o = out + r * C;
      for (int i = 0; i < C; ++i) o[i] = e[i] + pe[i];
    }
  });
}

void encoder_backward(ChunkPool& p, float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C) {
  // Tokens repeat, so rows scatter into shared wte rows: split by columns, rows in order.
  p.chunks(nchunks(C, kColChunk), [&](std::size_t c) {
    const int i0 = static_cast<int>(c) * kColChunk, i1 = std::min(C, i0 + kColChunk);
    for (std::size_t r = 0; r < static_cast<std::size_t>(B) * T; ++r) {
      const int t = static_cast<int>(r % static_cast<std::size_t>(T));
      const float* d = dout + r * C;
      float* de = dwte + static_cast<std::size_t>(tokens[r]) * C;
      float* dp = dwpe + static_cast<std::size_t>(t) * C;
      for (int i = i0; i < i1; ++i) {
        de[i] += d[i];
        dp[i] += d[i];
      }
    }
  });
}

void lm_head_logits(ChunkPool& p, float* logits, const float* x, const float* wte, int R, int C, int V) {
  const PackedB Et({wte, 1, C}, C, V);  // B(c, v) = wte[v, c]
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, rows = std::min(kRowChunk, R - r0);
    gemm({x + static_cast<std::size_t>(r0) * C, C, 1}, Et, rows, logits + static_cast<std::size_t>(r0) * V, V, false);
  });
}

void softmax_crossentropy(ChunkPool& p, float* probs, float* losses, const int* targets, int R, int V) {
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, rows = std::min(kRowChunk, R - r0);
    for (int r = 0; r < rows; ++r) {
      float* l = probs + static_cast<std::size_t>(r0 + r) * V;
      float maxv = -INFINITY;
      for (int v = 0; v < V; ++v) maxv = std::max(maxv, l[v]);
      float sum = 0;
      for (int v = 0; v < V; ++v) {
        l[v] = fixed::expf(l[v] - maxv);
        sum += l[v];
      }
      const float inv = 1.0f / sum;
      for (int v = 0; v < V; ++v) l[v] *= inv;
      const int t = targets[r0 + r];
      losses[r0 + r] = t == kIgnoreTarget ? 0.0f : -fixed::logf(std::max(l[t], 1e-30f));
    }
  });
}

void lm_head_forward(ChunkPool& p, float* probs, float* losses, const float* x, const float* wte, const int* targets,
                     int R, int C, int V) {
  lm_head_logits(p, probs, x, wte, R, C, V);
  softmax_crossentropy(p, probs, losses, targets, R, V);
}

void crossentropy_backward(ChunkPool& p, float* dlogits, const float* probs, const int* targets, float dscale, int R,
                           int V) {
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, r1 = std::min(R, r0 + kRowChunk);
    for (int r = r0; r < r1; ++r) {
      const float* pr = probs + static_cast<std::size_t>(r) * V;
      float* dl = dlogits + static_cast<std::size_t>(r) * V;
      if (targets[r] == kIgnoreTarget) {  // a masked position: no gradient
        std::fill(dl, dl + V, 0.0f);
        continue;
      }
      for (int v = 0; v < V; ++v) dl[v] = (pr[v] - (v == targets[r] ? 1.0f : 0.0f)) * dscale;
    }
  });
}

void lm_head_backward_gemms(ChunkPool& p, float* dx, float* dwte, const float* dlogits, const float* x,
                            const float* wte, int R, int C, int V) {
  const PackedB E({wte, C, 1}, V, C);
  p.chunks(nchunks(R, kRowChunk), [&](std::size_t c) {
    const int r0 = static_cast<int>(c) * kRowChunk, rows = std::min(kRowChunk, R - r0);
    gemm({dlogits + static_cast<std::size_t>(r0) * V, V, 1}, E, rows, dx + static_cast<std::size_t>(r0) * C, C, false);
  });
  const PackedB X({x, C, 1}, R, C);
  p.chunks(nchunks(V, kColChunk), [&](std::size_t c) {
    const int v0 = static_cast<int>(c) * kColChunk, rows = std::min(kColChunk, V - v0);
    gemm({dlogits + v0, 1, V}, X, rows, dwte + static_cast<std::size_t>(v0) * C, C, true);  // A(v, r) = dlogits[r, v]
  });
}

void lm_head_backward(ChunkPool& p, float* dx, float* dwte, float* dlogits, const float* probs, const float* x,
                      const float* wte, const int* targets, float dscale, int R, int C, int V) {
  crossentropy_backward(p, dlogits, probs, targets, dscale, R, V);
  lm_head_backward_gemms(p, dx, dwte, dlogits, x, wte, R, C, V);
}

void copy(ChunkPool&, float* dst, const float* src, std::size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void zero(ChunkPool&, float* x, std::size_t n) { std::memset(x, 0, n * sizeof(float)); }

}  // namespace zinf::ops
