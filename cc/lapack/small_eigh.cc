#include "lapack/small_eigh.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "common/contracts.h"
#include "lapack/lapack_api.h"
#include "lapack/scalar_types.h"

namespace batchpart::lapack::interleaved {
namespace {

// Always inlined, so that the kernel compiled per instruction set
// (target_clones) gets each loop compiled for it too.
#define BATCHPART_INLINE [[gnu::always_inline]] inline

template <typename R>
using Vec = typename LaneVector<R>::type;

template <typename R>
BATCHPART_INLINE Vec<R> Abs(Vec<R> x) {
  return x < Vec<R>{} ? -x : x;
}

// Each lane's square root, through memory so that the loop vectorizes
// (this file is built without errno, see CMakeLists.txt).
template <typename R>
BATCHPART_INLINE Vec<R> Sqrt(Vec<R> x) {
  alignas(64) R lanes[kLanes<R>];
  StoreLanes(lanes, x);
  for (int l = 0; l < kLanes<R>; ++l) lanes[l] = std::sqrt(lanes[l]);
  return LoadLanes(lanes);
}

// One Jacobi rotation, U = [[c, conj(g)], [-g, c]] on the pair (p, q): c
// real, g = s e with e the phase of a(q, p) (real T: g = s, e folded into
// s's sign). A <- U^H A U and V <- V U.
template <typename T>
struct Rotation {
  using R = Real<T>;
  Vec<R> c, g_re, g_im;  // g_im unused for real T
};

// The column operation of a rotation on element pairs (x, y) of columns p
// and q: x' = c x - g y, y' = conj(g) x + c y. The row operation on
// elements (P, Q) of rows p and q, P' = c P - conj(g) Q, Q' = g P + c Q, is
// the same with g conjugated (`conjugate`).
template <typename T, bool conjugate = false>
BATCHPART_INLINE void RotatePair(const Rotation<T>& u, Real<T>* x_re, Real<T>* x_im,
                                 Real<T>* y_re, Real<T>* y_im) {
  const auto xr = LoadLanes(x_re), yr = LoadLanes(y_re);
  if constexpr (!kIsComplex<T>) {
    StoreLanes(x_re, u.c * xr - u.g_re * yr);
    StoreLanes(y_re, u.g_re * xr + u.c * yr);
  } else {
    const auto xi = LoadLanes(x_im), yi = LoadLanes(y_im);
    const auto gr = u.g_re, gi = conjugate ? -u.g_im : u.g_im;
    StoreLanes(x_re, u.c * xr - (gr * yr - gi * yi));
    StoreLanes(x_im, u.c * xi - (gr * yi + gi * yr));
    StoreLanes(y_re, (gr * xr + gi * xi) + u.c * yr);
    StoreLanes(y_im, (gr * xi - gi * xr) + u.c * yi);
  }
}

// The rotation on a column-p element x = a(k, p) and a row-q element
// Q = a(q, k) (p < k < q in the lower triangle; a(k, q) = conj(Q)):
// x' = c x - g conj(Q), Q' = g conj(x) + c Q.
template <typename T>
BATCHPART_INLINE void RotateAcross(const Rotation<T>& u, Real<T>* x_re, Real<T>* x_im,
                                   Real<T>* q_re, Real<T>* q_im) {
  if constexpr (!kIsComplex<T>) {
    RotatePair<T>(u, x_re, x_im, q_re, q_im);
  } else {
    const auto xr = LoadLanes(x_re), xi = LoadLanes(x_im);
    const auto qr = LoadLanes(q_re), qi = LoadLanes(q_im);
    const auto gr = u.g_re, gi = u.g_im;
    StoreLanes(x_re, u.c * xr - (gr * qr + gi * qi));
    StoreLanes(x_im, u.c * xi - (gi * qr - gr * qi));
    StoreLanes(q_re, (gr * xr + gi * xi) + u.c * qr);
    StoreLanes(q_im, (gi * xr - gr * xi) + u.c * qi);
  }
}

// Copies the upper triangle, conjugated, into the lower one, which the
// sweeps work on.
template <typename T>
void MirrorUpper(const Planes<T>& a) {
  for (int64_t i = 1; i < a.cols; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      StoreLanes(a.Re(i, j), LoadLanes(a.Re(j, i)));
      if constexpr (kIsComplex<T>) StoreLanes(a.Im(i, j), -LoadLanes(a.Im(j, i)));
    }
  }
}

// Scales each lane of the lower triangle by a power of two that brings its
// largest real or imaginary part into [1, 2) (exact), so the rotations'
// squares neither overflow nor underflow; a lane with a non-finite element
// becomes the identity, flagged in `bad`. The diagonal's imaginary parts are
// dropped, as LAPACK's heevd ignores them. Returns each lane's scale in
// `scale` and its threshold, eps * ||A||_F / n of the scaled matrix, in
// `threshold`.
template <typename T>
void Prepare(const Planes<T>& a, Real<T>* scale, Real<T>* threshold, bool* bad) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const int64_t n = a.cols;
  const Vec<R> infinity = Vec<R>{} + std::numeric_limits<R>::infinity();
  Vec<R> largest{};
  // NaN compares false either way; Inf is not below the largest finite. A
  // diagonal's imaginary part is not used, but must be finite too (as the
  // per-matrix path checks the whole triangle).
  const auto grow = [&](R* x_lanes, bool used) {
    const Vec<R> x = LoadLanes(x_lanes);
    Vec<R> size = x == x ? Abs<R>(x) : infinity;
    if (!used) size = size == infinity ? infinity : Vec<R>{};
    largest = size > largest ? size : largest;
  };
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      grow(a.Re(i, j), true);
      if constexpr (kIsComplex<T>) grow(a.Im(i, j), i != j);
    }
  }
  alignas(64) R lanes[W];
  StoreLanes(lanes, largest);
  for (int l = 0; l < W; ++l) {
    bad[l] = !(lanes[l] <= std::numeric_limits<R>::max());
    scale[l] = bad[l] || lanes[l] == 0 ? R(1) : std::ldexp(R(1), -std::ilogb(lanes[l]));
  }
  for (int l = 0; l < W; ++l) {
    if (!bad[l]) continue;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        a.Re(i, j)[l] = i == j ? R(1) : R(0);
        if constexpr (kIsComplex<T>) a.Im(i, j)[l] = R(0);
      }
    }
  }
  // Scaled, and -0 made +0: a lane that does not rotate a pair takes the
  // rotation c = 1, g = 0 with the lanes that do, which keeps every value but
  // could turn a -0 into +0, so that a lane's bits would depend on its group.
  const Vec<R> factor = LoadLanes(scale);
  Vec<R> sum{};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j <= i; ++j) {
      const Vec<R> x = LoadLanes(a.Re(i, j)) * factor + R(0);
      StoreLanes(a.Re(i, j), x);
      sum += (i == j ? R(1) : R(2)) * x * x;
      if constexpr (kIsComplex<T>) {
        const Vec<R> y = i == j ? Vec<R>{} : LoadLanes(a.Im(i, j)) * factor + R(0);
        StoreLanes(a.Im(i, j), y);
        sum += R(2) * y * y;
      }
    }
  }
  StoreLanes(threshold, Sqrt<R>(sum) * (std::numeric_limits<R>::epsilon() / static_cast<R>(n)));
}

// The rotation of the pair (p, q), p < q, that zeroes a(q, p), in every
// lane where |a(q, p)| is above the threshold: written to rotations (c, g
// re, g im for complex T, one lane vector each) with its 2 x 2 block taken.
// Returns the lanes rotated (none: nothing written).
template <typename T>
BATCHPART_INLINE auto Angle(const Planes<T>& a, Vec<Real<T>> threshold, int64_t p, int64_t q,
                            Real<T>* out) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const Vec<R> zero{}, one = zero + R(1);
  // The off-diagonal element's size r and phase e = a(q, p) / r; a real
  // element keeps its sign in r instead (e = 1).
  const Vec<R> zr = LoadLanes(a.Re(q, p));
  Vec<R> r = zr, zi{};
  if constexpr (kIsComplex<T>) {
    zi = LoadLanes(a.Im(q, p));
    r = Sqrt<R>(zr * zr + zi * zi);
  }
  const auto rotate = Abs<R>(r) > threshold;
  if (!AnyLane(rotate)) return rotate;
  const Vec<R> app = LoadLanes(a.Re(p, p)), aqq = LoadLanes(a.Re(q, q));
  // The real symmetric 2 x 2 problem [[a_pp, r], [r, a_qq]]: with d = a_qq
  // - a_pp, b = 2 r and h = hypot(d, b), tan(theta) is t = sign(d) b / (|d| +
  // h) (sign(0) = +1, the smaller angle), and cos and sin follow without t:
  // c = (|d| + h) / u, s = sign(d) b / u, u = sqrt(2 h (h + |d|)). The
  // scaled entries keep the squares in range; lanes not rotated get t = s =
  // 0, c = 1.
  const Vec<R> d = aqq - app, b = r + r, size = Abs<R>(d);
  const Vec<R> h = Sqrt<R>(d * d + b * b), sum = size + h;
  const Vec<R> signed_b = d < zero ? -b : b;
  const Vec<R> inverse_u = one / (rotate ? Sqrt<R>((h + h) * sum) : one);
  const Vec<R> t = rotate ? signed_b / (rotate ? sum : one) : zero;
  const Vec<R> s = rotate ? signed_b * inverse_u : zero;
  StoreLanes(out, rotate ? sum * inverse_u : one);
  if constexpr (kIsComplex<T>) {
    const Vec<R> inverse_r = one / (rotate ? r : one);
    StoreLanes(out + W, s * zr * inverse_r);
    StoreLanes(out + 2 * W, s * zi * inverse_r);
    StoreLanes(a.Im(q, p), rotate ? zero : zi);
  } else {
    StoreLanes(out + W, s);
  }
  StoreLanes(a.Re(p, p), app - t * r);
  StoreLanes(a.Re(q, q), aqq + t * r);
  StoreLanes(a.Re(q, p), rotate ? zero : zr);
  return rotate;
}

// Lane vectors per rotation in Sweep's buffer: c and g (real or complex).
template <typename T>
inline constexpr int kRotationVectors = kIsComplex<T> ? 3 : 2;

template <typename T>
BATCHPART_INLINE Rotation<T> LoadRotation(const Real<T>* in) {
  constexpr int W = kLanes<T>;
  Rotation<T> u;
  u.c = LoadLanes(in);
  u.g_re = LoadLanes(in + W);
  if constexpr (kIsComplex<T>) u.g_im = LoadLanes(in + 2 * W);
  return u;
}

// The rest of a rotation of (p, q): rows and columns p and q of the lower
// triangle outside the 2 x 2 block.
template <typename T>
BATCHPART_INLINE void RotateOffBlock(const Planes<T>& a, int64_t p, int64_t q,
                                     const Rotation<T>& u) {
  constexpr bool kComplex = kIsComplex<T>;
  const auto im = [&](int64_t i, int64_t j) { return kComplex ? a.Im(i, j) : nullptr; };
  for (int64_t k = 0; k < p; ++k) {
    RotatePair<T, /*conjugate=*/true>(u, a.Re(p, k), im(p, k), a.Re(q, k), im(q, k));
  }
  for (int64_t k = p + 1; k < q; ++k) {
    RotateAcross<T>(u, a.Re(k, p), im(k, p), a.Re(q, k), im(q, k));
  }
  for (int64_t k = q + 1; k < a.cols; ++k) {
    RotatePair<T>(u, a.Re(k, p), im(k, p), a.Re(k, q), im(k, q));
  }
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
// order's chain). vt is V transposed: row p is V's column p. `rotations`
// holds n / 2 rotations, `pairs` n indices.
template <typename T>
BATCHPART_INLINE auto Sweep(const Planes<T>& a, const Planes<T>& vt, bool vectors,
                            const Real<T>* threshold_lanes, Real<T>* rotations, int64_t* pairs) {
  using R = Real<T>;
  constexpr int W = kLanes<T>, kStride = kRotationVectors<T> * W;
  constexpr bool kComplex = kIsComplex<T>;
  const int64_t n = a.cols, m = n + (n & 1);  // odd n: index n is a bye
  const Vec<R> threshold = LoadLanes(threshold_lanes);
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
        const Mask lanes = Angle<T>(a, threshold, p, q, rotations + count * kStride);
        if (!AnyLane(lanes)) continue;
        rotated |= lanes;
        pairs[2 * count] = p;
        pairs[2 * count + 1] = q;
        ++count;
      }
      for (int64_t j = 0; j < count; ++j) {
        const int64_t p = pairs[2 * j], q = pairs[2 * j + 1];
        const Rotation<T> u = LoadRotation<T>(rotations + j * kStride);
        RotateOffBlock<T>(a, p, q, u);
        for (int64_t k = 0; vectors && k < n; ++k) {
          RotatePair<T>(u, vt.Re(p, k), kComplex ? vt.Im(p, k) : nullptr, vt.Re(q, k),
                        kComplex ? vt.Im(q, k) : nullptr);
        }
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
void EighLanes(bool lower, bool vectors, Planes<T> a, Planes<T> vt, Real<T>* rotations,
               int64_t* pairs, Real<T>* scale, Real<T>* threshold, bool* bad,
               bool* unconverged) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const int64_t n = a.cols;
  if (!lower) MirrorUpper(a);
  Prepare(a, scale, threshold, bad);
  if (vectors) {
    std::memset(vt.re, 0, sizeof(R) * n * n * W);
    if constexpr (kIsComplex<T>) std::memset(vt.im, 0, sizeof(R) * n * n * W);
    for (int64_t i = 0; i < n; ++i) StoreLanes(vt.Re(i, i), Vec<R>{} + R(1));
  }
  const auto rotated = Sweep<T>(a, vt, vectors, threshold, rotations, pairs);
  for (int l = 0; l < W; ++l) unconverged[l] = rotated[l] != 0;
}

#undef BATCHPART_INLINE

template <typename T>
Planes<T> PlanesOf(Group<T>& g) {
  if constexpr (kIsComplex<T>) {
    return {g.re(0, 0), g.im(0, 0), g.rows()};
  } else {
    return {g.re(0, 0), nullptr, g.rows()};
  }
}

}  // namespace

template <typename T>
void EighGroup(Group<T>& a, bool lower, bool vectors, EighWork<T>& work, Group<Real<T>>& w,
               Group<T>& v, int32_t* info) {
  using R = Real<T>;
  constexpr int W = kLanes<T>;
  const int64_t n = a.rows();
  std::vector<R>& values = work.values;
  std::vector<int64_t>& order = work.order;
  alignas(64) R scale[W], threshold[W];
  bool bad[W], unconverged[W];
  EighLanes<T>(lower, vectors, PlanesOf(a), PlanesOf(work.vt), work.rotations.data(),
               work.pairs.data(), scale, threshold, bad, unconverged);
  // Each lane's eigenvalues ascending, and its eigenvectors in their order:
  // column i of V is row order[i] of vt.
  const R nan = std::numeric_limits<R>::quiet_NaN();
  const Group<T>& vt = work.vt;
  for (int l = 0; l < W; ++l) {
    info[l] = bad[l] ? kNonFiniteInfo : unconverged[l] ? 1 : 0;
    const bool failed = info[l] != 0;
    if (!failed) {
      for (int64_t i = 0; i < n; ++i) values[i] = a.re(i, i)[l] / scale[l];
      std::iota(order.begin(), order.end(), int64_t{0});
      std::sort(order.begin(), order.end(),
                [&](int64_t x, int64_t y) { return values[x] < values[y]; });
    }
    for (int64_t i = 0; i < n; ++i) w.re(0, i)[l] = failed ? nan : values[order[i]];
    for (int64_t i = 0; vectors && i < n; ++i) {
      for (int64_t k = 0; k < n; ++k) {
        v.re(k, i)[l] = failed ? nan : vt.re(order[i], k)[l];
        if constexpr (kIsComplex<T>) v.im(k, i)[l] = failed ? nan : vt.im(order[i], k)[l];
      }
    }
  }
}

#define BATCHPART_EIGH_GROUP(T)                                                               \
  template void EighGroup<T>(Group<T>&, bool, bool, EighWork<T>&, Group<Real<T>>&, Group<T>&, \
                             int32_t*);
BATCHPART_FOR_EACH_SCALAR(BATCHPART_EIGH_GROUP)
#undef BATCHPART_EIGH_GROUP

}  // namespace batchpart::lapack::interleaved
