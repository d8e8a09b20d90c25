// Test kernels that carry a state along their last core dim (scan={"t": ...}):
// each takes the state to start from and returns the state it ends in, so a
// call on [0, T) equals a call on [0, m) followed by one on [m, T) started
// from the first call's final state.
//
// Each takes any leading batch dims, checks its buffers' shapes and returns
// an FFI error, never aborts. Integer variants wrap around, so their results
// are exact whatever the split.
#include <cmath>
#include <cstdint>
#include <string>

#include "common/dims_string.h"
#include "testing/kernel_checks.h"
#include "testing/test_kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace batchpart::testing {
namespace {

// Signed overflow is undefined in C++; the integer kernels wrap around as
// jax's int32 arithmetic does, through the unsigned type.
template <typename T>
T Add(T a, T b) {
  return a + b;
}
template <>
int32_t Add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
template <typename T>
T Mul(T a, T b) {
  return a * b;
}
template <>
int32_t Mul(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}

// Whether `state` has the shape of `seq` less its last dim.
bool StateOf(ffi::Span<const int64_t> seq, ffi::Span<const int64_t> state) {
  if (seq.size() == 0 || state.size() + 1 != seq.size()) return false;
  for (size_t i = 0; i < state.size(); ++i) {
    if (seq[i] != state[i]) return false;
  }
  return true;
}

// ---- linear_scan: (t),(t),() -> (t),(),() -----------------------------------
// h[i] = a[i] * h[i-1] + x[i] from h[-1] = h0 (attr reverse != 0: from the
// end, h[i] = a[i] * h[i+1] + x[i]); returns y = h, the final state and the
// product of a (the part's decay), the summary a two-pass scan all-gathers.

template <typename T>
void LinearScan(const T* a, const T* x, const T* h0, T* y, T* hT, T* prod, int64_t batch,
                int64_t n, bool reverse) {
  for (int64_t e = 0; e < batch; ++e) {
    const T* ae = a + e * n;
    const T* xe = x + e * n;
    T* ye = y + e * n;
    T h = h0[e], p = T(1);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t i = reverse ? n - 1 - s : s;
      h = Add(Mul(ae[i], h), xe[i]);
      p = Mul(p, ae[i]);
      ye[i] = h;
    }
    hT[e] = h;
    prod[e] = p;
  }
}

ffi::Error LinearScanImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::AnyBuffer h0,
                          ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> hT,
                          ffi::Result<ffi::AnyBuffer> prod, int64_t reverse) {
  const auto ad = a.dimensions();
  if (!SameDims(ad, x.dimensions()) || !SameDims(ad, y->dimensions()) ||
      !StateOf(ad, h0.dimensions()) || !StateOf(ad, hT->dimensions()) ||
      !StateOf(ad, prod->dimensions())) {
    return KernelError("linear_scan", "a, x and y must be (...,t), h0, h_T and prod (...); got " +
                                          DimsToString(ad) + ", " +
                                          DimsToString(h0.dimensions()));
  }
  const auto type = a.element_type();
  if (x.element_type() != type || h0.element_type() != type || y->element_type() != type ||
      hT->element_type() != type || prod->element_type() != type) {
    return KernelError("linear_scan", "every buffer must have one dtype");
  }
  const int64_t n = ad[ad.size() - 1], batch = Product(ad, 0, ad.size() - 1);
  switch (type) {
    case ffi::F32:
      LinearScan(a.typed_data<float>(), x.typed_data<float>(), h0.typed_data<float>(),
                 y->typed_data<float>(), hT->typed_data<float>(), prod->typed_data<float>(),
                 batch, n, reverse != 0);
      break;
    case ffi::F64:
      LinearScan(a.typed_data<double>(), x.typed_data<double>(), h0.typed_data<double>(),
                 y->typed_data<double>(), hT->typed_data<double>(),
                 prod->typed_data<double>(), batch, n, reverse != 0);
      break;
    case ffi::S32:
      LinearScan(a.typed_data<int32_t>(), x.typed_data<int32_t>(), h0.typed_data<int32_t>(),
                 y->typed_data<int32_t>(), hT->typed_data<int32_t>(),
                 prod->typed_data<int32_t>(), batch, n, reverse != 0);
      break;
    default:
      return KernelError("linear_scan", "the dtype must be float32, float64 or int32");
  }
  return ffi::Error::Success();
}

// ---- prefix_sum: (t),() -> (t),() -------------------------------------------
// y[i] = s0 + x[0] + ... + x[i] (attr reverse != 0: s0 + x[i] + ... +
// x[t-1]); returns y and the final sum, the state.

template <typename T>
void PrefixSum(const T* x, const T* s0, T* y, T* total, int64_t batch, int64_t n,
               bool reverse) {
  for (int64_t e = 0; e < batch; ++e) {
    T s = s0[e];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = reverse ? n - 1 - k : k;
      s = Add(s, x[e * n + i]);
      y[e * n + i] = s;
    }
    total[e] = s;
  }
}

ffi::Error PrefixSumImpl(ffi::AnyBuffer x, ffi::AnyBuffer s0, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> total, int64_t reverse) {
  const auto xd = x.dimensions();
  if (!SameDims(xd, y->dimensions()) || !StateOf(xd, s0.dimensions()) ||
      !StateOf(xd, total->dimensions())) {
    return KernelError("prefix_sum", "x and y must be (...,t), s0 and the total (...); got " +
                                         DimsToString(xd) + ", " +
                                         DimsToString(s0.dimensions()));
  }
  const auto type = x.element_type();
  if (s0.element_type() != type || y->element_type() != type ||
      total->element_type() != type) {
    return KernelError("prefix_sum", "every buffer must have one dtype");
  }
  const int64_t n = xd[xd.size() - 1], batch = Product(xd, 0, xd.size() - 1);
  switch (type) {
    case ffi::F32:
      PrefixSum(x.typed_data<float>(), s0.typed_data<float>(), y->typed_data<float>(),
                total->typed_data<float>(), batch, n, reverse != 0);
      break;
    case ffi::F64:
      PrefixSum(x.typed_data<double>(), s0.typed_data<double>(), y->typed_data<double>(),
                total->typed_data<double>(), batch, n, reverse != 0);
      break;
    case ffi::S32:
      PrefixSum(x.typed_data<int32_t>(), s0.typed_data<int32_t>(), y->typed_data<int32_t>(),
                total->typed_data<int32_t>(), batch, n, reverse != 0);
      break;
    default:
      return KernelError("prefix_sum", "the dtype must be float32, float64 or int32");
  }
  return ffi::Error::Success();
}

// ---- tanh_rnn: (t),() -> (t),() ---------------------------------------------
// h[i] = tanh(w * h[i-1] + x[i]) (attr w: f64; reverse as above): a
// nonlinear recurrence, which only a sequential scan can split.

template <typename T>
void TanhRnn(const T* x, const T* h0, T* y, T* hT, int64_t batch, int64_t n, T w,
             bool reverse) {
  for (int64_t e = 0; e < batch; ++e) {
    T h = h0[e];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = reverse ? n - 1 - k : k;
      h = std::tanh(w * h + x[e * n + i]);
      y[e * n + i] = h;
    }
    hT[e] = h;
  }
}

ffi::Error TanhRnnImpl(ffi::AnyBuffer x, ffi::AnyBuffer h0, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> hT, double w, int64_t reverse) {
  const auto xd = x.dimensions();
  if (!SameDims(xd, y->dimensions()) || !StateOf(xd, h0.dimensions()) ||
      !StateOf(xd, hT->dimensions())) {
    return KernelError("tanh_rnn", "x and y must be (...,t), h0 and h_T (...); got " +
                                       DimsToString(xd) + ", " + DimsToString(h0.dimensions()));
  }
  const auto type = x.element_type();
  if (h0.element_type() != type || y->element_type() != type || hT->element_type() != type) {
    return KernelError("tanh_rnn", "every buffer must have one dtype");
  }
  const int64_t n = xd[xd.size() - 1], batch = Product(xd, 0, xd.size() - 1);
  switch (type) {
    case ffi::F32:
      TanhRnn(x.typed_data<float>(), h0.typed_data<float>(), y->typed_data<float>(),
              hT->typed_data<float>(), batch, n, static_cast<float>(w), reverse != 0);
      break;
    case ffi::F64:
      TanhRnn(x.typed_data<double>(), h0.typed_data<double>(), y->typed_data<double>(),
              hT->typed_data<double>(), batch, n, w, reverse != 0);
      break;
    default:
      return KernelError("tanh_rnn", "the dtype must be float32 or float64");
  }
  return ffi::Error::Success();
}

// ---- linear_attention: (t,d),(t,d),(t,e),(d,e) -> (t,e),(d,e) ----------------
// Causal linear attention per batch element (a head): S[i] = S[i-1] +
// k[i] v[i]^T from S[-1] = S0, o[i] = q[i]^T S[i] (attr reverse != 0: from
// the end); returns o and the final state. States compose by adding, so a
// two-pass scan's merge is the sum of the parts' final states.

template <typename T>
void LinearAttention(const T* q, const T* k, const T* v, const T* s0, T* o, T* sT,
                     int64_t batch, int64_t n, int64_t d, int64_t e, bool reverse) {
  for (int64_t b = 0; b < batch; ++b) {
    T* state = sT + b * d * e;
    const T* init = s0 + b * d * e;
    for (int64_t i = 0; i < d * e; ++i) state[i] = init[i];
    for (int64_t s = 0; s < n; ++s) {
      const int64_t i = reverse ? n - 1 - s : s;
      const T* qi = q + (b * n + i) * d;
      const T* ki = k + (b * n + i) * d;
      const T* vi = v + (b * n + i) * e;
      T* oi = o + (b * n + i) * e;
      for (int64_t c = 0; c < e; ++c) oi[c] = T(0);
      for (int64_t a = 0; a < d; ++a) {
        T* row = state + a * e;
        const T ka = ki[a], qa = qi[a];
        for (int64_t c = 0; c < e; ++c) {
          row[c] += ka * vi[c];
          oi[c] += qa * row[c];
        }
      }
    }
  }
}

// Whether `dims` is (..., rows, cols) over the leading dims `lead`.
bool Trailing2(ffi::Span<const int64_t> dims, ffi::Span<const int64_t> lead, int64_t rows,
               int64_t cols) {
  if (dims.size() != lead.size() + 2 || dims[lead.size()] != rows ||
      dims[lead.size() + 1] != cols) {
    return false;
  }
  for (size_t i = 0; i < lead.size(); ++i) {
    if (dims[i] != lead[i]) return false;
  }
  return true;
}

ffi::Error LinearAttentionImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                               ffi::AnyBuffer s0, ffi::Result<ffi::AnyBuffer> o,
                               ffi::Result<ffi::AnyBuffer> sT, int64_t reverse) {
  const auto qd = q.dimensions(), vd = v.dimensions();
  if (qd.size() < 2 || vd.size() != qd.size()) {
    return KernelError("linear_attention", "q, k must be (...,t,d) and v (...,t,e); got " +
                                               DimsToString(qd) + ", " + DimsToString(vd));
  }
  const auto lead = qd.first(qd.size() - 2);
  const int64_t n = qd[qd.size() - 2], d = qd[qd.size() - 1], e = vd[vd.size() - 1];
  if (!SameDims(qd, k.dimensions()) || !Trailing2(vd, lead, n, e) ||
      !Trailing2(o->dimensions(), lead, n, e) || !Trailing2(s0.dimensions(), lead, d, e) ||
      !Trailing2(sT->dimensions(), lead, d, e)) {
    return KernelError("linear_attention",
                       "q, k must be (...,t,d), v and o (...,t,e), S0 and S_T (...,d,e); got " +
                           DimsToString(qd) + ", " + DimsToString(vd) + ", " +
                           DimsToString(s0.dimensions()));
  }
  const auto type = q.element_type();
  if (k.element_type() != type || v.element_type() != type || s0.element_type() != type ||
      o->element_type() != type || sT->element_type() != type) {
    return KernelError("linear_attention", "every buffer must have one dtype");
  }
  const int64_t batch = Product(qd, 0, qd.size() - 2);
  switch (type) {
    case ffi::F32:
      LinearAttention(q.typed_data<float>(), k.typed_data<float>(), v.typed_data<float>(),
                      s0.typed_data<float>(), o->typed_data<float>(), sT->typed_data<float>(),
                      batch, n, d, e, reverse != 0);
      break;
    case ffi::F64:
      LinearAttention(q.typed_data<double>(), k.typed_data<double>(), v.typed_data<double>(),
                      s0.typed_data<double>(), o->typed_data<double>(),
                      sT->typed_data<double>(), batch, n, d, e, reverse != 0);
      break;
    default:
      return KernelError("linear_attention", "the dtype must be float32 or float64");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kLinearScan, LinearScanImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("reverse"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kPrefixSum, PrefixSumImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("reverse"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kTanhRnn, TanhRnnImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("w")
                                  .Attr<int64_t>("reverse"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kLinearAttention, LinearAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("reverse"));

HandlerTable ScanHandlers() {
  return {
      {"linear_scan", reinterpret_cast<void*>(kLinearScan)},
      {"prefix_sum", reinterpret_cast<void*>(kPrefixSum)},
      {"tanh_rnn", reinterpret_cast<void*>(kTanhRnn)},
      {"linear_attention", reinterpret_cast<void*>(kLinearAttention)},
  };
}

}  // namespace batchpart::testing
