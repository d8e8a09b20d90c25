// Test kernels whose results combine over a sharded dim by a named combiner
// (reduce={"n": "argmax" | "argmin" | "logsumexp"}).
//
// Both take equal batch dims on every operand and result (no broadcasting),
// check their buffers' shapes and return an FFI error, never abort.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "common/dims_string.h"
#include "testing/test_kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace batchpart::testing {
namespace {

ffi::Error KernelError(const char* kernel, const std::string& message) {
  return ffi::Error::InvalidArgument("batchpart_test_" + std::string(kernel) + ": " + message);
}

int64_t Product(ffi::Span<const int64_t> dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= dims[i];
  return n;
}

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
  };
}

}  // namespace batchpart::testing
