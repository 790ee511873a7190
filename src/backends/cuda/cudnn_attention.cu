// cudnn_attention.cu — CudnnAttention (cudnn_attention.h): cuDNN's fused flash attention through the
// graph backend API (cudnnBackendCreateDescriptor / SetAttribute / Finalize / Execute), no frontend.
//
// Shapes, spelled once: B batch, T sequence, H query heads, KV key/value heads (G = H / KV query heads
// per key/value head), D head width, scale = 1/√D. Every graph tensor is 4-D [b, h, row, col] with
// strides in elements over zinf's row-major buffers (rows b·T + t of stride q/k/v/o_stride, head h at
// column h·D), so nothing is copied or transposed: a transpose is a tensor whose last two strides are
// swapped. K and V carry KV heads where Q carries H: cuDNN's SDPA convention for grouped-query heads
// (query head h reads key/value head h / G).
//
// Forward graph (S, P [B, H, T, T] are virtual: the fused kernel never writes them):
//   S  = matmul(Q, Kᵀ) · scale;  S masked where key j > query i (GEN_INDEX rows and columns, CMP_GE,
//   BINARY_SELECT); with a sliding window W also outside the band j + W > i, in the form
//   cudnn-frontend gives its left bound (fresh GEN_INDEX of the masked scores, ADD of the by-value W
//   to the column index, CMP_GT against the row index, BINARY_SELECT: the form cuDNN skips whole
//   tiles for);  m = max_j S;  e = exp(S - m);  l = Σ_j e;
//   stats = m + log(l)  → lse [B, H, T, 1] (fp32, the state the backward reads);
//   P = e / l (rounded to S: the tensor cores' input);  O = matmul(P, V).
// Backward graph, in the form cudnn-frontend's SDPA backward takes to cuDNN (the form its fused
// engines recognise): the query-by-key orientation, every graph input with its last stride 1 but the
// stride-swapped Kᵀ and Vᵀ views, and transposes as RESHAPE nodes (a view of the same elements):
//   Δ = (Σ_d dO ∘ O) · 1  → softmax_sum [B, H, T, 1] fp32, a graph output in zinf's scratch;
//   P = exp(mask(Q·Kᵀ · scale − stats));  Pᵀ = reshape(P) (rounded to S);  dV = Pᵀ·dO;
//   dS = P ∘ (dO·Vᵀ − Δ) · scale (fp32);  dSᵀ = reshape(dS) (rounded to S);  dK = dSᵀ·Q;
//   K = reshape(Kᵀ) (as fp32);  dQ = dS·K, written directly (no fp32 accumulator: the deterministic form).
// The backward is refused (the wmma kernel's runs) where the frontend refuses or works around it:
// cuDNN 9.10.0 and 9.10.1, cuDNN 9.15.0 and earlier at a sequence length that is not a multiple of
// 128, and a sequence of one position; the 16-bit forward is refused too at 9.10.0 and 9.10.1, and a
// sliding window before 9.2, as the frontend refuses them.
// With KV < H the dK and dV products run per query head into virtual [B, H, T, D] tensors that a
// reduction sums into the KV heads (query head h belongs to key/value head h / G), inside the graph.
//
// A masked score is set to mask_value(cudnnGetVersion()), passed by value: the lowest float before
// cuDNN 9.10.0, −∞ from then on (as cudnn-frontend does).
// Plans: heuristics mode A, the first engine configuration without the NONDETERMINISTIC numerical
// note whose workspace fits cudnn_workspace_bytes (zinf/device_memory.h: the ceiling, which zinf
// plan counts). The workspace taken is the chosen plans' own need (their
// CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE): taken on the first accepted shape, grown for a shape
// whose plans need more after the stream drains.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/cudnn_attention.h"
#include "cuda/scratch.h"
#include "zinf/device_memory.h"
#include "zinf/error.h"

namespace zinf::cuda {
namespace {

using Desc = cudnnBackendDescriptor_t;

std::string status_text(cudnnStatus_t st) {
  return std::string(cudnnGetErrorString(st)) + " (" + std::to_string(static_cast<int>(st)) + ")";
}
// The NOT_SUPPORTED family (3000..3999): the graph, the shape or the GPU is outside what cuDNN runs.
bool refused(cudnnStatus_t st) { return static_cast<int>(st) / 1000 == 3; }

// Thrown while a plan is built when cuDNN answers NOT_SUPPORTED; anything else is a zinf::Error.
struct Refused {
  std::string why;
};

void check(cudnnStatus_t st, const char* call) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  if (refused(st)) throw Refused{std::string(call) + ": " + status_text(st)};
  throw Error(std::string("cuDNN attention: ") + call + " failed: " + status_text(st));
}
#define ZINF_CUDNN(x) check((x), #x)

// One backend descriptor, destroyed with its owner.
class Owned {
 public:
  explicit Owned(cudnnBackendDescriptorType_t t) { ZINF_CUDNN(cudnnBackendCreateDescriptor(t, &d_)); }
  ~Owned() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc get() const { return d_; }
  void set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, std::int64_t count, const void* v) {
    ZINF_CUDNN(cudnnBackendSetAttribute(d_, n, t, count, v));
  }
  void set_desc(cudnnBackendAttributeName_t n, const Owned& o) {
    Desc d = o.get();
    set(n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  void set_i64(cudnnBackendAttributeName_t n, std::int64_t v) { set(n, CUDNN_TYPE_INT64, 1, &v); }
  void set_type(cudnnBackendAttributeName_t n, cudnnDataType_t v) { set(n, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  void finalize() { ZINF_CUDNN(cudnnBackendFinalize(d_)); }

 private:
  Desc d_ = nullptr;
};

// Tensor unique ids of the graphs' inputs and outputs (the variant pack's keys).
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kScale,
  kMask,           // by value: what masked scores are set to, mask_value(the cuDNN version)
  kWindow,         // W, as a float: a sliding window's length (query i sees keys j with j + W > i)
  kOne,            // 1.0 by value: the softmax sum's scale (the frontend's form)
  kSoftmaxSum,     // Δ [B, H, T, 1] fp32: written by the backward graph, in zinf's scratch
  kVirtual = 100,  // and up: the graphs' virtual tensors
};

cudnnDataType_t cudnn_type(DType S) { return S == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// A graph under construction: tensors and operations, owned until the graph is finalized.
class Graph {
 public:
  explicit Graph(cudnnHandle_t h) : handle_(h) {}

  const Owned& tensor(std::int64_t uid, cudnnDataType_t type, std::vector<std::int64_t> dims,
                      std::vector<std::int64_t> strides, bool is_virtual = false, bool by_value = false,
                      std::int64_t align = 16) {
    Owned t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(dims.size()), dims.data());
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<std::int64_t>(strides.size()), strides.data());
    t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
    t.set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, align);
    if (is_virtual) {
      bool yes = true;
      t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    if (by_value) {
      bool yes = true;
      t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    t.finalize();
    keep_.push_back(std::move(t));
    return keep_.back();
  }
  // A virtual tensor of `dims`, packed row-major.
  const Owned& virt(cudnnDataType_t type, const std::vector<std::int64_t>& dims) {
    std::vector<std::int64_t> strides(dims.size());
    std::int64_t s = 1;
    for (std::size_t i = dims.size(); i-- > 0;) strides[i] = s, s *= dims[i];
    return view(type, dims, strides);
  }
  // A virtual tensor of `dims` with the strides given (a RESHAPE's view of another tensor's elements).
  const Owned& view(cudnnDataType_t type, const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  // A scalar passed by value in the variant pack (the scale, the mask value, the window): one
  // descriptor per uid, however many nodes read it.
  const Owned& scalar(std::int64_t uid) {
    if (auto it = scalars_.find(uid); it != scalars_.end()) return *it->second;
    const Owned& t = tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    scalars_.emplace(uid, &t);
    return t;
  }

  void matmul(const Owned& a, const Owned& b, const Owned& c) {
    Owned mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, mm,
              {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, &a},
               {CUDNN_ATTR_OPERATION_MATMUL_BDESC, &b},
               {CUDNN_ATTR_OPERATION_MATMUL_CDESC, &c},
               {CUDNN_ATTR_OPERATION_MATMUL_DESC, &mm}});
  }
  // y = mode(x[, b][, t]); axis only for GEN_INDEX.
  // Math in fp32, the comparisons' in BOOLEAN (as cudnn-frontend builds its causal mask).
  void pointwise(cudnnPointwiseMode_t mode, const Owned& x, const Owned* b, const Owned& y, const Owned* t = nullptr,
                 std::int64_t axis = -1) {
    Owned pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    const bool comparison = mode == CUDNN_POINTWISE_CMP_GE || mode == CUDNN_POINTWISE_CMP_GT;
    pw.set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, comparison ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, pw,
              {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &pw},
               {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &x},
               {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
               {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
               {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &y}});
  }
  // y = x viewed with y's dims and strides (the same elements, stored in y's type).
  void reshape(const Owned& x, const Owned& y) {
    Owned op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    add(std::move(op));
  }
  // y = reduce(x) over the dimensions where y's extent is 1 and x's is not, and over the groups of a
  // dimension y holds fewer of (x's extent G times y's: element o sums x's o·G … o·G + G − 1).
  void reduction(cudnnReduceTensorOp_t mode, const Owned& x, const Owned& y) {
    Owned rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    rd.set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, rd,
              {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &x},
               {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &y},
               {CUDNN_ATTR_OPERATION_REDUCTION_DESC, &rd}});
  }
  // Finalizes `desc` (the operation's own matmul, pointwise or reduction descriptor, kept with the
  // graph from here) and adds an operation of `type` that links each attribute, in order, to its
  // descriptor (`desc` or a tensor; a null one is left unset).
  void operation(cudnnBackendDescriptorType_t type, Owned& desc,
                 std::initializer_list<std::pair<cudnnBackendAttributeName_t, const Owned*>> links) {
    desc.finalize();
    Owned op(type);
    for (const auto& [attr, d] : links)
      if (d) op.set_desc(attr, *d);
    op.finalize();
    keep_.push_back(std::move(desc));
    add(std::move(op));
  }

  // The scores a·b times the by-value scale kScale: a [dims] fp32 tensor, masked by causal() below
  // (the forward masks them at once, the backward after subtracting the statistics).
  const Owned& scaled_scores(const Owned& a, const Owned& b, const std::vector<std::int64_t>& dims) {
    const Owned& s = virt(CUDNN_DATA_FLOAT, dims);
    matmul(a, b, s);
    const Owned& scaled = virt(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_MUL, s, &scalar(kScale), scaled);
    return scaled;
  }

  // The causal mask on a [b, h, query i, key j] score tensor: masked (to the by-value kMask) where
  // j > i — the frontend's right bound of 0, row CMP_GE column — and with a sliding window also where
  // j + W ≤ i — its top-left left bound: the column index plus the by-value W (as a float), CMP_GT the
  // row index, over fresh indices of the causally masked scores, as the frontend's band node expands.
  const Owned& causal(const Owned& s, const std::vector<std::int64_t>& dims, bool window) {
    const Owned& out = band(s, dims, false);
    return window ? band(out, dims, true) : out;
  }
  // One bound of the band: s where the comparison holds, kMask elsewhere.
  const Owned& band(const Owned& s, const std::vector<std::int64_t>& dims, bool left) {
    const Owned& row = virt(CUDNN_DATA_INT32, dims);
    const Owned& col = virt(CUDNN_DATA_INT32, dims);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, nullptr, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, nullptr, 3);
    const Owned& keep = virt(CUDNN_DATA_BOOLEAN, dims);
    if (left) {
      const Owned& shifted = virt(CUDNN_DATA_FLOAT, dims);  // j + W
      pointwise(CUDNN_POINTWISE_ADD, col, &scalar(kWindow), shifted);
      pointwise(CUDNN_POINTWISE_CMP_GT, shifted, &row, keep);
    } else {
      pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep);
    }
    const Owned& out = virt(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &scalar(kMask), out, &keep);
    return out;
  }

  // Finalizes the operation graph and builds a plan from the first deterministic engine configuration
  // whose workspace fits; returns the plan (Refused when cuDNN offers none).
  Owned plan(std::int64_t workspace_limit, std::int64_t& workspace) {
    Owned g(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    std::vector<Desc> ops;
    for (const Owned& o : ops_) ops.push_back(o.get());
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(ops.size()),
          ops.data());
    cudnnHandle_t h = handle_;
    g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    g.finalize();

    Owned heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heur.finalize();
    constexpr int kMaxConfigs = 16;
    std::vector<Owned> cfgs;
    std::vector<Desc> cfg_ptrs;
    for (int i = 0; i < kMaxConfigs; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      cfg_ptrs.push_back(cfgs.back().get());
    }
    std::int64_t n = 0;
    ZINF_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                        kMaxConfigs, &n, cfg_ptrs.data()));
    std::string why = "no engine configuration";
    for (std::int64_t i = 0; i < n && i < kMaxConfigs; ++i) {
      Owned engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      Desc e = engine.get();
      std::int64_t got = 0;
      ZINF_CUDNN(cudnnBackendGetAttribute(cfg_ptrs[static_cast<std::size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &e));
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      std::int64_t n_notes = 0;
      ZINF_CUDNN(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                          CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_notes, notes));
      bool deterministic = true;
      for (std::int64_t k = 0; k < n_notes; ++k)
        if (notes[k] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) deterministic = false;
      if (!deterministic) {
        why = "only nondeterministic engines";
        continue;
      }
      try {
        Owned p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        p.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        Desc c = cfg_ptrs[static_cast<std::size_t>(i)];
        p.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
        p.finalize();
        std::int64_t ws = 0;
        ZINF_CUDNN(cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                            &got, &ws));
        if (ws > workspace_limit) {
          why = "every deterministic engine needs more than " + std::to_string(workspace_limit >> 20) +
                " MiB of workspace";
          continue;
        }
        workspace = ws;
        return p;
      } catch (const Refused& r) {
        why = r.why;
      } catch (const Error& err) {  // this configuration failed to build (a runtime compile, say): the next
        why = err.what();
      }
    }
    throw Refused{why};
  }

 private:
  void add(Owned op) { ops_.push_back(std::move(op)); }
  cudnnHandle_t handle_;
  std::int64_t next_virtual_ = kVirtual;
  std::deque<Owned> keep_;  // tensors and op descriptors the operations point at (references stay valid)
  std::map<std::int64_t, const Owned*> scalars_;
  std::vector<Owned> ops_;
};

// 4-D views of zinf's row-major buffers: [b, h, t, d] of rows with stride `row`, head width D.
std::vector<std::int64_t> bhtd_strides(const fast::AttnShape& a, long row) {
  return {static_cast<std::int64_t>(a.T) * row, a.D, row, 1};
}
std::vector<std::int64_t> bhdt_strides(const fast::AttnShape& a, long row) {  // the transpose [b, h, d, t]
  return {static_cast<std::int64_t>(a.T) * row, a.D, 1, row};
}
std::int64_t alignment(const fast::AttnShape& a, DType S) {
  const long e = static_cast<long>(dtype_bytes(S));
  for (long s : {a.q_stride, a.k_stride, a.v_stride, a.o_stride, static_cast<long>(a.D)})
    if ((s * e) % 16 != 0) return e;
  return 16;
}

using Key = std::tuple<int, int, int, int, int, long, long, long, long, int, bool>;
Key key_of(const fast::AttnShape& a, DType S) {  // a window's length is passed by value: one plan serves any
  return {a.B, a.T, a.H, a.KV, a.D, a.q_stride, a.k_stride, a.v_stride, a.o_stride, static_cast<int>(S), a.W > 0};
}

std::string shape_text(const fast::AttnShape& a, DType S) {
  return "B " + std::to_string(a.B) + ", T " + std::to_string(a.T) + ", H " + std::to_string(a.H) + ", KV " +
         std::to_string(a.KV) + ", D " + std::to_string(a.D) + (a.W > 0 ? ", window " + std::to_string(a.W) : "") +
         ", " + std::string(to_string(S));
}

}  // namespace

struct CudnnAttention::Impl {
  struct Plans {
    bool accepted = false;           // the forward runs on cuDNN
    bool backward_accepted = false;  // and the backward too (else the wmma kernel's, from the same lse)
    std::optional<Owned> fwd, bwd;
    std::int64_t fwd_ws = 0, bwd_ws = 0;  // each chosen plan's workspace size
    float mask = 0;                       // mask_value of the cuDNN version the plans were built with
    long fwd_runs = 0, bwd_runs = 0;
    double fwd_ms = 0, bwd_ms = 0;
    std::string refusal;
  };
  Device& dev;
  cudaStream_t stream;
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::unique_ptr<Plans>> plans;
  DeviceBuffer workspace;  // the largest workspace need of the accepted shapes' plans

  static std::size_t workspace_limit(const fast::AttnShape& a) {
    const std::uint64_t bh = static_cast<std::uint64_t>(a.B) * static_cast<std::uint64_t>(a.H);
    return static_cast<std::size_t>(cudnn_workspace_bytes(bh, static_cast<std::uint64_t>(a.T),
                                                          bh * static_cast<std::uint64_t>(a.T) * static_cast<std::uint64_t>(a.D)));
  }
  Scratch softmax_sum{"cuDNN attention: the backward's softmax sums"};  // Δ, B·H·T floats

  Impl(Device& d, cudaStream_t s) : dev(d), stream(s) {
    const cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS)
      throw Error("cuDNN attention: cudnnCreate failed: " + status_text(st),
                  "set device.attention to wmma to run the project's own flash kernel");
    if (const cudnnStatus_t e = cudnnSetStream(handle, stream); e != CUDNN_STATUS_SUCCESS)
      throw Error("cuDNN attention: cudnnSetStream failed: " + status_text(e));
  }
  ~Impl() {
    plans.clear();
    if (handle) cudnnDestroy(handle);
  }

  void build_forward(Plans& p, const fast::AttnShape& a, DType S) {
    // What cudnn-frontend refuses for a 16-bit forward, refused here: the wmma kernel runs instead.
    if (std::string why = forward_refusal(cudnnGetVersion(), a.W > 0); !why.empty()) throw Refused{why};
    const cudnnDataType_t io = cudnn_type(S);
    const std::int64_t B = a.B, T = a.T, H = a.H, KV = a.KV, D = a.D;
    const std::int64_t al = alignment(a, S);
    const std::vector<std::int64_t> bhtt{B, H, T, T}, stats_dims{B, H, T, 1}, stats_strides{H * T, T, 1, 1};
    const std::int64_t limit = static_cast<std::int64_t>(workspace_limit(a));
    {
      Graph g(handle);
      const Owned& q = g.tensor(kQ, io, {B, H, T, D}, bhtd_strides(a, a.q_stride), false, false, al);
      const Owned& kt = g.tensor(kK, io, {B, KV, D, T}, bhdt_strides(a, a.k_stride), false, false, al);
      const Owned& v = g.tensor(kV, io, {B, KV, T, D}, bhtd_strides(a, a.v_stride), false, false, al);
      const Owned& o = g.tensor(kO, io, {B, H, T, D}, bhtd_strides(a, a.o_stride), false, false, al);
      const Owned& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, stats_dims, stats_strides);
      const Owned& sm = g.causal(g.scaled_scores(q, kt, bhtt), bhtt, a.W > 0);
      const Owned& mx = g.virt(CUDNN_DATA_FLOAT, stats_dims);
      g.reduction(CUDNN_REDUCE_TENSOR_MAX, sm, mx);
      const Owned& sub = g.virt(CUDNN_DATA_FLOAT, bhtt);
      g.pointwise(CUDNN_POINTWISE_SUB, sm, &mx, sub);
      const Owned& e = g.virt(CUDNN_DATA_FLOAT, bhtt);
      g.pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, e);
      const Owned& l = g.virt(CUDNN_DATA_FLOAT, stats_dims);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, l);
      const Owned& logl = g.virt(CUDNN_DATA_FLOAT, stats_dims);
      g.pointwise(CUDNN_POINTWISE_LOG, l, nullptr, logl);
      g.pointwise(CUDNN_POINTWISE_ADD, mx, &logl, stats);
      const Owned& pr = g.virt(io, bhtt);
      g.pointwise(CUDNN_POINTWISE_DIV, e, &l, pr);
      g.matmul(pr, v, o);
      p.fwd.emplace(g.plan(limit, p.fwd_ws));
    }
  }

  // The backward, in cudnn-frontend's form (the file's header).
  void build_backward(Plans& p, const fast::AttnShape& a, DType S) {
    const cudnnDataType_t io = cudnn_type(S);
    const std::int64_t B = a.B, T = a.T, H = a.H, KV = a.KV, D = a.D;
    const std::int64_t al = alignment(a, S);
    const std::vector<std::int64_t> bhtt{B, H, T, T}, stats_dims{B, H, T, 1}, stats_strides{H * T, T, 1, 1};
    const std::vector<std::int64_t> transposed{H * T * T, T * T, 1, T};  // [b, h, j, i] over a packed [b, h, i, j]
    const std::int64_t limit = static_cast<std::int64_t>(workspace_limit(a));
    // What cudnn-frontend refuses or works around for this backward, refused here: the wmma kernel's
    // backward runs instead.
    if (std::string why = backward_refusal(cudnnGetVersion(), a.T); !why.empty()) throw Refused{why};
    Graph g(handle);
    const Owned& q = g.tensor(kQ, io, {B, H, T, D}, bhtd_strides(a, a.q_stride), false, false, al);
    const Owned& kt = g.tensor(kK, io, {B, KV, D, T}, bhdt_strides(a, a.k_stride), false, false, al);
    const Owned& vt = g.tensor(kV, io, {B, KV, D, T}, bhdt_strides(a, a.v_stride), false, false, al);
    const Owned& o = g.tensor(kO, io, {B, H, T, D}, bhtd_strides(a, a.o_stride), false, false, al);
    const Owned& dout = g.tensor(kDO, io, {B, H, T, D}, bhtd_strides(a, a.o_stride), false, false, al);
    const Owned& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, stats_dims, stats_strides);
    const Owned& delta = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, stats_dims, stats_strides);
    const Owned& dq = g.tensor(kDQ, io, {B, H, T, D}, bhtd_strides(a, a.q_stride), false, false, al);
    const Owned& dk = g.tensor(kDK, io, {B, KV, T, D}, bhtd_strides(a, a.k_stride), false, false, al);
    const Owned& dv = g.tensor(kDV, io, {B, KV, T, D}, bhtd_strides(a, a.v_stride), false, false, al);
    // Δ = (Σ_d dO ∘ O) · 1
    const Owned& prod = g.virt(CUDNN_DATA_FLOAT, {B, H, T, D});
    g.pointwise(CUDNN_POINTWISE_MUL, dout, &o, prod);
    const Owned& rowsum = g.virt(CUDNN_DATA_FLOAT, stats_dims);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
    g.pointwise(CUDNN_POINTWISE_MUL, rowsum, &g.scalar(kOne), delta);
    // P = exp(mask(Q·Kᵀ · scale − stats)): the mask after the subtraction, as the frontend has it
    const Owned& scores = g.scaled_scores(q, kt, bhtt);
    const Owned& sub = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pointwise(CUDNN_POINTWISE_SUB, scores, &stats, sub);
    const Owned& masked = g.causal(sub, bhtt, a.W > 0);
    const Owned& pr = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, pr);
    // dV = Pᵀ·dO, summed over each key/value head's query heads when they are grouped.
    const Owned& prt = g.view(io, bhtt, transposed);
    g.reshape(pr, prt);
    grouped_product(g, prt, dout, dv, {B, H, T, D}, io, KV != H);
    // dS = P ∘ (dO·Vᵀ − Δ) · scale
    const Owned& dp = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.matmul(dout, vt, dp);
    const Owned& diff = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pointwise(CUDNN_POINTWISE_SUB, dp, &delta, diff);
    const Owned& pds = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pointwise(CUDNN_POINTWISE_MUL, diff, &pr, pds);
    const Owned& ds = g.virt(CUDNN_DATA_FLOAT, bhtt);
    g.pointwise(CUDNN_POINTWISE_MUL, pds, &g.scalar(kScale), ds);
    // dK = dSᵀ·Q (grouped as dV); dQ = dS·K, K the view of Kᵀ's elements, read as fp32 like dS.
    const Owned& dst = g.view(io, bhtt, transposed);
    g.reshape(ds, dst);
    grouped_product(g, dst, q, dk, {B, H, T, D}, io, KV != H);
    const Owned& k = g.view(CUDNN_DATA_FLOAT, {B, KV, T, D}, bhtd_strides(a, a.k_stride));
    g.reshape(kt, k);
    g.matmul(ds, k, dq);
    p.bwd.emplace(g.plan(limit, p.bwd_ws));
  }
  // c = a·b into the KV heads of c: directly, or per query head into a virtual `full` tensor that a
  // reduction sums by group.
  static void grouped_product(Graph& g, const Owned& a, const Owned& b, const Owned& c,
                              const std::vector<std::int64_t>& full, cudnnDataType_t io, bool grouped) {
    if (!grouped) return g.matmul(a, b, c);
    const Owned& per_head = g.virt(io, full);
    g.matmul(a, b, per_head);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_head, c);
  }

  // The shape's plans, built on the first ask. A refusal is remembered (and said once): of the
  // forward, the shape runs the wmma kernel both ways; of the backward alone, cuDNN's forward and the
  // wmma kernel's backward, which reads the same output and log-sum-exp. Any other failure while
  // building throws and leaves nothing cached, so the next call fails the same way instead of
  // switching kernels.
  Plans& plans_for(const fast::AttnShape& a, DType S) {
    const Key key = key_of(a, S);
    if (auto it = plans.find(key); it != plans.end()) return *it->second;
    auto p = std::make_unique<Plans>();
    p->mask = mask_value(cudnnGetVersion());
    if (S == DType::bf16 || S == DType::fp16) {  // fp32 runs stay on the wmma path's FMA tiles
      try {
        timed(p->fwd_ms, [&] { build_forward(*p, a, S); });
        log_plan("forward", a, S, p->fwd_ms, p->fwd_ws, nullptr);
        try {
          timed(p->bwd_ms, [&] { build_backward(*p, a, S); });
          log_plan("backward", a, S, p->bwd_ms, p->bwd_ws, nullptr);
          p->backward_accepted = true;
        } catch (const Refused& r) {
          log_plan("backward", a, S, p->bwd_ms, 0, &r);
          p->refusal = r.why;
          std::fprintf(stderr,
                       "zinf: cuDNN refused the attention backward at %s (%s); this shape's backward runs the wmma "
                       "flash kernel, its forward cuDNN's\n",
                       shape_text(a, S).c_str(), r.why.c_str());
        }
        // The chosen plans' own need (the cap only bounded which engines were eligible).
        const auto need = static_cast<std::size_t>(std::max(p->fwd_ws, p->backward_accepted ? p->bwd_ws : 0));
        if (workspace.size() < need) {
          ZINF_CUDA(cudaStreamSynchronize(stream));  // queued plans may still use the old block
          // Made before the old block goes: if it cannot be had, the error leaves this shape uncached
          // and the shapes planned before keep the block their plans need.
          DeviceBuffer grown(dev, need, "cuDNN attention workspace");
          workspace = std::move(grown);
        }
        p->accepted = true;
      } catch (const Refused& r) {
        if (!p->fwd) log_plan("forward", a, S, p->fwd_ms, 0, &r);
        p->refusal = r.why;
        p->backward_accepted = false;
        std::fprintf(stderr, "zinf: cuDNN refused attention at %s (%s); this shape runs the wmma flash kernel\n",
                     shape_text(a, S).c_str(), r.why.c_str());
      }
    } else {
      p->refusal = "fp32 runs the wmma path's FMA tiles";
    }
    return *plans.emplace(key, std::move(p)).first->second;
  }
  // Runs `build`, adding its wall time in milliseconds to `ms` also when it throws.
  template <class F>
  static void timed(double& ms, F&& build) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Stop {
      double& ms;
      std::chrono::steady_clock::time_point t0;
      ~Stop() { ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); }
    } stop{ms, t0};
    build();
  }
  // With ZINF_CUDNN_LOG_PLANS=1: one line per plan built (or refused) with its time and workspace.
  static void log_plan(const char* what, const fast::AttnShape& a, DType S, double ms, std::int64_t ws,
                       const Refused* refused) {
    const char* on = std::getenv("ZINF_CUDNN_LOG_PLANS");
    if (!on || std::string(on) != "1") return;
    if (refused)
      std::fprintf(stderr, "zinf: cuDNN attention %s plan at %s: refused after %.1f ms (%s)\n", what,
                   shape_text(a, S).c_str(), ms, refused->why.c_str());
    else
      std::fprintf(stderr, "zinf: cuDNN attention %s plan at %s: built in %.1f ms, workspace %lld bytes\n", what,
                   shape_text(a, S).c_str(), ms, static_cast<long long>(ws));
  }

  void execute(Desc plan, const std::vector<std::int64_t>& uids, const std::vector<void*>& ptrs, const char* what) {
    Owned pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    try {
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(uids.size()),
               uids.data());
      pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(ptrs.size()),
               ptrs.data());
      void* ws = workspace.size() > 0 ? workspace.as<void>() : nullptr;
      pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
      pack.finalize();
      ZINF_CUDNN(cudnnBackendExecute(handle, plan, pack.get()));
    } catch (const Refused& r) {  // after the plan was built, a refusal is a failure like any other
      throw Error(std::string("cuDNN attention ") + what + " failed while running: " + r.why);
    }
  }
};

CudnnAttention::CudnnAttention(Device& dev, cudaStream_t stream) : impl_(std::make_unique<Impl>(dev, stream)) {}
CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::accepts(const fast::AttnShape& a, DType S) { return impl_->plans_for(a, S).accepted; }
bool CudnnAttention::accepts_backward(const fast::AttnShape& a, DType S) {
  return impl_->plans_for(a, S).backward_accepted;
}

std::size_t CudnnAttention::backward_scratch_bytes(const fast::AttnShape& a) {
  return static_cast<std::size_t>(cudnn_backward_scratch_bytes(static_cast<std::uint64_t>(a.B) * a.H * a.T));
}

void CudnnAttention::forward(void* out, float* lse, const void* q, const void* k, const void* v,
                             const fast::AttnShape& a, DType S) {
  Impl::Plans& p = impl_->plans_for(a, S);
  if (!p.accepted) throw Error("cuDNN attention: forward called for a shape cuDNN refused (" + shape_text(a, S) + ")");
  float scale = 1.0f / std::sqrt(static_cast<float>(a.D));
  float masked = p.mask, window = static_cast<float>(a.W);
  std::vector<std::int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kMask};
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse, &scale, &masked};
  if (a.W > 0) uids.push_back(kWindow), ptrs.push_back(&window);
  impl_->execute(p.fwd->get(), uids, ptrs, "forward");
  ++p.fwd_runs;
}

void CudnnAttention::backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, const fast::AttnShape& a, DType S) {
  Impl::Plans& p = impl_->plans_for(a, S);
  if (!p.backward_accepted)
    throw Error("cuDNN attention: backward called for a shape whose backward cuDNN refused (" + shape_text(a, S) + ")");
  float scale = 1.0f / std::sqrt(static_cast<float>(a.D));
  float masked = p.mask, window = static_cast<float>(a.W), one = 1.0f;
  void* sums = impl_->softmax_sum.get(impl_->dev, impl_->stream, backward_scratch_bytes(a));
  auto in = [](const void* x) { return const_cast<void*>(x); };
  std::vector<std::int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kSoftmaxSum, kDQ, kDK, kDV, kScale, kMask, kOne};
  std::vector<void*> ptrs{in(q), in(k), in(v), in(out), in(dout), in(lse), sums, dq, dk, dv, &scale, &masked, &one};
  if (a.W > 0) uids.push_back(kWindow), ptrs.push_back(&window);
  impl_->execute(p.bwd->get(), uids, ptrs, "backward");
  ++p.bwd_runs;
}

CudnnAttention::Route CudnnAttention::route(const fast::AttnShape& a, DType S) const {
  Route r;
  const auto it = impl_->plans.find(key_of(a, S));
  if (it == impl_->plans.end()) return r;
  const Impl::Plans& p = *it->second;
  r.planned = true;
  r.forward_cudnn = p.accepted;
  r.backward_cudnn = p.accepted && p.backward_accepted;
  r.forward_runs = p.fwd_runs, r.backward_runs = p.bwd_runs;
  r.forward_build_ms = p.fwd_ms, r.backward_build_ms = p.bwd_ms;
  r.forward_workspace = static_cast<std::size_t>(p.fwd_ws), r.backward_workspace = static_cast<std::size_t>(p.bwd_ws);
  r.mask_value = p.mask;
  r.refusal = p.refusal;
  return r;
}

std::size_t CudnnAttention::workspace_bytes() const { return impl_->workspace.size(); }

std::size_t CudnnAttention::runtime_version() { return cudnnGetVersion(); }

std::string CudnnAttention::forward_refusal(std::size_t version, bool windowed) {
  if (version >= 91000 && version < 91002) return "cuDNN 9.10.0 and 9.10.1 have known faults in the 16-bit forward";
  if (windowed && version < 90200) return "a sliding window needs cuDNN 9.2 or later";
  return {};
}

std::string CudnnAttention::backward_refusal(std::size_t version, int T) {
  if (version >= 91000 && version < 91002) return "cuDNN 9.10.0 and 9.10.1 have known faults in it";
  if (version <= 91500 && T % 128 != 0)
    return "cuDNN 9.15.0 and earlier need a sequence length that is a multiple of 128 for it";
  if (T == 1) return "a sequence of one position";
  return {};
}

float CudnnAttention::mask_value(std::size_t version) {
  return version < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

const char* cudnn_build_version() {
  static const std::string v = [] {
    const std::size_t n = cudnnGetVersion();
    return std::to_string(n / 10000) + "." + std::to_string((n / 100) % 100) + "." + std::to_string(n % 100);
  }();
  return v.c_str();
}

}  // namespace zinf::cuda
