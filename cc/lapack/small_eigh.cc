#include "lapack/small_eigh.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "common/contracts.h"
#include "lapack/lapack_api.h"

namespace batchpart::lapack::interleaved {
namespace {

// Always inlined, so that the kernel compiled per instruction set
// (target_clones) gets each loop compiled for it too.
#define BATCHPART_INLINE [[gnu::always_inline]] inline

// One plane of an interleaved n x n matrix: element (i, j)'s lanes at
// data + (i * n + j) * kLanes<T>.
template <typename T>
struct Square {
  T* data;
  int64_t n;
  BATCHPART_INLINE T* at(int64_t i, int64_t j) const { return data + (i * n + j) * kLanes<T>; }
};

template <typename T>
using Vec = typename LaneVector<T>::type;

template <typename T>
BATCHPART_INLINE Vec<T> Abs(Vec<T> x) {
  return x < Vec<T>{} ? -x : x;
}

// Each lane's square root, through memory so that the loop vectorizes
// (this file is built without errno, see CMakeLists.txt).
template <typename T>
BATCHPART_INLINE Vec<T> Sqrt(Vec<T> x) {
  alignas(64) T lanes[kLanes<T>];
  StoreLanes(lanes, x);
  for (int l = 0; l < kLanes<T>; ++l) lanes[l] = std::sqrt(lanes[l]);
  return LoadLanes(lanes);
}

// Whether any lane of a comparison's result is set.
template <typename Mask>
BATCHPART_INLINE bool AnyLane(const Mask& mask) {
  constexpr int kCount = sizeof(Mask) / sizeof(mask[0]);
  bool any = false;
  for (int l = 0; l < kCount; ++l) any |= mask[l] != 0;
  return any;
}

// x' = c x - s y and y' = s x + c y, lane by lane, in place.
template <typename T>
BATCHPART_INLINE void Rotate(T* x, T* y, Vec<T> c, Vec<T> s) {
  const Vec<T> a = LoadLanes(x), b = LoadLanes(y);
  StoreLanes(x, c * a - s * b);
  StoreLanes(y, s * a + c * b);
}

// Copies the upper triangle into the lower one, which the sweeps work on.
template <typename T>
void MirrorUpper(const Square<T>& a) {
  for (int64_t i = 1; i < a.n; ++i) {
    for (int64_t j = 0; j < i; ++j) StoreLanes(a.at(i, j), LoadLanes(a.at(j, i)));
  }
}

// Scales each lane of the lower triangle by a power of two that brings its
// largest element into [1, 2) (exact), so the rotations' squares neither
// overflow nor underflow; a lane with a non-finite element becomes the
// identity, flagged in `bad`. Returns each lane's scale in `scale` and its
// threshold, eps * ||A||_F / n of the scaled matrix, in `threshold`.
template <typename T>
void Prepare(const Square<T>& a, T* scale, T* threshold, bool* bad) {
  constexpr int W = kLanes<T>;
  const int64_t n = a.n;
  Vec<T> largest{}, sum{};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const Vec<T> x = LoadLanes(a.at(i, j));
      // NaN compares false either way; Inf is not below the largest finite.
      const Vec<T> size = x == x ? Abs<T>(x) : Vec<T>{} + std::numeric_limits<T>::infinity();
      largest = size > largest ? size : largest;
    }
  }
  alignas(64) T lanes[W];
  StoreLanes(lanes, largest);
  for (int l = 0; l < W; ++l) {
    bad[l] = !(lanes[l] <= std::numeric_limits<T>::max());
    scale[l] = bad[l] || lanes[l] == 0 ? T(1) : std::ldexp(T(1), -std::ilogb(lanes[l]));
  }
  for (int l = 0; l < W; ++l) {
    if (!bad[l]) continue;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) a.at(i, j)[l] = i == j ? T(1) : T(0);
    }
  }
  const Vec<T> factor = LoadLanes(scale);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const Vec<T> x = LoadLanes(a.at(i, j)) * factor;
      StoreLanes(a.at(i, j), x);
      sum += (i == j ? T(1) : T(2)) * x * x;
    }
  }
  StoreLanes(threshold, Sqrt<T>(sum) * (std::numeric_limits<T>::epsilon() / static_cast<T>(n)));
}

// One rotation of the pair (p, q), p < q, in every lane where |a(q, p)| is
// above the threshold: the lower triangle's rows and columns p and q, and
// rows p and q of vt (V transposed, so that V's columns are contiguous).
// Returns the lanes rotated.
template <typename T>
BATCHPART_INLINE auto RotatePair(const Square<T>& a, const Square<T>& vt, bool vectors,
                                 Vec<T> threshold, int64_t p, int64_t q) {
  const int64_t n = a.n;
  const Vec<T> apq = LoadLanes(a.at(q, p));
  const auto rotate = Abs<T>(apq) > threshold;
  if (!AnyLane(rotate)) return rotate;
  const Vec<T> app = LoadLanes(a.at(p, p)), aqq = LoadLanes(a.at(q, q));
  // t = tan(theta), the smaller root of t^2 + 2 t cot(2 theta) - 1 = 0,
  // cot(2 theta) = (a_qq - a_pp) / (2 a_pq): sign(d) 2 a_pq / (|d| + hypot(d,
  // 2 a_pq)), d = a_qq - a_pp (sign(0) = +1). The scaled entries keep the
  // squares in range; lanes not rotated get t = 0.
  const Vec<T> d = aqq - app, two = apq + apq;
  const Vec<T> zero{}, one = zero + T(1);
  const Vec<T> denominator = Abs<T>(d) + Sqrt<T>(d * d + two * two);
  Vec<T> t = rotate ? two / (rotate ? denominator : one) : zero;
  t = d < zero ? -t : t;
  const Vec<T> c = one / Sqrt<T>(one + t * t), s = t * c;
  StoreLanes(a.at(p, p), app - t * apq);
  StoreLanes(a.at(q, q), aqq + t * apq);
  StoreLanes(a.at(q, p), rotate ? zero : apq);
  for (int64_t k = 0; k < p; ++k) Rotate<T>(a.at(p, k), a.at(q, k), c, s);
  for (int64_t k = p + 1; k < q; ++k) Rotate<T>(a.at(k, p), a.at(q, k), c, s);
  for (int64_t k = q + 1; k < n; ++k) Rotate<T>(a.at(k, p), a.at(k, q), c, s);
  if (vectors) {
    for (int64_t k = 0; k < n; ++k) Rotate<T>(vt.at(p, k), vt.at(q, k), c, s);
  }
  return rotate;
}

// Sweeps until no lane rotates (or kMaxEighSweeps); returns the lanes that
// still rotated in the last sweep taken, i.e. did not converge.
template <typename T>
BATCHPART_INLINE auto Sweep(const Square<T>& a, const Square<T>& vt, bool vectors,
                            const T* threshold_lanes) {
  const Vec<T> threshold = LoadLanes(threshold_lanes);
  using Mask = decltype(threshold > threshold);
  Mask rotated{};
  for (int sweep = 0; sweep < kMaxEighSweeps; ++sweep) {
    rotated = Mask{};
    for (int64_t p = 0; p + 1 < a.n; ++p) {
      for (int64_t q = p + 1; q < a.n; ++q) rotated |= RotatePair<T>(a, vt, vectors, threshold, p, q);
    }
    if (!AnyLane(rotated)) break;
  }
  return rotated;
}

template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void EighLanes(int64_t n, bool lower, bool vectors, T* a_data, T* vt_data, T* scale,
               T* threshold, bool* bad, bool* unconverged) {
  constexpr int W = kLanes<T>;
  const Square<T> a{a_data, n}, vt{vt_data, n};
  if (!lower) MirrorUpper(a);
  Prepare(a, scale, threshold, bad);
  if (vectors) {
    std::memset(vt_data, 0, sizeof(T) * n * n * W);
    for (int64_t i = 0; i < n; ++i) StoreLanes(vt.at(i, i), Vec<T>{} + T(1));
  }
  const auto rotated = Sweep<T>(a, vt, vectors, threshold);
  for (int l = 0; l < W; ++l) unconverged[l] = rotated[l] != 0;
}

#undef BATCHPART_INLINE

}  // namespace

template <typename T>
void EighGroup(Group<T>& a, bool lower, bool vectors, EighWork<T>& work, Group<T>& w,
               Group<T>& v, int32_t* info) {
  constexpr int W = kLanes<T>;
  const int64_t n = a.rows();
  Group<T>& vt = work.vt;
  std::vector<T>& values = work.values;
  std::vector<int64_t>& order = work.order;
  alignas(64) T scale[W], threshold[W];
  bool bad[W], unconverged[W];
  EighLanes<T>(n, lower, vectors, a.re(0, 0), vt.re(0, 0), scale, threshold, bad, unconverged);
  // Each lane's eigenvalues ascending, and its eigenvectors in their order.
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (int l = 0; l < W; ++l) {
    info[l] = bad[l] ? kNonFiniteInfo : unconverged[l] ? 1 : 0;
    if (info[l] != 0) {
      for (int64_t i = 0; i < n; ++i) w.re(0, i)[l] = nan;
      for (int64_t i = 0; vectors && i < n; ++i) {
        for (int64_t k = 0; k < n; ++k) v.re(k, i)[l] = nan;
      }
      continue;
    }
    for (int64_t i = 0; i < n; ++i) values[i] = a.re(i, i)[l] / scale[l];
    std::iota(order.begin(), order.end(), int64_t{0});
    std::sort(order.begin(), order.end(),
              [&](int64_t x, int64_t y) { return values[x] < values[y]; });
    for (int64_t i = 0; i < n; ++i) w.re(0, i)[l] = values[order[i]];
    for (int64_t i = 0; vectors && i < n; ++i) {
      for (int64_t k = 0; k < n; ++k) v.re(k, i)[l] = vt.re(order[i], k)[l];
    }
  }
}

template void EighGroup<float>(Group<float>&, bool, bool, EighWork<float>&, Group<float>&,
                               Group<float>&, int32_t*);
template void EighGroup<double>(Group<double>&, bool, bool, EighWork<double>&, Group<double>&,
                                Group<double>&, int32_t*);

}  // namespace batchpart::lapack::interleaved
