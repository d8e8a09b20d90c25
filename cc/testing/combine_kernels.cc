// Test kernels whose results combine over a sharded dim by a named combiner
// (reduce={"n": "argmax" | "argmin" | "max_k" | "min_k" | "logsumexp"}), and
// one whose results partly keep the reduced dim.
//
// Both take equal batch dims on every operand and result (no broadcasting),
// check their buffers' shapes and return an FFI error, never abort.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>
#include <limits>
#include <string>
#include <type_traits>

#include "common/dims_string.h"
#include "testing/kernel_checks.h"
#include "testing/test_kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace batchpart::testing {
namespace {

// ---- arg_rows: (n) -> (), () : NumPy's argmax / argmin and the value there --
// Attribute `op`: 0 argmax, 1 argmin. As NumPy: the first index among ties,
// and the first NaN wins over every number.

template <typename T>
bool IsNan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

template <typename T>
void ArgRows(const T* x, T* value, int32_t* index, int64_t batch, int64_t n, bool is_max) {
  for (int64_t b = 0; b < batch; ++b) {
    const T* row = x + b * n;
    int64_t best = 0;
    for (int64_t i = 1; i < n && !IsNan(row[best]); ++i) {
      if (IsNan(row[i]) || (is_max ? row[i] > row[best] : row[i] < row[best])) best = i;
    }
    value[b] = row[best];
    index[b] = static_cast<int32_t>(best);
  }
}

ffi::Error ArgRowsImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> value,
                       ffi::Result<ffi::Buffer<ffi::S32>> index, int64_t op) {
  const auto x_dims = x.dimensions(), v_dims = value->dimensions(), i_dims = index->dimensions();
  const size_t rank = v_dims.size();
  if (x_dims.size() != rank + 1 || i_dims.size() != rank || x_dims.back() < 1 ||
      Product(x_dims, 0, rank) != Product(v_dims, 0, rank) ||
      Product(i_dims, 0, rank) != Product(v_dims, 0, rank)) {
    return KernelError("arg_rows", "shapes must be x (...,n) with n >= 1, value (...), index "
                                   "(...); got " + DimsToString(x_dims) + ", " +
                                       DimsToString(v_dims) + ", " + DimsToString(i_dims));
  }
  if (op != 0 && op != 1) return KernelError("arg_rows", "op must be 0 (argmax) or 1 (argmin)");
  if (value->element_type() != x.element_type()) {
    return KernelError("arg_rows", "value must have x's dtype");
  }
  const int64_t batch = Product(v_dims, 0, rank), n = x_dims.back();
  int32_t* out_index = index->typed_data();
  switch (x.element_type()) {
    case ffi::F32:
      ArgRows(x.typed_data<float>(), value->typed_data<float>(), out_index, batch, n, op == 0);
      break;
    case ffi::F64:
      ArgRows(x.typed_data<double>(), value->typed_data<double>(), out_index, batch, n, op == 0);
      break;
    case ffi::S32:
      ArgRows(x.typed_data<int32_t>(), value->typed_data<int32_t>(), out_index, batch, n,
              op == 0);
      break;
    default:
      return KernelError("arg_rows", "x must be float32, float64 or int32");
  }
  return ffi::Error::Success();
}

// ---- top_k_rows: (n) -> (k), (k) : the k largest / smallest and their indices --
// Attribute `op`: 0 max_k (descending), 1 min_k (ascending). NaNs rank first
// (as they win NumPy's argmax and argmin), ties go to the lower index.

template <typename T>
void TopKRows(const T* x, T* values, int32_t* indices, int64_t batch, int64_t n, int64_t k,
              bool is_max) {
  std::vector<int64_t> order(n);
  for (int64_t b = 0; b < batch; ++b) {
    const T* row = x + b * n;
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
      if (IsNan(row[i]) || IsNan(row[j])) return IsNan(row[i]) && !IsNan(row[j]);
      return is_max ? row[i] > row[j] : row[i] < row[j];
    });
    for (int64_t t = 0; t < k; ++t) {
      values[b * k + t] = row[order[t]];
      indices[b * k + t] = static_cast<int32_t>(order[t]);
    }
  }
}

ffi::Error TopKRowsImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> values,
                        ffi::Result<ffi::Buffer<ffi::S32>> indices, int64_t op) {
  const auto x_dims = x.dimensions(), v_dims = values->dimensions(),
             i_dims = indices->dimensions();
  const size_t rank = x_dims.size();
  if (rank < 1 || v_dims.size() != rank || i_dims.size() != rank ||
      Product(x_dims, 0, rank - 1) != Product(v_dims, 0, rank - 1) ||
      Product(i_dims, 0, rank) != Product(v_dims, 0, rank) || v_dims.back() > x_dims.back()) {
    return KernelError("top_k_rows", "shapes must be x (...,n), values (...,k), indices "
                                     "(...,k) with k <= n; got " + DimsToString(x_dims) + ", " +
                                         DimsToString(v_dims) + ", " + DimsToString(i_dims));
  }
  if (op != 0 && op != 1) return KernelError("top_k_rows", "op must be 0 (max_k) or 1 (min_k)");
  if (values->element_type() != x.element_type()) {
    return KernelError("top_k_rows", "values must have x's dtype");
  }
  const int64_t batch = Product(x_dims, 0, rank - 1), n = x_dims.back(), k = v_dims.back();
  int32_t* out = indices->typed_data();
  switch (x.element_type()) {
    case ffi::F32:
      TopKRows(x.typed_data<float>(), values->typed_data<float>(), out, batch, n, k, op == 0);
      break;
    case ffi::F64:
      TopKRows(x.typed_data<double>(), values->typed_data<double>(), out, batch, n, k, op == 0);
      break;
    case ffi::S32:
      TopKRows(x.typed_data<int32_t>(), values->typed_data<int32_t>(), out, batch, n, k,
               op == 0);
      break;
    default:
      return KernelError("top_k_rows", "x must be float32, float64 or int32");
  }
  return ffi::Error::Success();
}

// ---- weigh_rows: (n,k),(n) -> (k),(n) : column sums and row sums, weighted --
// total[j] = sum_i w[i] x[i,j] (combines over n by a sum) and row[i] =
// w[i] sum_j x[i,j] (keeps n: each part writes its own rows). float32.

ffi::Error WeighRowsImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                         ffi::Result<ffi::Buffer<ffi::F32>> total,
                         ffi::Result<ffi::Buffer<ffi::F32>> row) {
  const auto xd = x.dimensions(), wd = w.dimensions(), td = total->dimensions(),
             rd = row->dimensions();
  const size_t r = xd.size();
  if (r < 2 || wd.size() != r - 1 || td.size() != r - 1 || rd.size() != r - 1 ||
      wd.back() != xd[r - 2] || td.back() != xd[r - 1] || rd.back() != xd[r - 2] ||
      Product(xd, 0, r - 2) != Product(wd, 0, r - 2) ||
      Product(xd, 0, r - 2) != Product(td, 0, r - 2) ||
      Product(xd, 0, r - 2) != Product(rd, 0, r - 2)) {
    return KernelError("weigh_rows", "shapes must be x (...,n,k), w (...,n), total (...,k), row "
                                     "(...,n); got " + DimsToString(xd) + ", " +
                                         DimsToString(wd) + ", " + DimsToString(td) + ", " +
                                         DimsToString(rd));
  }
  const int64_t batch = Product(xd, 0, r - 2), n = xd[r - 2], k = xd[r - 1];
  for (int64_t b = 0; b < batch; ++b) {
    const float* xb = x.typed_data() + b * n * k;
    const float* wb = w.typed_data() + b * n;
    float* tb = total->typed_data() + b * k;
    float* rb = row->typed_data() + b * n;
    std::fill(tb, tb + k, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      float s = 0;
      for (int64_t j = 0; j < k; ++j) {
        tb[j] += wb[i] * xb[i * k + j];
        s += xb[i * k + j];
      }
      rb[i] = wb[i] * s;
    }
  }
  return ffi::Error::Success();
}

// ---- attention: (q,d),(n,d),(n,e),(n) -> (q,e),(q) --------------------------
// o[i] = sum_j softmax_j(q[i] . k[j] + bias[j]) v[j] and lse[i] the softmax's
// log-normaliser. A bias of -inf masks a key; a query with every key masked
// gets lse = -inf and o = 0.

template <typename T>
void Attention(const T* q, const T* k, const T* v, const T* bias, T* o, T* lse, int64_t batch,
               int64_t nq, int64_t nk, int64_t d, int64_t e) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t b = 0; b < batch; ++b) {
    const T* qb = q + b * nq * d;
    const T* kb = k + b * nk * d;
    const T* vb = v + b * nk * e;
    const T* biasb = bias + b * nk;
    for (int64_t i = 0; i < nq; ++i) {
      T* oi = o + (b * nq + i) * e;
      T m = neg_inf;
      for (int64_t j = 0; j < nk; ++j) {
        T s = biasb[j];
        for (int64_t t = 0; t < d; ++t) s += qb[i * d + t] * kb[j * d + t];
        if (s > m) m = s;
      }
      for (int64_t c = 0; c < e; ++c) oi[c] = T(0);
      if (m == neg_inf) {
        lse[b * nq + i] = neg_inf;
        continue;
      }
      T z = 0;
      for (int64_t j = 0; j < nk; ++j) {
        T s = biasb[j];
        for (int64_t t = 0; t < d; ++t) s += qb[i * d + t] * kb[j * d + t];
        const T w = std::exp(s - m);
        z += w;
        for (int64_t c = 0; c < e; ++c) oi[c] += w * vb[j * e + c];
      }
      for (int64_t c = 0; c < e; ++c) oi[c] /= z;
      lse[b * nq + i] = m + std::log(z);
    }
  }
}

ffi::Error AttentionImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> o,
                         ffi::Result<ffi::AnyBuffer> lse) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(),
             bd = bias.dimensions(), od = o->dimensions(), ld = lse->dimensions();
  const size_t r = ld.size();  // batch rank + 1
  const bool ranks = r >= 1 && qd.size() == r + 1 && kd.size() == r + 1 && vd.size() == r + 1 &&
                     bd.size() == r && od.size() == r + 1;
  if (!ranks || Product(qd, 0, r - 1) != Product(ld, 0, r - 1) ||
      Product(kd, 0, r - 1) != Product(ld, 0, r - 1) ||
      Product(vd, 0, r - 1) != Product(ld, 0, r - 1) ||
      Product(bd, 0, r - 1) != Product(ld, 0, r - 1) || qd[r - 1] != ld[r - 1] ||
      od[r - 1] != ld[r - 1] || qd[r] != kd[r] || kd[r - 1] != vd[r - 1] ||
      bd[r - 1] != kd[r - 1] || od[r] != vd[r]) {
    return KernelError("attention", "shapes must be q (...,q,d), k (...,n,d), v (...,n,e), bias "
                                    "(...,n), o (...,q,e), lse (...,q); got " +
                                        DimsToString(qd) + ", " + DimsToString(kd) + ", " +
                                        DimsToString(vd) + ", " + DimsToString(bd) + ", " +
                                        DimsToString(od) + ", " + DimsToString(ld));
  }
  const auto dtype = q.element_type();
  for (auto t : {k.element_type(), v.element_type(), bias.element_type(), o->element_type(),
                 lse->element_type()}) {
    if (t != dtype) return KernelError("attention", "every array must have q's dtype");
  }
  const int64_t batch = Product(ld, 0, r - 1), nq = ld[r - 1], nk = kd[r - 1], d = qd[r],
                e = vd[r];
  if (dtype == ffi::F32) {
    Attention(q.typed_data<float>(), k.typed_data<float>(), v.typed_data<float>(),
              bias.typed_data<float>(), o->typed_data<float>(), lse->typed_data<float>(), batch,
              nq, nk, d, e);
  } else if (dtype == ffi::F64) {
    Attention(q.typed_data<double>(), k.typed_data<double>(), v.typed_data<double>(),
              bias.typed_data<double>(), o->typed_data<double>(), lse->typed_data<double>(),
              batch, nq, nk, d, e);
  } else {
    return KernelError("attention", "arrays must be float32 or float64");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kArgRows, ArgRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kTopKRows, TopKRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("op"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kWeighRows, WeighRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(kAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

HandlerTable CombineHandlers() {
  return {
      {"arg_rows", reinterpret_cast<void*>(kArgRows)},
      {"attention", reinterpret_cast<void*>(kAttention)},
      {"top_k_rows", reinterpret_cast<void*>(kTopKRows)},
      {"weigh_rows", reinterpret_cast<void*>(kWeighRows)},
  };
}

}  // namespace batchpart::testing
