// One kernel for every kind of dim, in any layout: `batchpart_test_layout`.
//
// Each operand and result names the role of each of its dims in the string
// attribute `roles` (one group per array, operands first, separated by ';'):
// '0'..'3' batch dims (equal sizes in every array), 'n' and 'm' the dims the
// call combines over or is local along, 'j' a core dim every array keeps
// whole, 'k' a top-k's candidates, 'e' an attention value's width. The
// kernel reads every array through those roles, never by position, so a
// test can declare any signature (batch dims before, between or after the
// core dims, results in any order) and compare the call sharded and whole.
//
// Attribute `op` (LayoutOp) picks what the results are, over x (operand 0;
// for logsumexp, scores s and values v). Results without 'n' combine:
//   sum, max, min:  r[b,j] = op over n, m of x[b,n,m,j]
//   argmax, argmin: value[b,j], index[b,j] (int32; NumPy's: first extreme)
//   max_k, min_k:   values[b,k,j], indices[b,k,j] (a stable sort, k first)
//   logsumexp:      average[b,j,e], lse[b,j] of softmax over n, m of s
//   sum_max:        sum[b,j], max[b,j] (for a bp.Combiner of two results)
//   halo:           y[b,n,m,j] = sum of x over [n-lo, n+hi] x [m-lo, m+hi],
//                   indices clamped to the array (the kernel's boundary rule)
// A result with 'n' (other than the halo's) keeps the reduced dims: 2 x.
// Values are f32, indices int32; FFI errors for anything else.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "common/dims_string.h"
#include "testing/kernel_checks.h"
#include "testing/test_kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace batchpart::testing {
namespace {

enum LayoutOp : int64_t {
  kSum, kMax, kMin, kArgmax, kArgmin, kMaxK, kMinK, kLogsumexp, kSumMax, kHalo,
};

// Role slots: four batch dims, then the named core dims.
constexpr int kN = 4, kM = 5, kJ = 6, kK = 7, kE = 8, kRoles = 9;
constexpr std::string_view kRoleNames = "0123nmjke";

using Index = std::array<int64_t, kRoles>;

// One array seen through its roles: the element stride of each role (0 where
// the array lacks it) and its size (1 where it lacks it).
struct View {
  Index stride{}, size{};
  std::string roles;

  bool Has(int role) const { return roles.find(kRoleNames[role]) != std::string::npos; }
  int64_t At(const Index& i) const {
    int64_t offset = 0;
    for (int r = 0; r < kRoles; ++r) offset += i[r] * stride[r];
    return offset;
  }
};

// `roles` of an array of `dims`, or an error naming the array.
ffi::ErrorOr<View> ReadView(std::string_view roles, ffi::Span<const int64_t> dims,
                            const std::string& what) {
  View v;
  v.roles = std::string(roles);
  v.size.fill(1);
  if (roles.size() != dims.size()) {
    return ffi::Unexpected(KernelError("layout", what + " has roles '" + v.roles + "' for dims " +
                                     DimsToString(dims)));
  }
  int64_t stride = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    const size_t role = kRoleNames.find(roles[d]);
    if (role == std::string_view::npos || v.stride[role] != 0 || v.size[role] != 1) {
      return ffi::Unexpected(KernelError("layout", what + " has an unknown or repeated role in '" +
                                       v.roles + "'"));
    }
    v.stride[role] = stride;
    v.size[role] = dims[d];
    stride *= dims[d];
  }
  return v;
}

// The sizes every array agrees on: a role's size where any array has it.
ffi::ErrorOr<Index> CommonSizes(const std::vector<View>& views) {
  Index size;
  size.fill(1);
  Index seen{};
  for (const View& v : views) {
    for (int r = 0; r < kRoles; ++r) {
      if (!v.Has(r)) continue;
      if (seen[r] && size[r] != v.size[r]) {
        return ffi::Unexpected(KernelError("layout", std::string("arrays disagree on the size of role '") +
                                         kRoleNames[r] + "'"));
      }
      seen[r] = 1;
      size[r] = v.size[r];
    }
  }
  return size;
}

// Calls body(i) for every index over `roles` (others 0), the last role fastest.
template <typename Body>
void ForEach(const Index& size, std::initializer_list<int> roles, Body&& body) {
  Index i{};
  std::vector<int> order(roles);
  int64_t total = 1;
  for (int r : order) total *= size[r];
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rest = flat;
    for (size_t p = order.size(); p-- > 0;) {
      i[order[p]] = rest % size[order[p]];
      rest /= size[order[p]];
    }
    body(i);
  }
}

constexpr std::initializer_list<int> kBatchJ = {0, 1, 2, 3, kJ};

int64_t Clamp(int64_t v, int64_t n) { return std::min(std::max<int64_t>(v, 0), n - 1); }

struct Arrays {
  std::vector<const float*> in;
  std::vector<View> in_views;
  std::vector<void*> out;
  std::vector<View> out_views;
  std::vector<int> combining;   // the results without 'n', in order
  std::vector<int> kept;        // the results with 'n' (2 x)
};

float Load(const Arrays& a, int k, const Index& i) { return a.in[k][a.in_views[k].At(i)]; }
float& Out(const Arrays& a, int r, const Index& i) {
  return static_cast<float*>(a.out[r])[a.out_views[r].At(i)];
}
int32_t& OutIndex(const Arrays& a, int r, const Index& i) {
  return static_cast<int32_t*>(a.out[r])[a.out_views[r].At(i)];
}

// sum / max / min over n and m, or both sum and max (sum_max).
void Reduce(const Arrays& a, const Index& size, LayoutOp op) {
  ForEach(size, kBatchJ, [&](Index i) {
    float sum = 0, hi = -std::numeric_limits<float>::infinity(),
          lo = std::numeric_limits<float>::infinity();
    ForEach(size, {kN, kM}, [&](const Index& nm) {
      i[kN] = nm[kN];
      i[kM] = nm[kM];
      const float x = Load(a, 0, i);
      sum += x;
      hi = std::max(hi, x);
      lo = std::min(lo, x);
    });
    i[kN] = i[kM] = 0;
    const float value = op == kSum || op == kSumMax ? sum : op == kMax ? hi : lo;
    Out(a, a.combining[0], i) = value;
    if (op == kSumMax) Out(a, a.combining[1], i) = hi;
  });
}

// argmax / argmin along n: the first extreme.
void ArgExtreme(const Arrays& a, const Index& size, bool is_max) {
  ForEach(size, kBatchJ, [&](Index i) {
    int64_t best = 0;
    float best_value = Load(a, 0, i);
    for (int64_t n = 1; n < size[kN]; ++n) {
      i[kN] = n;
      const float x = Load(a, 0, i);
      if (is_max ? x > best_value : x < best_value) best = n, best_value = x;
    }
    i[kN] = 0;
    Out(a, a.combining[0], i) = best_value;
    OutIndex(a, a.combining[1], i) = static_cast<int32_t>(best);
  });
}

// max_k / min_k along n: a stable sort, the first k.
void TopK(const Arrays& a, const Index& size, bool is_max) {
  std::vector<int64_t> order(size[kN]);
  std::vector<float> row(size[kN]);
  ForEach(size, kBatchJ, [&](Index i) {
    for (int64_t n = 0; n < size[kN]; ++n) {
      i[kN] = n;
      row[n] = Load(a, 0, i);
    }
    i[kN] = 0;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
      return is_max ? row[p] > row[q] : row[p] < row[q];
    });
    for (int64_t k = 0; k < size[kK]; ++k) {
      i[kK] = k;
      Out(a, a.combining[0], i) = row[order[k]];
      OutIndex(a, a.combining[1], i) = static_cast<int32_t>(order[k]);
    }
  });
}

// Attention-like: lse = logsumexp over n, m of s; average = softmax-weighted v.
void Logsumexp(const Arrays& a, const Index& size) {
  ForEach(size, kBatchJ, [&](Index i) {
    float top = -std::numeric_limits<float>::infinity();
    ForEach(size, {kN, kM}, [&](const Index& nm) {
      i[kN] = nm[kN];
      i[kM] = nm[kM];
      top = std::max(top, Load(a, 0, i));
    });
    std::vector<float> acc(size[kE], 0.0f);
    float total = 0;
    ForEach(size, {kN, kM}, [&](const Index& nm) {
      i[kN] = nm[kN];
      i[kM] = nm[kM];
      const float w = std::exp(Load(a, 0, i) - top);
      total += w;
      for (int64_t e = 0; e < size[kE]; ++e) {
        i[kE] = e;
        acc[e] += w * Load(a, 1, i);
      }
      i[kE] = 0;
    });
    i[kN] = i[kM] = 0;
    const size_t last = a.combining.size() - 1;
    for (size_t r = 0; r < last; ++r) {
      for (int64_t e = 0; e < size[kE]; ++e) {
        i[kE] = e;
        Out(a, a.combining[r], i) = acc[e] / total;
      }
      i[kE] = 0;
    }
    Out(a, a.combining[last], i) = top + std::log(total);
  });
}

// The window sum along n and m, clamped at the array's ends.
void Halo(const Arrays& a, const Index& size, int64_t lo, int64_t hi) {
  const bool has_m = a.in_views[0].Has(kM);
  ForEach(size, {0, 1, 2, 3, kN, kM, kJ}, [&](const Index& at) {
    Index i = at;
    float sum = 0;
    for (int64_t dn = -lo; dn <= hi; ++dn) {
      for (int64_t dm = has_m ? -lo : 0; dm <= (has_m ? hi : 0); ++dm) {
        i[kN] = Clamp(at[kN] + dn, size[kN]);
        i[kM] = Clamp(at[kM] + dm, size[kM]);
        sum += Load(a, 0, i);
      }
    }
    for (size_t r = 0; r < a.out.size(); ++r) Out(a, static_cast<int>(r), at) = sum;
  });
}

ffi::Error LayoutImpl(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t op,
                      std::string_view roles, int64_t lo, int64_t hi) {
  std::vector<std::string_view> groups;
  for (size_t start = 0;;) {
    const size_t end = roles.find(';', start);
    groups.push_back(roles.substr(start, end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (groups.size() != args.size() + rets.size() || args.size() < 1 || op < kSum ||
      op > kHalo) {
    return KernelError("layout", "roles '" + std::string(roles) + "' do not fit " +
                                     std::to_string(args.size()) + " operands and " +
                                     std::to_string(rets.size()) + " results, or op " +
                                     std::to_string(op) + " is unknown");
  }
  Arrays a;
  std::vector<View> views;
  for (size_t k = 0; k < args.size(); ++k) {
    auto buffer = args.get<ffi::AnyBuffer>(k);
    if (buffer.has_error()) return buffer.error();
    if (buffer->element_type() != ffi::F32) {
      return KernelError("layout", "operand " + std::to_string(k) + " must be f32");
    }
    auto view = ReadView(groups[k], buffer->dimensions(), "operand " + std::to_string(k));
    if (view.has_error()) return view.error();
    a.in.push_back(buffer->typed_data<float>());
    a.in_views.push_back(*view);
  }
  for (size_t r = 0; r < rets.size(); ++r) {
    auto buffer = rets.get<ffi::AnyBuffer>(r);
    if (buffer.has_error()) return buffer.error();
    auto view = ReadView(groups[args.size() + r], (*buffer)->dimensions(),
                         "result " + std::to_string(r));
    if (view.has_error()) return view.error();
    a.out.push_back((*buffer)->untyped_data());
    a.out_views.push_back(*view);
    (view->Has(kN) && op != kHalo ? a.kept : a.combining).push_back(static_cast<int>(r));
  }
  views = a.in_views;
  views.insert(views.end(), a.out_views.begin(), a.out_views.end());
  auto size = CommonSizes(views);
  if (size.has_error()) return size.error();
  const bool indexed = op == kArgmax || op == kArgmin || op == kMaxK || op == kMinK;
  const size_t wanted = op == kSumMax || indexed ? 2 : 1;
  const bool fits = op == kHalo ? a.kept.empty()
                    : op == kLogsumexp ? !a.combining.empty() && args.size() >= 2
                                       : a.combining.size() == wanted;
  if (!fits) {
    return KernelError("layout", "op " + std::to_string(op) + " got " +
                                     std::to_string(a.combining.size()) +
                                     " combining results");
  }
  for (size_t r = 0; r < rets.size(); ++r) {
    auto buffer = rets.get<ffi::AnyBuffer>(r);
    const bool index = indexed && static_cast<int>(r) == a.combining.back();
    if ((*buffer)->element_type() != (index ? ffi::S32 : ffi::F32)) {
      return KernelError("layout", "result " + std::to_string(r) + " must be " +
                                       (index ? "int32" : "f32"));
    }
  }
  for (int r : a.kept) {
    ForEach(*size, {0, 1, 2, 3, kN, kM, kJ},
            [&](const Index& i) { Out(a, r, i) = 2 * Load(a, 0, i); });
  }
  switch (op) {
    case kSum: case kMax: case kMin: case kSumMax:
      Reduce(a, *size, static_cast<LayoutOp>(op));
      break;
    case kArgmax: case kArgmin:
      ArgExtreme(a, *size, op == kArgmax);
      break;
    case kMaxK: case kMinK:
      TopK(a, *size, op == kMaxK);
      break;
    case kLogsumexp:
      Logsumexp(a, *size);
      break;
    default:
      Halo(a, *size, lo, hi);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kLayout, LayoutImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("op")
                                  .Attr<std::string_view>("roles")
                                  .Attr<int64_t>("lo")
                                  .Attr<int64_t>("hi"));

HandlerTable LayoutHandlers() { return {{"layout", reinterpret_cast<void*>(kLayout)}}; }

}  // namespace batchpart::testing
