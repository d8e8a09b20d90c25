// Small FFI kernels used by batchpart's own tests and demo.
//
// Each one checks its buffers' shapes and returns an FFI error (never
// aborts), and adds the number of batch elements it processed to a counter
// so that tests can prove no device redoes another's work.
#include "testing/test_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "common/batch_broadcast.h"
#include "common/dims_string.h"
#include "common/ffi_helpers.h"
#include "testing/kernel_checks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace batchpart::testing {
namespace {

std::atomic<int64_t> g_batch_elements{0};

// The dtypes a kernel takes: Run calls fn(TypeTag<T>{}) for the T of
// `dtype` and says whether it is one of them; kAccepted names them in errors.
template <ffi::DataType... Dtypes>
struct DtypeSet {
  template <typename Fn>
  static bool Run(ffi::DataType dtype, Fn&& fn) {
    return ((dtype == Dtypes && (fn(TypeTag<ffi::NativeType<Dtypes>>{}), true)) || ...);
  }
};
struct Floats : DtypeSet<ffi::F32, ffi::F64> {
  static constexpr const char* kAccepted = "float32 and float64 only";
};
struct Numbers : DtypeSet<ffi::F32, ffi::F64, ffi::S32, ffi::S64, ffi::C64, ffi::C128> {
  static constexpr const char* kAccepted = "f32, f64, s32, s64, c64, c128";
};

// Runs fn(TypeTag<T>{}) for the T of `dtype` in `Set` and counts `elements`
// batch elements processed; any other dtype is an error naming the kernel.
template <typename Set = Floats, typename Fn>
ffi::Error OnDtype(const char* kernel, ffi::DataType dtype, int64_t elements, Fn&& fn) {
  if (!Set::Run(dtype, fn)) {
    return KernelError(kernel, std::string("unsupported dtype (") + Set::kAccepted + ")");
  }
  g_batch_elements += elements;
  return ffi::Error::Success();
}

// Runs a kernel of two operands whose batch shapes broadcast to the result's
// `out_batch`: checks that they do and that the three buffers share one
// dtype, then OnDtype (counting `per_batch` elements per result batch
// element) with fn(tag, x_index, y_index, batch), the indexes mapping each
// result batch element to the operands'.
template <typename Set = Floats, typename Fn>
ffi::Error OnBroadcastPair(const char* kernel, Dims out_batch, Dims x_batch, Dims y_batch,
                           const ffi::AnyBuffer& x, const ffi::AnyBuffer& y,
                           const ffi::AnyBuffer& out, Fn&& fn, int64_t per_batch = 1) {
  if (!BatchBroadcast::Broadcasts(out_batch, x_batch) ||
      !BatchBroadcast::Broadcasts(out_batch, y_batch)) {
    return KernelError(kernel, "batch shapes do not broadcast to " + DimsToString(out_batch));
  }
  if (x.element_type() != y.element_type() || x.element_type() != out.element_type()) {
    return KernelError(kernel, "operands and result must share one dtype");
  }
  const BatchBroadcast x_index(out_batch, x_batch), y_index(out_batch, y_batch);
  const int64_t batch = Product(out_batch, 0, out_batch.size());
  return OnDtype<Set>(kernel, x.element_type(), batch * per_batch,
                      [&](auto tag) { fn(tag, x_index, y_index, batch); });
}

// ---- softmax: (n) -> (n), () ------------------------------------------------

template <typename T>
void Softmax(const T* x, T* y, T* lse, int64_t batch, int64_t n) {
  for (int64_t b = 0; b < batch; ++b) {
    const T* row = x + b * n;
    T* out = y + b * n;
    T max = n ? row[0] : T(0);
    for (int64_t j = 1; j < n; ++j) max = std::max(max, row[j]);
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (out[j] = std::exp(row[j] - max));
    for (int64_t j = 0; j < n; ++j) out[j] /= sum;
    lse[b] = max + std::log(sum);
  }
}

ffi::Error SoftmaxImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::AnyBuffer> lse) {
  const auto dims = x.dimensions();
  if (dims.size() == 0) return KernelError("softmax", "input must have rank >= 1");
  if (!SameDims(y->dimensions(), dims) ||
      !SameDims(lse->dimensions(), dims.first(dims.size() - 1))) {
    return KernelError("softmax", "result shapes do not match input " + DimsToString(dims));
  }
  if (y->element_type() != x.element_type() || lse->element_type() != x.element_type()) {
    return KernelError("softmax", "results must have the input's dtype");
  }
  const int64_t n = dims.back();
  const int64_t batch = Product(dims, 0, dims.size() - 1);
  return OnDtype("softmax", x.element_type(), batch, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Softmax(x.typed_data<T>(), y->typed_data<T>(), lse->typed_data<T>(), batch, n);
  });
}

// ---- matvec: (m,n),(n) -> (m), y = alpha * A x, broadcast batch -------------

template <typename T>
void Matvec(const T* a, const T* x, T* y, const BatchBroadcast& a_index,
            const BatchBroadcast& x_index, int64_t batch, int64_t m, int64_t n, double alpha) {
  for (int64_t b = 0; b < batch; ++b) {
    const T* ab = a + a_index(b) * m * n;
    const T* xb = x + x_index(b) * n;
    for (int64_t i = 0; i < m; ++i) {
      T acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += ab[i * n + j] * xb[j];
      y[b * m + i] = static_cast<T>(alpha) * acc;
    }
  }
}

ffi::Error MatvecImpl(ffi::AnyBuffer a, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                      double alpha) {
  const auto a_dims = a.dimensions(), x_dims = x.dimensions(), y_dims = y->dimensions();
  if (a_dims.size() < 2 || x_dims.size() == 0 || y_dims.size() == 0) {
    return KernelError("matvec", "operands need ranks >= 2 and >= 1");
  }
  const int64_t m = a_dims[a_dims.size() - 2], n = a_dims.back();
  if (x_dims.back() != n || y_dims.back() != m) {
    return KernelError("matvec", "core dims disagree: A " + DimsToString(a_dims) + ", x " +
                                    DimsToString(x_dims) + ", y " + DimsToString(y_dims));
  }
  return OnBroadcastPair(
      "matvec", y_dims.first(y_dims.size() - 1), a_dims.first(a_dims.size() - 2),
      x_dims.first(x_dims.size() - 1), a, x, *y,
      [&](auto tag, const BatchBroadcast& a_index, const BatchBroadcast& x_index, int64_t batch) {
        using T = typename decltype(tag)::type;
        Matvec(a.typed_data<T>(), x.typed_data<T>(), y->typed_data<T>(), a_index, x_index, batch,
               m, n, alpha);
      });
}

// ---- axpy: (n),(n) -> (n), out = alpha * x + y; out may alias y ------------

template <typename T>
void Axpy(const T* x, const T* y, T* out, int64_t size, double alpha) {
  for (int64_t i = 0; i < size; ++i) out[i] = static_cast<T>(alpha) * x[i] + y[i];
}

ffi::Error AxpyImpl(ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out,
                    double alpha) {
  const auto dims = x.dimensions();
  if (dims.size() == 0 || !SameDims(y.dimensions(), dims) || !SameDims(out->dimensions(), dims)) {
    return KernelError("axpy", "x, y and the result must share one shape of rank >= 1");
  }
  if (y.element_type() != x.element_type() || out->element_type() != x.element_type()) {
    return KernelError("axpy", "x, y and the result must share one dtype");
  }
  const int64_t size = Product(dims, 0, dims.size());
  return OnDtype("axpy", x.element_type(), Product(dims, 0, dims.size() - 1), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Axpy(x.typed_data<T>(), y.typed_data<T>(), out->typed_data<T>(), size, alpha);
  });
}

// ---- core_sum: (a..,...,t..),(c..,...,d..) -> (e..,...,f..) ------------------
// Batch dims anywhere: each operand and the result are [lead core dims,
// batch dims, trailing core dims], the counts given as attributes (the batch
// dims are what is left, broadcast NumPy-style). Every element of the result
// at batch element b holds the sum of both operands' core elements at b.

template <typename T>
void CoreSum(const T* x, const T* y, T* out, const BatchBroadcast& x_index,
             const BatchBroadcast& y_index, int64_t batch, int64_t x_lead, int64_t x_batch,
             int64_t x_trail, int64_t y_lead, int64_t y_batch, int64_t y_trail,
             int64_t out_lead, int64_t out_trail) {
  for (int64_t b = 0; b < batch; ++b) {
    double sum = 0;
    const int64_t xb = x_index(b), yb = y_index(b);
    for (int64_t l = 0; l < x_lead; ++l)
      for (int64_t t = 0; t < x_trail; ++t) sum += x[(l * x_batch + xb) * x_trail + t];
    for (int64_t l = 0; l < y_lead; ++l)
      for (int64_t t = 0; t < y_trail; ++t) sum += y[(l * y_batch + yb) * y_trail + t];
    for (int64_t l = 0; l < out_lead; ++l)
      for (int64_t t = 0; t < out_trail; ++t)
        out[(l * batch + b) * out_trail + t] = static_cast<T>(sum);
  }
}

ffi::Error CoreSumImpl(ffi::AnyBuffer x, ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out,
                       int64_t x_lead, int64_t x_trail, int64_t y_lead, int64_t y_trail,
                       int64_t out_lead, int64_t out_trail) {
  const auto x_dims = x.dimensions(), y_dims = y.dimensions(), o_dims = out->dimensions();
  auto fits = [](ffi::Span<const int64_t> dims, int64_t lead, int64_t trail) {
    return lead >= 0 && trail >= 0 && lead + trail <= static_cast<int64_t>(dims.size());
  };
  if (!fits(x_dims, x_lead, x_trail) || !fits(y_dims, y_lead, y_trail) ||
      !fits(o_dims, out_lead, out_trail)) {
    return KernelError("core_sum", "core dim counts exceed the ranks: x " +
                                      DimsToString(x_dims) + ", y " + DimsToString(y_dims) +
                                      ", out " + DimsToString(o_dims));
  }
  const auto o_batch = o_dims.first(o_dims.size() - out_trail).last(o_dims.size() - out_lead - out_trail);
  const auto x_batch = x_dims.first(x_dims.size() - x_trail).last(x_dims.size() - x_lead - x_trail);
  const auto y_batch = y_dims.first(y_dims.size() - y_trail).last(y_dims.size() - y_lead - y_trail);
  const int64_t xl = Product(x_dims, 0, x_lead), xb = Product(x_batch, 0, x_batch.size()),
                xt = Product(x_dims, x_dims.size() - x_trail, x_dims.size());
  const int64_t yl = Product(y_dims, 0, y_lead), yb = Product(y_batch, 0, y_batch.size()),
                yt = Product(y_dims, y_dims.size() - y_trail, y_dims.size());
  const int64_t ol = Product(o_dims, 0, out_lead),
                ot = Product(o_dims, o_dims.size() - out_trail, o_dims.size());
  return OnBroadcastPair(
      "core_sum", o_batch, x_batch, y_batch, x, y, *out,
      [&](auto tag, const BatchBroadcast& x_index, const BatchBroadcast& y_index, int64_t batch) {
        using T = typename decltype(tag)::type;
        CoreSum(x.typed_data<T>(), y.typed_data<T>(), out->typed_data<T>(), x_index, y_index,
                batch, xl, xb, xt, yl, yb, yt, ol, ot);
      });
}

// ---- reduce_rows: (n,k),(n) -> (k), a reduction over n --------------------
// out[b, j] = op over i of w[b, i] * x[b, i, j], op 0 sum, 1 max, 2 min: the
// result on any split of n combines by the same op, so n may be reduced
// (reduce={"n": ...}). Attribute `rows`: the n this call must see (-1: any),
// how a kernel that carries its size as an attribute fails if a per-shard
// attribute rule does not restate it. Counts batch x n rows processed.

template <typename T>
bool Greater(T a, T b) {
  if constexpr (std::is_arithmetic_v<T>) {
    return a > b;
  } else {
    return false;
  }
}

template <typename T>
void ReduceRows(const T* x, const T* w, T* out, const BatchBroadcast& x_index,
                const BatchBroadcast& w_index, int64_t batch, int64_t n, int64_t k, int op) {
  for (int64_t b = 0; b < batch; ++b) {
    const T* xb = x + x_index(b) * n * k;
    const T* wb = w + w_index(b) * n;
    for (int64_t j = 0; j < k; ++j) {
      T acc{};
      for (int64_t i = 0; i < n; ++i) {
        const T v = wb[i] * xb[i * k + j];
        if (i == 0 || op == 0) {
          acc = op == 0 ? T(acc + v) : v;
        } else if (op == 1 ? Greater(v, acc) : Greater(acc, v)) {
          acc = v;
        }
      }
      if constexpr (std::is_arithmetic_v<T>) {
        if (n == 0 && op != 0) {
          acc = op == 1 ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
        }
      }
      out[b * k + j] = acc;
    }
  }
}

ffi::Error ReduceRowsImpl(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                          int64_t op, int64_t rows) {
  const auto x_dims = x.dimensions(), w_dims = w.dimensions(), o_dims = out->dimensions();
  if (x_dims.size() < 2 || w_dims.size() < 1 || o_dims.size() < 1 ||
      w_dims.back() != x_dims[x_dims.size() - 2] || o_dims.back() != x_dims.back()) {
    return KernelError("reduce_rows", "shapes must be x (...,n,k), w (...,n), out (...,k); got " +
                                         DimsToString(x_dims) + ", " + DimsToString(w_dims) +
                                         ", " + DimsToString(o_dims));
  }
  if (op < 0 || op > 2) return KernelError("reduce_rows", "op must be 0 (sum), 1 (max) or 2 (min)");
  const int64_t n = x_dims[x_dims.size() - 2], k = x_dims.back();
  if (rows >= 0 && rows != n) {
    return KernelError("reduce_rows", "attribute rows=" + std::to_string(rows) +
                                         " but the call has " + std::to_string(n) + " rows");
  }
  const bool complex = x.element_type() == ffi::C64 || x.element_type() == ffi::C128;
  if (op != 0 && complex) return KernelError("reduce_rows", "complex inputs take op 0 (sum) only");
  return OnBroadcastPair<Numbers>(
      "reduce_rows", o_dims.first(o_dims.size() - 1), x_dims.first(x_dims.size() - 2),
      w_dims.first(w_dims.size() - 1), x, w, *out,
      [&](auto tag, const BatchBroadcast& x_index, const BatchBroadcast& w_index, int64_t batch) {
        using T = typename decltype(tag)::type;
        ReduceRows(x.typed_data<T>(), w.typed_data<T>(), out->typed_data<T>(), x_index, w_index,
                   batch, n, k, static_cast<int>(op));
      },
      n);
}

// ---- copy_bytes: (m,n) -> (m,n), copies memory as laid out -----------------
// With a column-major operand layout and a row-major result layout the
// result is the transpose: a test that layouts survive partitioning.

// Bytes a buffer occupies: XLA packs sub-byte types (int4: two per byte),
// while ffi::AnyBuffer::size_bytes() counts a whole byte per element.
size_t StorageBytes(const ffi::AnyBuffer& b) {
  size_t bits = 8 * ffi::ByteWidth(b.element_type());
  switch (b.element_type()) {
    case ffi::S1:
    case ffi::U1:
      bits = 1;
      break;
    case ffi::S2:
    case ffi::U2:
      bits = 2;
      break;
    case ffi::S4:
    case ffi::U4:
    case ffi::F4E2M1FN:
      bits = 4;
      break;
    default:
      break;
  }
  return (b.element_count() * bits + 7) / 8;
}

ffi::Error CopyBytesImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  const auto dims = x.dimensions();
  if (dims.size() < 2 || !SameDims(y->dimensions(), dims) ||
      x.element_type() != y->element_type()) {
    return KernelError("copy_bytes", "result must match the input's shape and dtype");
  }
  const size_t bytes = StorageBytes(x);
  if (bytes) std::memcpy(y->untyped_data(), x.untyped_data(), bytes);
  g_batch_elements += Product(dims, 0, dims.size() - 2);
  return ffi::Error::Success();
}

// ---- count: (n) -> nothing, a side effect only ------------------------------
// Adds its batch elements to the counter and their values to a running sum:
// a call with no results, which XLA keeps only for its side effect.

std::atomic<double> g_counted_sum{0.0};

ffi::Error CountImpl(ffi::AnyBuffer x) {
  const auto dims = x.dimensions();
  if (dims.size() == 0) return KernelError("count", "input must have rank >= 1");
  if (x.element_type() != ffi::DataType::F32) return KernelError("count", "input must be f32");
  const float* v = x.typed_data<float>();
  double sum = 0;
  for (int64_t i = 0; i < Product(dims, 0, dims.size()); ++i) sum += v[i];
  double old = g_counted_sum.load();
  while (!g_counted_sum.compare_exchange_weak(old, old + sum)) {
  }
  g_batch_elements += Product(dims, 0, dims.size() - 1);
  return ffi::Error::Success();
}

// ---- stateful: (n) -> (n), y = x + offset -----------------------------------
// A two-stage handler bundle: `instantiate` builds the state (the offset,
// from an attribute) once per executable, `execute` reads it. A call that runs
// without its instantiate stage fails with "State is not set".

ffi::ErrorOr<std::unique_ptr<StatefulOffset>> StatefulInstantiate(float offset) {
  return std::make_unique<StatefulOffset>(StatefulOffset{offset});
}

ffi::Error StatefulExecute(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                           StatefulOffset* state) {
  const auto dims = x.dimensions();
  if (dims.size() == 0 || x.element_type() != ffi::DataType::F32 ||
      !SameDims(y->dimensions(), dims) || y->element_type() != ffi::DataType::F32) {
    return KernelError("stateful", "(n) -> (n) on f32 arrays of rank >= 1");
  }
  const int64_t n = Product(dims, 0, dims.size());
  const float* in = x.typed_data<float>();
  float* out = y->typed_data<float>();
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] + state->offset;
  g_batch_elements += Product(dims, 0, dims.size() - 1);
  return ffi::Error::Success();
}

}  // namespace

ffi::TypeId StatefulOffset::id = {};
const XLA_FFI_TypeInfo StatefulOffset::info = ffi::MakeTypeInfo<StatefulOffset>();

XLA_FFI_DEFINE_HANDLER_SYMBOL(kCount, CountImpl, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(kStatefulInstantiate, StatefulInstantiate,
                              ffi::Ffi::BindInstantiate().Attr<float>("offset"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kStatefulExecute, StatefulExecute,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ctx<ffi::State<StatefulOffset>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    kSoftmax, SoftmaxImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    kMatvec, MatvecImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<double>(
        "alpha"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    kAxpy, AxpyImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<double>(
        "alpha"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kCopyBytes, CopyBytesImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(kCoreSum, CoreSumImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("x_lead")
                                  .Attr<int64_t>("x_trail")
                                  .Attr<int64_t>("y_lead")
                                  .Attr<int64_t>("y_trail")
                                  .Attr<int64_t>("out_lead")
                                  .Attr<int64_t>("out_trail"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(kReduceRows, ReduceRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("op")
                                  .Attr<int64_t>("rows"));

HandlerTable Handlers() {
  HandlerTable table = {
      {"softmax", reinterpret_cast<void*>(kSoftmax)},
      {"matvec", reinterpret_cast<void*>(kMatvec)},
      {"axpy", reinterpret_cast<void*>(kAxpy)},
      {"copy_bytes", reinterpret_cast<void*>(kCopyBytes)},
      {"core_sum", reinterpret_cast<void*>(kCoreSum)},
      {"reduce_rows", reinterpret_cast<void*>(kReduceRows)},
      {"count", reinterpret_cast<void*>(kCount)},
      {"stateful_instantiate", reinterpret_cast<void*>(kStatefulInstantiate)},
      {"stateful_execute", reinterpret_cast<void*>(kStatefulExecute)},
  };
  for (auto& entry : CombineHandlers()) table.push_back(entry);
  for (auto& entry : HaloHandlers()) table.push_back(entry);
  for (auto& entry : ScanHandlers()) table.push_back(entry);
  for (auto& entry : LayoutHandlers()) table.push_back(entry);
  return table;
}

int64_t BatchElementsProcessed() { return g_batch_elements.load(); }
void ResetBatchElementsProcessed() {
  g_batch_elements = 0;
  g_counted_sum = 0.0;
}
double CountedSum() { return g_counted_sum.load(); }

}  // namespace batchpart::testing
