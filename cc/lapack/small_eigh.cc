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

// Whether any lane of a comparison's result is set: its 64 bytes OR-ed as
// words (lane by lane, the compiler extracted each lane on its own).
template <typename Mask>
BATCHPART_INLINE bool AnyLane(const Mask& mask) {
  static_assert(sizeof(Mask) == 8 * sizeof(uint64_t));
  uint64_t words[8];
  std::memcpy(words, &mask, sizeof(words));
  return ((words[0] | words[1]) | (words[2] | words[3]) | (words[4] | words[5]) |
          (words[6] | words[7])) != 0;
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

// The rotation of the pair (p, q), p < q, that zeroes a(q, p), in every
// lane where |a(q, p)| is above the threshold: its cosine and sine go to
// c_out and s_out, and the 2 x 2 block (p, q) takes it. Returns the lanes
// rotated (none: nothing written).
template <typename T>
BATCHPART_INLINE auto Angle(const Square<T>& a, Vec<T> threshold, int64_t p, int64_t q, T* c_out,
                            T* s_out) {
  const Vec<T> apq = LoadLanes(a.at(q, p));
  const auto rotate = Abs<T>(apq) > threshold;
  if (!AnyLane(rotate)) return rotate;
  const Vec<T> app = LoadLanes(a.at(p, p)), aqq = LoadLanes(a.at(q, q));
  // With d = a_qq - a_pp, b = 2 a_pq and h = hypot(d, b), tan(theta) is
  // t = sign(d) b / (|d| + h) (sign(0) = +1, the smaller angle), and cos
  // and sin follow without t: c = (|d| + h) / u, s = sign(d) b / u,
  // u = sqrt(2 h (h + |d|)). The scaled entries keep the squares in range;
  // lanes not rotated get t = s = 0, c = 1.
  const Vec<T> zero{}, one = zero + T(1);
  const Vec<T> d = aqq - app, b = apq + apq, size = Abs<T>(d);
  const Vec<T> h = Sqrt<T>(d * d + b * b), sum = size + h;
  const Vec<T> signed_b = d < zero ? -b : b;
  const Vec<T> inverse_u = one / (rotate ? Sqrt<T>((h + h) * sum) : one);
  const Vec<T> t = rotate ? signed_b / (rotate ? sum : one) : zero;
  StoreLanes(c_out, rotate ? sum * inverse_u : one);
  StoreLanes(s_out, rotate ? signed_b * inverse_u : zero);
  StoreLanes(a.at(p, p), app - t * apq);
  StoreLanes(a.at(q, q), aqq + t * apq);
  StoreLanes(a.at(q, p), rotate ? zero : apq);
  return rotate;
}

// The rest of the rotation of (p, q) whose cosine and sine are c and s:
// rows and columns p and q of the lower triangle outside the 2 x 2 block.
template <typename T>
BATCHPART_INLINE void RotateOffBlock(const Square<T>& a, int64_t p, int64_t q, Vec<T> c,
                                     Vec<T> s) {
  for (int64_t k = 0; k < p; ++k) Rotate<T>(a.at(p, k), a.at(q, k), c, s);
  for (int64_t k = p + 1; k < q; ++k) Rotate<T>(a.at(k, p), a.at(q, k), c, s);
  for (int64_t k = q + 1; k < a.n; ++k) Rotate<T>(a.at(k, p), a.at(k, q), c, s);
}

// The pair of round `round` (0 <= round < m - 1) at position i (0 <= i <
// m / 2) of the circle method for m (even) indices: every index meets every
// other once in m - 1 rounds, and the pairs of one round are disjoint.
inline void RoundPair(int64_t m, int64_t round, int64_t i, int64_t* p, int64_t* q) {
  const int64_t x = i == 0 ? m - 1 : (round + i) % (m - 1);
  const int64_t y = i == 0 ? round : (round - i + m - 1) % (m - 1);
  *p = std::min(x, y);
  *q = std::max(x, y);
}

// Sweeps until no lane rotates (or kMaxEighSweeps); returns the lanes that
// still rotated in the last sweep taken, i.e. did not converge. A sweep
// visits every pair once, in rounds of disjoint pairs (RoundPair): the
// rotations of one round leave each other's 2 x 2 blocks alone, so their
// angles are computed first, side by side, rather than each waiting for
// the previous rotation's square roots and divisions (the pair-by-pair
// order's chain). `rotations` holds n lanes' worth of cosines and sines,
// `pairs` n indices.
template <typename T>
BATCHPART_INLINE auto Sweep(const Square<T>& a, const Square<T>& vt, bool vectors,
                            const T* threshold_lanes, T* rotations, int64_t* pairs) {
  constexpr int W = kLanes<T>;
  const int64_t n = a.n, m = n + (n & 1);  // odd n: index n is a bye
  const Vec<T> threshold = LoadLanes(threshold_lanes);
  using Mask = decltype(threshold > threshold);
  Mask rotated{};
  for (int sweep = 0; sweep < kMaxEighSweeps; ++sweep) {
    rotated = Mask{};
    for (int64_t round = 0; round + 1 < m; ++round) {
      int64_t count = 0;
      for (int64_t i = 0; i < m / 2; ++i) {
        int64_t p, q;
        RoundPair(m, round, i, &p, &q);
        if (q >= n) continue;
        T* cs = rotations + 2 * count * W;
        const Mask lanes = Angle<T>(a, threshold, p, q, cs, cs + W);
        if (!AnyLane(lanes)) continue;
        rotated |= lanes;
        pairs[2 * count] = p;
        pairs[2 * count + 1] = q;
        ++count;
      }
      for (int64_t j = 0; j < count; ++j) {
        const int64_t p = pairs[2 * j], q = pairs[2 * j + 1];
        const Vec<T> c = LoadLanes(rotations + 2 * j * W), s = LoadLanes(rotations + (2 * j + 1) * W);
        RotateOffBlock<T>(a, p, q, c, s);
        if (!vectors) continue;
        for (int64_t k = 0; k < n; ++k) Rotate<T>(vt.at(p, k), vt.at(q, k), c, s);
      }
    }
    if (!AnyLane(rotated)) break;
  }
  return rotated;
}

template <typename T>
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void EighLanes(int64_t n, bool lower, bool vectors, T* a_data, T* vt_data, T* rotations,
               int64_t* pairs, T* scale, T* threshold, bool* bad, bool* unconverged) {
  constexpr int W = kLanes<T>;
  const Square<T> a{a_data, n}, vt{vt_data, n};
  if (!lower) MirrorUpper(a);
  Prepare(a, scale, threshold, bad);
  if (vectors) {
    std::memset(vt_data, 0, sizeof(T) * n * n * W);
    for (int64_t i = 0; i < n; ++i) StoreLanes(vt.at(i, i), Vec<T>{} + T(1));
  }
  const auto rotated = Sweep<T>(a, vt, vectors, threshold, rotations, pairs);
  for (int l = 0; l < W; ++l) unconverged[l] = rotated[l] != 0;
}

#undef BATCHPART_INLINE

}  // namespace

template <typename T>
void EighGroup(Group<T>& a, bool lower, bool vectors, EighWork<T>& work, Group<T>& w,
               Group<T>& v, int32_t* info) {
  constexpr int W = kLanes<T>;
  const int64_t n = a.rows();
  std::vector<T>& values = work.values;
  std::vector<int64_t>& order = work.order;
  alignas(64) T scale[W], threshold[W];
  bool bad[W], unconverged[W];
  EighLanes<T>(n, lower, vectors, a.re(0, 0), work.vt.re(0, 0), work.rotations.data(),
               work.pairs.data(), scale, threshold, bad, unconverged);
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
      for (int64_t k = 0; k < n; ++k) v.re(k, i)[l] = work.vt.re(order[i], k)[l];
    }
  }
}

template void EighGroup<float>(Group<float>&, bool, bool, EighWork<float>&, Group<float>&,
                               Group<float>&, int32_t*);
template void EighGroup<double>(Group<double>&, bool, bool, EighWork<double>&, Group<double>&,
                                Group<double>&, int32_t*);

}  // namespace batchpart::lapack::interleaved
