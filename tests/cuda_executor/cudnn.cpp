// cudnn.cpp — cuDNN's graph backend API for the CPU executor (tests/cuda_executor): the entry points of
// NVIDIA's <cudnn_graph.h> that a fused-attention graph needs, with the header's own declarations,
// computed on the CPU over the executor's host-memory runtime (cudax/runtime.h). Written from cuDNN's
// documentation of the backend descriptors and of each operation's semantics, not from the code that
// calls it.
//
// What it implements
//   - Handles (cudnnCreate/Destroy/SetStream), cudnnGetVersion (CUDNN_VERSION of the headers it is
//     built with: it stands in for that library; the semantics follow the 9.0 API), cudnnGetErrorString.
//   - Descriptors: create, set attribute, get attribute, finalize, destroy, for TENSOR, MATMUL,
//     POINTWISE, REDUCTION, OPERATION_{MATMUL,POINTWISE,REDUCTION,RESHAPE}, OPERATIONGRAPH, ENGINEHEUR,
//     ENGINECFG, ENGINE, EXECUTION_PLAN and VARIANT_PACK; cudnnBackendExecute on the handle's stream. Any other
//     descriptor type, attribute or pointwise mode is refused: NOT_SUPPORTED, nothing changed.
//   - A finalized operation graph is copied whole into a program (its tensors and nodes by value), so a
//     plan outlives the descriptors it was built from, as cuDNN's plans do.
//
// Semantics (cuDNN's documentation; every tensor is N-D, dims and strides in elements):
//   tensor      element (i0..in) at Σ ik·stride_k of its memory: the variant pack's pointer (device
//               memory), an internal buffer for a virtual tensor, or one host value for a by-value
//               tensor (its pointer read when cudnnBackendExecute is called).
//   matmul      C[..., m, n] = Σ_k A[..., m, k]·B[..., k, n] over the last two dims; a batch dim of A or
//               B equal to C's is indexed as C's, 1 is broadcast, and one dividing C's (the grouped
//               heads of SDPA: K, V with h_k heads against Q's h_q) is indexed c / (C's / its). A and B
//               may differ in type (the backward's dQ = dS·K: dS fp32, K 16-bit); each is read as its
//               own type. Sums in double, one rounding to C's type.
//   pointwise   y = f(x[, b][, t]) elementwise over y's dims; an input dim of 1 is broadcast. Modes:
//               ADD, SUB, MUL, DIV, EXP, LOG, IDENTITY, CMP_GE (y = x ≥ b), CMP_GT (y = x > b),
//               CMP_LE (y = x ≤ b) (1 or 0), BINARY_SELECT (y = t ? x : b) and GEN_INDEX (y = the
//               element's index along CUDNN_ATTR_POINTWISE_AXIS). Math in float
//               (CUDNN_ATTR_POINTWISE_MATH_PREC must be FLOAT; BOOLEAN too for the comparisons, as
//               cudnn-frontend sets it for its masks: the same 1 or 0). Operands of different types
//               are each read as their own type (an INT32 index plus a by-value float, as the
//               frontend's sliding-window bound adds its window length to the column index).
//   reduction   y = ADD or MAX of x over the dims where y's extent is 1 and x's is not; a dim where y's
//               extent is neither 1 nor x's but divides it (x's = G × y's) is reduced in groups, ADD
//               only: y's element o along it sums x's o·G … o·G + G - 1. Consecutive groups: the
//               frontend's SDPA backward sums dK and dV from query heads to key/value heads this way
//               (its comment: reduce "b (hk g) skv d -> b hk skv d"; its tests expand K and V so query
//               head h reads key/value head h / G), the transpose of the matmul's grouping above.
//               x's elements are folded in ascending index order, as fp32 values summed in double,
//               one rounding to y's type.
//   reshape     y is a view of x: as many elements, every element offset of y (Σ index·stride under
//               y's dims and strides) an element offset of x (under x's own strides, also for a virtual
//               x), else BAD_PARAM at finalize; y's element at index j is x's element at that offset,
//               stored rounded to y's type (cudnn-frontend's SDPA backward reshapes the fp32 P and dS
//               to Q's 16-bit type as their transposes, and a stride-swapped Kᵀ into K). The frontend
//               documents reshape as a new logical shape and stride over the same data; cuDNN 9.0's
//               backend has no reshape mode attribute, so only these views are run. x and y may each
//               be virtual or not; a non-virtual y is written at its own offsets in its own memory.
//   Stores round to the tensor's type (fp16/bf16 to nearest even with NVIDIA's host conversions;
//   INT32 and BOOLEAN hold the value). A virtual tensor of a 16-bit type therefore holds the rounded
//   value, as the fused kernels' tensor-core operands do.
//   Nodes run in dependency order (the graph's op list may be in any order); a tensor written by two
//   nodes, or read before any node writes a virtual one, is refused at finalize (BAD_PARAM).
// Engines: the heuristic offers one engine configuration (global index 0) for every graph it can run,
// with no numerical notes (deterministic: fixed order everywhere). Its workspace — what the engine
// config's and the plan's WORKSPACE_SIZE report — is the fake's own choice, kWorkspacePerNode (256)
// bytes per operation of the graph (so a forward and a backward plan need different sizes), or
// ZINF_CUDNN_FAKE_WORKSPACE bytes; cudnnBackendExecute requires it (device memory, at least that
// size) and overwrites all of it.
//
// Test hooks (environment, read at each call):
//   ZINF_CUDNN_FAKE_REFUSE=d0,d1,...   finalizing an operation graph with a non-virtual tensor of these
//                                      dims answers CUDNN_STATUS_NOT_SUPPORTED_SHAPE (a shape cuDNN
//                                      refuses while a plan is built);
//   ZINF_CUDNN_FAKE_REFUSE_RESHAPE=1   finalizing an operation graph that holds a RESHAPE node answers
//                                      CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN (a graph form no engine
//                                      takes, such as a backward the GPU's cuDNN does not fuse);
//   ZINF_CUDNN_FAKE_FAIL_EXECUTE=1     cudnnBackendExecute answers CUDNN_STATUS_EXECUTION_FAILED.
//   ZINF_CUDNN_FAKE_VERSION=N          cudnnGetVersion answers N (e.g. 91500 for 9.15.0);
//   ZINF_CUDNN_FAKE_WORKSPACE=N        every plan built from then on needs N bytes of workspace.
// And one function for tests, declared in cudnn_fake.h: the by-value scalars of the last
// cudnnBackendExecute, in ascending uid order (what the caller passed, e.g. its mask value).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cudax/cudnn_fake.h"
#include "cudax/runtime.h"

struct cudnnContext {
  std::uint32_t magic;
  cudaStream_t stream;
};

namespace zinf::cudax::cudnn_fake {
namespace {

constexpr std::uint32_t kHandleMagic = 0xC0D11A7E, kDescMagic = 0xDE5C0D17;
constexpr std::int64_t kWorkspacePerNode = 256;

struct Tensor {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool has_type = false;
  std::vector<std::int64_t> dims, strides;
  std::int64_t uid = -1, align = 0;
  bool is_virtual = false, by_value = false;
};

enum class NodeKind { matmul, pointwise, reduction, reshape };
struct Node {
  NodeKind kind;
  cudnnPointwiseMode_t pw = CUDNN_POINTWISE_ADD;
  cudnnReduceTensorOp_t red = CUDNN_REDUCE_TENSOR_ADD;
  std::int64_t axis = -1;
  std::int64_t x = -1, b = -1, t = -1, y = -1;  // uids (matmul: x = A, b = B, y = C; reshape: x, y)
};

struct Program {
  std::map<std::int64_t, Tensor> tensors;
  std::vector<Node> nodes;  // in dependency order
};

struct Desc {
  std::uint32_t magic = kDescMagic;
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  // tensor
  Tensor tensor;
  // matmul / pointwise / reduction descriptors
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  bool has_comp = false;
  cudnnPointwiseMode_t pw_mode = CUDNN_POINTWISE_ADD;
  bool has_mode = false;
  std::int64_t axis = -1;
  cudnnReduceTensorOp_t red_op = CUDNN_REDUCE_TENSOR_ADD;
  // operations: copies of the descriptors they were given (by attribute)
  std::map<int, Desc> refs;
  // operation graph: its nodes' copies; the program once finalized
  std::vector<Desc> ops;
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<Program> program;
  // heuristics
  cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  bool has_heur_mode = false;
  // plan
  std::int64_t workspace = 0;
  // variant pack
  std::vector<std::int64_t> uids;
  std::vector<void*> ptrs;
  void* ws = nullptr;
};

Desc* as_desc(cudnnBackendDescriptor_t d) {
  auto* p = static_cast<Desc*>(d);
  return p && p->magic == kDescMagic ? p : nullptr;
}
bool valid(cudnnHandle_t h) { return h && h->magic == kHandleMagic; }

std::size_t type_bytes(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 0;
  }
}

// ---- attributes -------------------------------------------------------------------------------------

template <class T>
cudnnStatus_t one(cudnnBackendAttributeType_t got, cudnnBackendAttributeType_t want, std::int64_t n, const void* v,
                  T& out) {
  if (got != want || n != 1 || !v) return CUDNN_STATUS_BAD_PARAM;
  std::memcpy(&out, v, sizeof(T));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_ref(Desc& d, int name, cudnnBackendAttributeType_t t, std::int64_t n, const void* v,
                      cudnnBackendDescriptorType_t want) {
  if (t != CUDNN_TYPE_BACKEND_DESCRIPTOR || n != 1 || !v) return CUDNN_STATUS_BAD_PARAM;
  Desc* r = as_desc(*static_cast<const cudnnBackendDescriptor_t*>(v));
  if (!r || r->type != want || !r->finalized) return CUDNN_STATUS_BAD_PARAM;
  d.refs.erase(name);
  d.refs.emplace(name, *r);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t set_attr(Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t t, std::int64_t n,
                       const void* v) {
  if (d.finalized) return CUDNN_STATUS_BAD_PARAM;
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      Tensor& x = d.tensor;
      switch (name) {
        case CUDNN_ATTR_TENSOR_DATA_TYPE: x.has_type = true; return one(t, CUDNN_TYPE_DATA_TYPE, n, v, x.type);
        case CUDNN_ATTR_TENSOR_UNIQUE_ID: return one(t, CUDNN_TYPE_INT64, n, v, x.uid);
        case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: return one(t, CUDNN_TYPE_INT64, n, v, x.align);
        case CUDNN_ATTR_TENSOR_IS_VIRTUAL: return one(t, CUDNN_TYPE_BOOLEAN, n, v, x.is_virtual);
        case CUDNN_ATTR_TENSOR_IS_BY_VALUE: return one(t, CUDNN_TYPE_BOOLEAN, n, v, x.by_value);
        case CUDNN_ATTR_TENSOR_DIMENSIONS:
        case CUDNN_ATTR_TENSOR_STRIDES: {
          if (t != CUDNN_TYPE_INT64 || n < 1 || n > CUDNN_DIM_MAX || !v) return CUDNN_STATUS_BAD_PARAM;
          const auto* p = static_cast<const std::int64_t*>(v);
          (name == CUDNN_ATTR_TENSOR_DIMENSIONS ? x.dims : x.strides).assign(p, p + n);
          return CUDNN_STATUS_SUCCESS;
        }
        default: return CUDNN_STATUS_NOT_SUPPORTED;
      }
    }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      if (name != CUDNN_ATTR_MATMUL_COMP_TYPE) return CUDNN_STATUS_NOT_SUPPORTED;
      d.has_comp = true;
      return one(t, CUDNN_TYPE_DATA_TYPE, n, v, d.comp);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      if (name == CUDNN_ATTR_POINTWISE_MODE)
        return d.has_mode = true, one(t, CUDNN_TYPE_POINTWISE_MODE, n, v, d.pw_mode);
      if (name == CUDNN_ATTR_POINTWISE_MATH_PREC) return d.has_comp = true, one(t, CUDNN_TYPE_DATA_TYPE, n, v, d.comp);
      if (name == CUDNN_ATTR_POINTWISE_AXIS) return one(t, CUDNN_TYPE_INT64, n, v, d.axis);
      return CUDNN_STATUS_NOT_SUPPORTED;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      if (name == CUDNN_ATTR_REDUCTION_OPERATOR)
        return d.has_mode = true, one(t, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, n, v, d.red_op);
      if (name == CUDNN_ATTR_REDUCTION_COMP_TYPE) return d.has_comp = true, one(t, CUDNN_TYPE_DATA_TYPE, n, v, d.comp);
      return CUDNN_STATUS_NOT_SUPPORTED;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      switch (name) {
        case CUDNN_ATTR_OPERATION_MATMUL_ADESC:
        case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
        case CUDNN_ATTR_OPERATION_MATMUL_CDESC: return set_ref(d, name, t, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_MATMUL_DESC: return set_ref(d, name, t, n, v, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        default: return CUDNN_STATUS_NOT_SUPPORTED;
      }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      switch (name) {
        case CUDNN_ATTR_OPERATION_POINTWISE_XDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_YDESC:
        case CUDNN_ATTR_OPERATION_POINTWISE_TDESC: return set_ref(d, name, t, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
          return set_ref(d, name, t, n, v, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        default: return CUDNN_STATUS_NOT_SUPPORTED;
      }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
      switch (name) {
        case CUDNN_ATTR_OPERATION_REDUCTION_XDESC:
        case CUDNN_ATTR_OPERATION_REDUCTION_YDESC: return set_ref(d, name, t, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        case CUDNN_ATTR_OPERATION_REDUCTION_DESC: return set_ref(d, name, t, n, v, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        default: return CUDNN_STATUS_NOT_SUPPORTED;
      }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
      switch (name) {
        case CUDNN_ATTR_OPERATION_RESHAPE_XDESC:
        case CUDNN_ATTR_OPERATION_RESHAPE_YDESC: return set_ref(d, name, t, n, v, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        default: return CUDNN_STATUS_NOT_SUPPORTED;
      }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      if (name == CUDNN_ATTR_OPERATIONGRAPH_HANDLE) {
        cudnnHandle_t h = nullptr;
        if (const cudnnStatus_t st = one(t, CUDNN_TYPE_HANDLE, n, v, h); st != CUDNN_STATUS_SUCCESS) return st;
        if (!valid(h)) return CUDNN_STATUS_BAD_PARAM;
        d.handle = h;
        return CUDNN_STATUS_SUCCESS;
      }
      if (name == CUDNN_ATTR_OPERATIONGRAPH_OPS) {
        if (t != CUDNN_TYPE_BACKEND_DESCRIPTOR || n < 1 || !v) return CUDNN_STATUS_BAD_PARAM;
        d.ops.clear();
        for (std::int64_t i = 0; i < n; ++i) {
          Desc* o = as_desc(static_cast<const cudnnBackendDescriptor_t*>(v)[i]);
          if (!o || !o->finalized) return CUDNN_STATUS_BAD_PARAM;
          if (o->type != CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR &&
              o->type != CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR &&
              o->type != CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR &&
              o->type != CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)
            return CUDNN_STATUS_NOT_SUPPORTED;
          d.ops.push_back(*o);
        }
        return CUDNN_STATUS_SUCCESS;
      }
      return CUDNN_STATUS_NOT_SUPPORTED;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (name == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)
        return set_ref(d, name, t, n, v, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
      if (name == CUDNN_ATTR_ENGINEHEUR_MODE)
        return d.has_heur_mode = true, one(t, CUDNN_TYPE_HEUR_MODE, n, v, d.heur_mode);
      return CUDNN_STATUS_NOT_SUPPORTED;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (name == CUDNN_ATTR_EXECUTION_PLAN_HANDLE) {
        cudnnHandle_t h = nullptr;
        if (const cudnnStatus_t st = one(t, CUDNN_TYPE_HANDLE, n, v, h); st != CUDNN_STATUS_SUCCESS) return st;
        if (!valid(h)) return CUDNN_STATUS_BAD_PARAM;
        d.handle = h;
        return CUDNN_STATUS_SUCCESS;
      }
      if (name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)
        return set_ref(d, name, t, n, v, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      return CUDNN_STATUS_NOT_SUPPORTED;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS) {
        if (t != CUDNN_TYPE_INT64 || n < 1 || !v) return CUDNN_STATUS_BAD_PARAM;
        const auto* p = static_cast<const std::int64_t*>(v);
        d.uids.assign(p, p + n);
        return CUDNN_STATUS_SUCCESS;
      }
      if (name == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS) {
        if (t != CUDNN_TYPE_VOID_PTR || n < 1 || !v) return CUDNN_STATUS_BAD_PARAM;
        const auto* p = static_cast<void* const*>(v);
        d.ptrs.assign(p, p + n);
        return CUDNN_STATUS_SUCCESS;
      }
      if (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE) return one(t, CUDNN_TYPE_VOID_PTR, n, v, d.ws);
      return CUDNN_STATUS_NOT_SUPPORTED;
    default: return CUDNN_STATUS_NOT_SUPPORTED;
  }
}

// ---- finalize ---------------------------------------------------------------------------------------

// The workspace a plan of `prog` needs: the fake's choice (the file's header).
std::int64_t plan_workspace(const Program& prog) {
  if (const char* w = std::getenv("ZINF_CUDNN_FAKE_WORKSPACE"); w && *w) return std::atoll(w);
  return kWorkspacePerNode * static_cast<std::int64_t>(prog.nodes.size());
}

const Tensor* ref_tensor(const Desc& op, int name) {
  auto it = op.refs.find(name);
  return it == op.refs.end() ? nullptr : &it->second.tensor;
}

bool refused_dims(const Tensor& t) {
  const char* env = std::getenv("ZINF_CUDNN_FAKE_REFUSE");
  if (!env || !*env) return false;
  std::vector<std::int64_t> want;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) want.push_back(std::atoll(item.c_str()));
  return want == t.dims;
}

std::int64_t elements(const Tensor& t) {
  std::int64_t e = 1;
  for (std::int64_t d : t.dims) e *= d;
  return e;
}
std::int64_t extent(const Tensor& t) {  // elements spanned: 1 + Σ (dim-1)·stride
  std::int64_t e = 1;
  for (std::size_t i = 0; i < t.dims.size(); ++i) e += (t.dims[i] - 1) * t.strides[i];
  return e;
}
bool next(std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& dims) {
  for (std::size_t i = idx.size(); i-- > 0;) {
    if (++idx[i] < dims[i]) return true;
    idx[i] = 0;
  }
  return false;
}
std::int64_t dot(const std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& strides) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides[i];
  return off;
}

// A RESHAPE's output is a view of its input: as many elements, and every element offset of y (under
// y's strides) an element offset of x (under x's).
bool is_view(const Tensor& x, const Tensor& y) {
  if (elements(x) != elements(y)) return false;
  std::vector<bool> held(static_cast<std::size_t>(extent(x)), false);
  std::vector<std::int64_t> i(x.dims.size(), 0);
  do held[static_cast<std::size_t>(dot(i, x.strides))] = true;
  while (next(i, x.dims));
  std::vector<std::int64_t> j(y.dims.size(), 0);
  do {
    const std::int64_t off = dot(j, y.strides);
    if (off >= static_cast<std::int64_t>(held.size()) || !held[static_cast<std::size_t>(off)]) return false;
  } while (next(j, y.dims));
  return true;
}

// Shapes of a node's tensors against its semantics; the graph's program once every check passed.
cudnnStatus_t build_program(const Desc& g, Program& prog) {
  std::vector<Node> nodes;
  auto add_tensor = [&](const Tensor* t) -> cudnnStatus_t {
    if (!t) return CUDNN_STATUS_SUCCESS;
    auto [it, fresh] = prog.tensors.emplace(t->uid, *t);
    if (!fresh && (it->second.dims != t->dims || it->second.strides != t->strides || it->second.type != t->type ||
                   it->second.is_virtual != t->is_virtual))
      return CUDNN_STATUS_BAD_PARAM;  // one uid, two different tensors
    return CUDNN_STATUS_SUCCESS;
  };
  for (const Desc& op : g.ops) {
    Node n{};
    if (op.type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
      const Tensor *a = ref_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC),
                   *b = ref_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC),
                   *c = ref_tensor(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
      n.kind = NodeKind::matmul;
      n.x = a->uid, n.b = b->uid, n.y = c->uid;
      for (const Tensor* t : {a, b, c})
        if (const cudnnStatus_t st = add_tensor(t); st != CUDNN_STATUS_SUCCESS) return st;
    } else if (op.type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
      const Desc& pw = op.refs.at(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
      n.kind = NodeKind::pointwise;
      n.pw = pw.pw_mode, n.axis = pw.axis;
      const Tensor *x = ref_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC),
                   *b = ref_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC),
                   *t = ref_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC),
                   *y = ref_tensor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
      n.x = x->uid, n.y = y->uid, n.b = b ? b->uid : -1, n.t = t ? t->uid : -1;
      for (const Tensor* u : {x, b, t, y})
        if (const cudnnStatus_t st = add_tensor(u); st != CUDNN_STATUS_SUCCESS) return st;
    } else if (op.type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR) {
      const Tensor *x = ref_tensor(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC),
                   *y = ref_tensor(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
      n.kind = NodeKind::reshape;
      n.x = x->uid, n.y = y->uid;
      for (const Tensor* u : {x, y})
        if (const cudnnStatus_t st = add_tensor(u); st != CUDNN_STATUS_SUCCESS) return st;
    } else {
      const Desc& rd = op.refs.at(CUDNN_ATTR_OPERATION_REDUCTION_DESC);
      n.kind = NodeKind::reduction;
      n.red = rd.red_op;
      const Tensor *x = ref_tensor(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC),
                   *y = ref_tensor(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
      n.x = x->uid, n.y = y->uid;
      for (const Tensor* u : {x, y})
        if (const cudnnStatus_t st = add_tensor(u); st != CUDNN_STATUS_SUCCESS) return st;
    }
    nodes.push_back(n);
  }
  for (const auto& [uid, t] : prog.tensors)
    if (!t.is_virtual && refused_dims(t)) return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
  if (const char* r = std::getenv("ZINF_CUDNN_FAKE_REFUSE_RESHAPE"); r && std::string(r) == "1")
    for (const Node& n : nodes)
      if (n.kind == NodeKind::reshape) return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
  // Each tensor written once; nodes in dependency order.
  std::set<std::int64_t> written, ready;
  for (const Node& n : nodes)
    if (!written.insert(n.y).second) return CUDNN_STATUS_BAD_PARAM;
  for (const auto& [uid, t] : prog.tensors)
    if (!written.count(uid)) {
      if (t.is_virtual) return CUDNN_STATUS_BAD_PARAM;  // read, never produced
      ready.insert(uid);
    }
  std::vector<bool> done(nodes.size(), false);
  for (std::size_t round = 0; round < nodes.size(); ++round) {
    bool progress = false;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      if (done[i]) continue;
      bool inputs = ready.count(n.x) && (n.b < 0 || ready.count(n.b)) && (n.t < 0 || ready.count(n.t));
      if (!inputs) continue;
      prog.nodes.push_back(n);
      ready.insert(n.y);
      done[i] = progress = true;
    }
    if (!progress) break;
  }
  if (prog.nodes.size() != nodes.size()) return CUDNN_STATUS_BAD_PARAM;  // a cycle
  // Shape rules per node.
  for (const Node& n : prog.nodes) {
    const Tensor& y = prog.tensors.at(n.y);
    const Tensor& x = prog.tensors.at(n.x);
    const std::size_t r = y.dims.size();
    if (n.kind == NodeKind::matmul) {
      const Tensor& b = prog.tensors.at(n.b);
      if (x.dims.size() != r || b.dims.size() != r || r < 2) return CUDNN_STATUS_BAD_PARAM;
      if (x.dims[r - 2] != y.dims[r - 2] || b.dims[r - 1] != y.dims[r - 1] || x.dims[r - 1] != b.dims[r - 2])
        return CUDNN_STATUS_BAD_PARAM;
      for (std::size_t i = 0; i + 2 < r; ++i)
        for (const Tensor* o : {&x, &b})
          if (o->dims[i] < 1 || y.dims[i] % o->dims[i] != 0) return CUDNN_STATUS_BAD_PARAM;
    } else if (n.kind == NodeKind::pointwise) {
      switch (n.pw) {
        case CUDNN_POINTWISE_ADD:
        case CUDNN_POINTWISE_SUB:
        case CUDNN_POINTWISE_MUL:
        case CUDNN_POINTWISE_DIV:
        case CUDNN_POINTWISE_CMP_GE:
        case CUDNN_POINTWISE_CMP_GT:
        case CUDNN_POINTWISE_CMP_LE:
          if (n.b < 0) return CUDNN_STATUS_BAD_PARAM;
          break;
        case CUDNN_POINTWISE_BINARY_SELECT:
          if (n.b < 0 || n.t < 0) return CUDNN_STATUS_BAD_PARAM;
          break;
        case CUDNN_POINTWISE_EXP:
        case CUDNN_POINTWISE_LOG:
        case CUDNN_POINTWISE_IDENTITY: break;
        case CUDNN_POINTWISE_GEN_INDEX:
          if (n.axis < 0 || n.axis >= static_cast<std::int64_t>(r) || x.dims != y.dims) return CUDNN_STATUS_BAD_PARAM;
          break;
        default: return CUDNN_STATUS_NOT_SUPPORTED;
      }
      for (std::int64_t u : {n.x, n.b, n.t}) {
        if (u < 0) continue;
        const Tensor& in = prog.tensors.at(u);
        if (in.dims.size() != r) return CUDNN_STATUS_BAD_PARAM;
        for (std::size_t i = 0; i < r; ++i)
          if (in.dims[i] != y.dims[i] && in.dims[i] != 1) return CUDNN_STATUS_BAD_PARAM;
      }
    } else if (n.kind == NodeKind::reshape) {
      if (!is_view(x, y)) return CUDNN_STATUS_BAD_PARAM;
    } else {
      if (n.red != CUDNN_REDUCE_TENSOR_ADD && n.red != CUDNN_REDUCE_TENSOR_MAX) return CUDNN_STATUS_NOT_SUPPORTED;
      if (x.dims.size() != r) return CUDNN_STATUS_BAD_PARAM;
      for (std::size_t i = 0; i < r; ++i) {
        if (y.dims[i] == x.dims[i] || y.dims[i] == 1) continue;
        if (x.dims[i] % y.dims[i] != 0) return CUDNN_STATUS_BAD_PARAM;
        if (n.red != CUDNN_REDUCE_TENSOR_ADD) return CUDNN_STATUS_NOT_SUPPORTED;  // grouped: ADD only
      }
    }
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize(Desc& d) {
  if (d.finalized) return CUDNN_STATUS_BAD_PARAM;
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      const Tensor& t = d.tensor;
      if (!t.has_type || t.uid < 0 || t.dims.empty() || t.dims.size() != t.strides.size() || t.align < 1)
        return CUDNN_STATUS_BAD_PARAM;
      if (type_bytes(t.type) == 0) return CUDNN_STATUS_NOT_SUPPORTED;
      for (std::size_t i = 0; i < t.dims.size(); ++i)
        if (t.dims[i] < 1 || t.strides[i] < 0) return CUDNN_STATUS_BAD_PARAM;
      if (t.is_virtual && t.by_value) return CUDNN_STATUS_BAD_PARAM;
      break;
    }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      if (!d.has_comp) return CUDNN_STATUS_BAD_PARAM;
      if (d.comp != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
      if (d.type == CUDNN_BACKEND_REDUCTION_DESCRIPTOR && !d.has_mode) return CUDNN_STATUS_BAD_PARAM;
      break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
      if (!d.has_mode) return CUDNN_STATUS_BAD_PARAM;
      const bool comparison = d.pw_mode == CUDNN_POINTWISE_CMP_GE || d.pw_mode == CUDNN_POINTWISE_CMP_GT ||
                              d.pw_mode == CUDNN_POINTWISE_CMP_LE;
      if (d.has_comp && d.comp != CUDNN_DATA_FLOAT && !(comparison && d.comp == CUDNN_DATA_BOOLEAN))
        return CUDNN_STATUS_NOT_SUPPORTED;
      break;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      for (int a : {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                    CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC})
        if (!d.refs.count(a)) return CUDNN_STATUS_BAD_PARAM;
      break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
      for (int a : {CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                    CUDNN_ATTR_OPERATION_POINTWISE_YDESC})
        if (!d.refs.count(a)) return CUDNN_STATUS_BAD_PARAM;
      break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
      for (int a : {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                    CUDNN_ATTR_OPERATION_REDUCTION_DESC})
        if (!d.refs.count(a)) return CUDNN_STATUS_BAD_PARAM;
      break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
      for (int a : {CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_ATTR_OPERATION_RESHAPE_YDESC})
        if (!d.refs.count(a)) return CUDNN_STATUS_BAD_PARAM;
      break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      if (!d.handle || d.ops.empty()) return CUDNN_STATUS_BAD_PARAM;
      auto prog = std::make_shared<Program>();
      if (const cudnnStatus_t st = build_program(d, *prog); st != CUDNN_STATUS_SUCCESS) return st;
      d.program = prog;
      break;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (!d.refs.count(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) || !d.has_heur_mode) return CUDNN_STATUS_BAD_PARAM;
      d.program = d.refs.at(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH).program;
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (!d.handle || !d.refs.count(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG)) return CUDNN_STATUS_BAD_PARAM;
      d.program = d.refs.at(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG).program;
      if (!d.program) return CUDNN_STATUS_BAD_PARAM;
      d.workspace = plan_workspace(*d.program);
      break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (d.uids.empty() || d.uids.size() != d.ptrs.size()) return CUDNN_STATUS_BAD_PARAM;
      break;
    default: return CUDNN_STATUS_NOT_SUPPORTED;  // engines and engine configs come from the heuristic
  }
  d.finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

// ---- execution --------------------------------------------------------------------------------------

struct Bound {  // a tensor with its memory for one execution
  const Tensor* t;
  char* mem;               // device memory, or the internal buffer
  std::vector<float> own;  // virtual tensors
  float value = 0;         // by-value
};

float load(const Bound& b, std::int64_t off) {
  if (b.t->by_value) return b.value;
  if (b.t->is_virtual) return b.own[static_cast<std::size_t>(off)];
  const char* p = b.mem + off * static_cast<std::int64_t>(type_bytes(b.t->type));
  switch (b.t->type) {
    case CUDNN_DATA_FLOAT: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case CUDNN_DATA_HALF: {
      __half h;
      std::memcpy(&h, p, 2);
      return __half2float(h);
    }
    case CUDNN_DATA_BFLOAT16: {
      __nv_bfloat16 h;
      std::memcpy(&h, p, 2);
      return __bfloat162float(h);
    }
    case CUDNN_DATA_INT32: {
      std::int32_t i;
      std::memcpy(&i, p, 4);
      return static_cast<float>(i);
    }
    case CUDNN_DATA_BOOLEAN: return *p ? 1.0f : 0.0f;
    default: return 0;
  }
}
float rounded(cudnnDataType_t t, double v) {
  switch (t) {
    case CUDNN_DATA_HALF: return __half2float(__double2half(v));
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(__double2bfloat16(v));
    case CUDNN_DATA_INT32: return static_cast<float>(static_cast<std::int32_t>(v));
    case CUDNN_DATA_BOOLEAN: return v != 0 ? 1.0f : 0.0f;
    default: return static_cast<float>(v);
  }
}
void store(Bound& b, std::int64_t off, double v) {
  const float r = rounded(b.t->type, v);
  if (b.t->is_virtual) {
    b.own[static_cast<std::size_t>(off)] = r;
    return;
  }
  char* p = b.mem + off * static_cast<std::int64_t>(type_bytes(b.t->type));
  switch (b.t->type) {
    case CUDNN_DATA_FLOAT: std::memcpy(p, &r, 4); break;
    case CUDNN_DATA_HALF: {
      const __half h = __float2half_rn(r);
      std::memcpy(p, &h, 2);
      break;
    }
    case CUDNN_DATA_BFLOAT16: {
      const __nv_bfloat16 h = __float2bfloat16_rn(r);
      std::memcpy(p, &h, 2);
      break;
    }
    case CUDNN_DATA_INT32: {
      const std::int32_t i = static_cast<std::int32_t>(r);
      std::memcpy(p, &i, 4);
      break;
    }
    case CUDNN_DATA_BOOLEAN: *p = r != 0; break;
    default: break;
  }
}

// The offset in `t` of output index `idx` (y's dims), an input dim of 1 broadcast and a dividing one
// grouped.
std::int64_t offset_of(const Tensor& t, const std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& ydims) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const std::int64_t d = t.dims[i];
    const std::int64_t j = d == ydims[i] ? idx[i] : d == 1 ? 0 : idx[i] / (ydims[i] / d);
    off += j * t.strides[i];
  }
  return off;
}
void run_node(const Node& n, std::map<std::int64_t, Bound>& m) {
  Bound& y = m.at(n.y);
  const Bound& x = m.at(n.x);
  const std::vector<std::int64_t>& yd = y.t->dims;
  const std::size_t r = yd.size();
  std::vector<std::int64_t> idx(r, 0);
  if (n.kind == NodeKind::matmul) {
    const Bound& b = m.at(n.b);
    const std::int64_t K = x.t->dims[r - 1];
    // A's and B's index spaces: C's with the contracted dim in place of N (A) or M (B).
    std::vector<std::int64_t> ad = yd, bd = yd, ia(r), ib(r);
    ad[r - 1] = K, bd[r - 2] = K;
    const std::int64_t a_step = x.t->strides[r - 1], b_step = b.t->strides[r - 2];
    do {
      ia = idx, ib = idx;
      ia[r - 1] = 0, ib[r - 2] = 0;
      const std::int64_t a0 = offset_of(*x.t, ia, ad), b0 = offset_of(*b.t, ib, bd);
      double acc = 0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += static_cast<double>(load(x, a0 + k * a_step)) * load(b, b0 + k * b_step);
      store(y, offset_of(*y.t, idx, yd), acc);
    } while (next(idx, yd));
    return;
  }
  if (n.kind == NodeKind::reshape) {
    // y's element at index j is x's element stored at y's offset of j (finalize checked that it is one
    // of x's offsets), rounded to y's type.
    do {
      const std::int64_t off = dot(idx, y.t->strides);
      store(y, off, load(x, off));
    } while (next(idx, yd));
    return;
  }
  if (n.kind == NodeKind::reduction) {
    // Every output element starts at the operation's identity; x's elements are then folded in order.
    std::vector<double> acc(static_cast<std::size_t>(extent(*y.t)), n.red == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
    const std::vector<std::int64_t>& xd = x.t->dims;
    std::vector<std::int64_t> ix(xd.size(), 0);
    do {
      // y's index: x's where the extents are equal, 0 where y's is 1, and x's over the group size where
      // y's divides x's (consecutive groups: y's element o sums x's o·G … o·G + G - 1).
      std::vector<std::int64_t> iy = ix;
      for (std::size_t i = 0; i < r; ++i)
        if (yd[i] == 1)
          iy[i] = 0;
        else if (yd[i] != xd[i])
          iy[i] = ix[i] / (xd[i] / yd[i]);
      const std::int64_t o = offset_of(*y.t, iy, yd);
      const double v = load(x, offset_of(*x.t, ix, xd));
      double& a = acc[static_cast<std::size_t>(o)];
      a = n.red == CUDNN_REDUCE_TENSOR_MAX ? std::max(a, v) : a + static_cast<double>(static_cast<float>(v));
    } while (next(ix, xd));
    do store(y, offset_of(*y.t, idx, yd), acc[static_cast<std::size_t>(offset_of(*y.t, idx, yd))]);
    while (next(idx, yd));
    return;
  }
  const Bound* b = n.b >= 0 ? &m.at(n.b) : nullptr;
  const Bound* t = n.t >= 0 ? &m.at(n.t) : nullptr;
  do {
    const float xv = load(x, offset_of(*x.t, idx, yd));
    const float bv = b ? load(*b, offset_of(*b->t, idx, yd)) : 0.0f;
    float v = 0;
    switch (n.pw) {
      case CUDNN_POINTWISE_ADD: v = xv + bv; break;
      case CUDNN_POINTWISE_SUB: v = xv - bv; break;
      case CUDNN_POINTWISE_MUL: v = xv * bv; break;
      case CUDNN_POINTWISE_DIV: v = xv / bv; break;
      case CUDNN_POINTWISE_EXP: v = std::exp(xv); break;
      case CUDNN_POINTWISE_LOG: v = std::log(xv); break;
      case CUDNN_POINTWISE_IDENTITY: v = xv; break;
      case CUDNN_POINTWISE_CMP_GE: v = xv >= bv ? 1.0f : 0.0f; break;
      case CUDNN_POINTWISE_CMP_GT: v = xv > bv ? 1.0f : 0.0f; break;
      case CUDNN_POINTWISE_CMP_LE: v = xv <= bv ? 1.0f : 0.0f; break;
      case CUDNN_POINTWISE_BINARY_SELECT: v = load(*t, offset_of(*t->t, idx, yd)) != 0 ? xv : bv; break;
      case CUDNN_POINTWISE_GEN_INDEX: v = static_cast<float>(idx[static_cast<std::size_t>(n.axis)]); break;
      default: break;
    }
    store(y, offset_of(*y.t, idx, yd), v);
  } while (next(idx, yd));
}

// The last call's by-value scalars (cudnn_fake.h), by uid.
std::mutex last_scalars_mu;
std::vector<float> last_scalars;

cudnnStatus_t execute(cudnnHandle_t h, const Desc& plan, const Desc& pack) {
  if (const char* f = std::getenv("ZINF_CUDNN_FAKE_FAIL_EXECUTE"); f && std::string(f) == "1")
    return CUDNN_STATUS_EXECUTION_FAILED;
  std::vector<float> scalars;
  auto prog = plan.program;
  auto bound = std::make_shared<std::map<std::int64_t, Bound>>();
  for (const auto& [uid, t] : prog->tensors) {
    Bound b{&t, nullptr, {}, 0};
    if (t.is_virtual) {
      b.own.assign(static_cast<std::size_t>(extent(t)), 0.0f);
    } else {
      auto it = std::find(pack.uids.begin(), pack.uids.end(), uid);
      if (it == pack.uids.end()) return CUDNN_STATUS_BAD_PARAM;  // a graph tensor without memory
      void* p = pack.ptrs[static_cast<std::size_t>(it - pack.uids.begin())];
      if (!p) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
      if (t.by_value) {
        if (t.type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
        std::memcpy(&b.value, p, sizeof(float));  // read at the call: the caller's value may go
        scalars.push_back(b.value);  // prog->tensors is a map: ascending uids
      } else {
        const std::size_t bytes = static_cast<std::size_t>(extent(t)) * type_bytes(t.type);
        if (!is_device_range(p, bytes)) return CUDNN_STATUS_BAD_PARAM;
        if (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(t.align) != 0)
          return CUDNN_STATUS_BAD_PARAM;  // less aligned than the tensor promised
        b.mem = static_cast<char*>(p);
      }
    }
    bound->emplace(uid, std::move(b));
  }
  if (plan.workspace > 0 && (!pack.ws || !is_device_range(pack.ws, static_cast<std::size_t>(plan.workspace))))
    return CUDNN_STATUS_BAD_PARAM;
  {
    std::lock_guard<std::mutex> lk(last_scalars_mu);
    last_scalars = scalars;
  }
  void* ws = pack.ws;
  const std::int64_t ws_bytes = plan.workspace;
  const cudaError_t e = enqueue(h->stream, [prog, bound, ws, ws_bytes] {
    if (ws_bytes > 0) std::memset(ws, 0xA5, static_cast<std::size_t>(ws_bytes));  // the library's to overwrite
    for (const Node& n : prog->nodes) run_node(n, *bound);
    return cudaSuccess;
  });
  return e == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

}  // namespace
}  // namespace zinf::cudax::cudnn_fake

std::vector<float> zinf::cudax::cudnn_fake_last_scalars() {
  std::lock_guard<std::mutex> lk(cudnn_fake::last_scalars_mu);
  return cudnn_fake::last_scalars;
}

namespace fake = zinf::cudax::cudnn_fake;

extern "C" {

size_t cudnnGetVersion(void) {
  if (const char* v = std::getenv("ZINF_CUDNN_FAKE_VERSION"); v && *v) return static_cast<size_t>(std::atoll(v));
  return CUDNN_VERSION;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS (unknown to the executor's fake)";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *handle = new cudnnContext{fake::kHandleMagic, nullptr};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!fake::valid(handle)) return CUDNN_STATUS_BAD_PARAM;
  handle->magic = 0;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!fake::valid(handle)) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* desc) {
  if (!desc) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: break;
    default: return CUDNN_STATUS_NOT_SUPPORTED;
  }
  auto* d = new fake::Desc();
  d->type = type;
  *desc = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t desc) {
  fake::Desc* d = fake::as_desc(desc);
  if (!d) return CUDNN_STATUS_BAD_PARAM;
  d->magic = 0;
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t) { return CUDNN_STATUS_NOT_SUPPORTED; }

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
  fake::Desc* d = fake::as_desc(desc);
  if (!d) return CUDNN_STATUS_BAD_PARAM;
  return fake::finalize(*d);
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void* array) {
  fake::Desc* d = fake::as_desc(desc);
  if (!d) return CUDNN_STATUS_BAD_PARAM;
  return fake::set_attr(*d, name, type, count, array);
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                                       void* array) {
  fake::Desc* d = fake::as_desc(desc);
  if (!d || !count) return CUDNN_STATUS_BAD_PARAM;
  if (!d->finalized) return CUDNN_STATUS_BAD_PARAM;  // attributes are read from finalized descriptors
  switch (name) {
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {  // fills the caller's engine-config descriptors
      if (d->type != CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR || type != CUDNN_TYPE_BACKEND_DESCRIPTOR)
        return CUDNN_STATUS_BAD_PARAM;
      *count = 1;
      if (requested < 1) return CUDNN_STATUS_SUCCESS;
      fake::Desc* cfg = fake::as_desc(static_cast<cudnnBackendDescriptor_t*>(array)[0]);
      if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
      cfg->program = d->program;
      cfg->workspace = fake::plan_workspace(*d->program);
      cfg->finalized = true;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINECFG_ENGINE: {
      if (d->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || type != CUDNN_TYPE_BACKEND_DESCRIPTOR || requested < 1)
        return CUDNN_STATUS_BAD_PARAM;
      fake::Desc* e = fake::as_desc(static_cast<cudnnBackendDescriptor_t*>(array)[0]);
      if (!e || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
      e->program = d->program;
      e->finalized = true;
      *count = 1;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE:
      if (d->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
      *count = 0;  // deterministic, no tensor cores, nothing compiled at run time
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
      if (d->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR || type != CUDNN_TYPE_INT64 || requested < 1)
        return CUDNN_STATUS_BAD_PARAM;
      *count = 1;
      *static_cast<int64_t*>(array) = 0;
      return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
      if ((d->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && d->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) ||
          type != CUDNN_TYPE_INT64 || requested < 1)
        return CUDNN_STATUS_BAD_PARAM;
      *count = 1;
      *static_cast<int64_t*>(array) = d->workspace;
      return CUDNN_STATUS_SUCCESS;
    default: return CUDNN_STATUS_NOT_SUPPORTED;
  }
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  if (!fake::valid(handle)) return CUDNN_STATUS_BAD_PARAM;
  fake::Desc *p = fake::as_desc(plan), *v = fake::as_desc(pack);
  if (!p || !v || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR ||
      v->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !p->finalized || !v->finalized)
    return CUDNN_STATUS_BAD_PARAM;
  return fake::execute(handle, *p, *v);
}

}  // extern "C"
