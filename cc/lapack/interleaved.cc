#include "lapack/interleaved.h"

#include <algorithm>
#include <atomic>
#include <complex>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "lapack/scalar_types.h"

namespace batchpart::lapack::interleaved {
namespace {

// The block transposes below use the compilers' generic vectors, shuffled
// by constant index lists, compiled for AVX-512 (a vector is a whole lane
// group, one permute per shuffle) and for AVX2 (half a group). They are
// used only where they measured faster than Group's element loops, at
// n = 8..32 on one core (batch-interleaved Cholesky, pack + unpack time):
// AVX-512 takes 0.4-0.6x the loops' time for every real type; AVX2 0.3-0.95x
// for float, but 1.9-2.2x for double, whose 4-lane two-source shuffles
// cross 128-bit halves, so double on AVX2 (and every type on other CPUs or
// compilers) keeps the element loops.
#if defined(__has_builtin) && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#if __has_builtin(__builtin_shufflevector) && __has_builtin(__builtin_cpu_supports)
#define BATCHPART_INTERLEAVED_SIMD 1
#endif
#endif

// The most a block move may use (set by SetBlockTransposes).
std::atomic<Isa> g_limit{Isa::kAvx512};

// SetSmallPath's settings, by SmallKernel (zero-initialized: kAuto).
std::atomic<SmallPath> g_paths[static_cast<int>(SmallKernel::kCount)];

#ifdef BATCHPART_INTERLEAVED_SIMD

#define BATCHPART_INLINE __attribute__((always_inline)) inline

// H reals of type R in one vector.
template <typename R, int H>
struct Simd {
  typedef R V __attribute__((vector_size(H * sizeof(R))));
};

// One level of a W x W transpose held as W row vectors: for each pair of
// rows (r, r + B) with bit B of r clear, element (r, c + B) trades places
// with (r + B, c), so bit B of every element's row and column index swap.
// The levels B = W/2, ..., 1 commute, and all of them together swap every
// bit of the row index with the column index's: the transpose.
template <int W, int B, int C>
constexpr int KeepLow() {
  return (C & B) ? W + C - B : C;
}
template <int W, int B, int C>
constexpr int KeepHigh() {
  return (C & B) ? W + C : C + B;
}

template <typename V, int W, int B, int... C>
BATCHPART_INLINE void TransposeLevel(V* rows, std::integer_sequence<int, C...>) {
  for (int r = 0; r < W; ++r) {
    if (r & B) continue;
    const V low = rows[r], high = rows[r + B];
    rows[r] = __builtin_shufflevector(low, high, KeepLow<W, B, C>()...);
    rows[r + B] = __builtin_shufflevector(low, high, KeepHigh<W, B, C>()...);
  }
}

template <typename V, int W>
BATCHPART_INLINE void Transpose(V* rows) {
  constexpr auto columns = std::make_integer_sequence<int, W>{};
  if constexpr (W >= 16) TransposeLevel<V, W, 8>(rows, columns);
  if constexpr (W >= 8) TransposeLevel<V, W, 4>(rows, columns);
  TransposeLevel<V, W, 2>(rows, columns);
  TransposeLevel<V, W, 1>(rows, columns);
}

// Complex numbers as stored (re, im, re, im, ...) in two vectors, split into
// a vector of real parts and one of imaginary parts, and back.
template <typename V, int... C>
BATCHPART_INLINE void Split(const V& a, const V& b, V& re, V& im, std::integer_sequence<int, C...>) {
  re = __builtin_shufflevector(a, b, (2 * C)...);
  im = __builtin_shufflevector(a, b, (2 * C + 1)...);
}
// Element c of the first half interleaved: re[c / 2] or im[c / 2].
template <int W, int C>
constexpr int Zip() {
  return (C % 2 ? W : 0) + C / 2;
}
template <typename V, int W, int... C>
BATCHPART_INLINE void Merge(const V& re, const V& im, V& a, V& b, std::integer_sequence<int, C...>) {
  a = __builtin_shufflevector(re, im, Zip<W, C>()...);
  b = __builtin_shufflevector(re, im, Zip<W, C + W>()...);
}

// The group slots (element (i, j) at i * cols + j) of a dense matrix's
// elements in memory order, from memory offset `from`.
class SlotWalk {
 public:
  SlotWalk(int64_t rows, int64_t cols, bool column_major, int64_t from)
      : rows_(rows), cols_(cols), column_major_(column_major) {
    i_ = column_major ? from % rows : from / cols;
    j_ = column_major ? from / rows : from % cols;
  }
  int64_t Next() {
    const int64_t slot = i_ * cols_ + j_;
    if (column_major_) {
      if (++i_ == rows_) i_ = 0, ++j_;
    } else if (++j_ == cols_) {
      j_ = 0, ++i_;
    }
    return slot;
  }

 private:
  int64_t rows_, cols_;
  bool column_major_;
  int64_t i_, j_;
};

// Moves the elements at memory offsets [from, returned) of W dense matrices
// into a group's planes: H consecutive elements of H matrices (H lanes) at a
// time, loaded as H vectors, transposed, and stored as H lanes of H slots.
template <typename T, int H>
BATCHPART_INLINE int64_t PackBlocks(const T* const* src, int64_t rows, int64_t cols,
                                    bool column_major, Real<T>* re, Real<T>* im, int64_t from) {
  using V = typename Simd<Real<T>, H>::V;
  constexpr int W = kLanes<T>;
  const int64_t done = from + (rows * cols - from) / H * H;
  for (int64_t e = from; e < done; e += H) {
    for (int l0 = 0; l0 < W; l0 += H) {
      V vr[H];
      [[maybe_unused]] V vi[H];
      for (int l = 0; l < H; ++l) {
        if constexpr (kIsComplex<T>) {
          V a, b;
          std::memcpy(&a, src[l0 + l] + e, sizeof(V));
          std::memcpy(&b, src[l0 + l] + e + H / 2, sizeof(V));
          Split(a, b, vr[l], vi[l], std::make_integer_sequence<int, H>{});
        } else {
          std::memcpy(&vr[l], src[l0 + l] + e, sizeof(V));
        }
      }
      Transpose<V, H>(vr);
      if constexpr (kIsComplex<T>) Transpose<V, H>(vi);
      SlotWalk walk{rows, cols, column_major, e};
      for (int q = 0; q < H; ++q) {
        const int64_t at = walk.Next() * W + l0;
        std::memcpy(re + at, &vr[q], sizeof(V));
        if constexpr (kIsComplex<T>) std::memcpy(im + at, &vi[q], sizeof(V));
      }
    }
  }
  return done;
}

// The inverse of PackBlocks, for planes of W lanes, lanes [lane_begin,
// lane_end) of them (whole blocks of H).
template <typename T, int H, int W = kLanes<T>>
BATCHPART_INLINE int64_t UnpackBlocks(const Real<T>* re, const Real<T>* im, int64_t rows,
                                      int64_t cols, bool column_major, T* const* dst,
                                      int64_t from, int lane_begin = 0, int lane_end = W) {
  using V = typename Simd<Real<T>, H>::V;
  const int64_t done = from + (rows * cols - from) / H * H;
  for (int64_t e = from; e < done; e += H) {
    for (int l0 = lane_begin; l0 < lane_end; l0 += H) {
      V vr[H];
      [[maybe_unused]] V vi[H];
      SlotWalk walk{rows, cols, column_major, e};
      for (int q = 0; q < H; ++q) {
        const int64_t at = walk.Next() * W + l0;
        std::memcpy(&vr[q], re + at, sizeof(V));
        if constexpr (kIsComplex<T>) std::memcpy(&vi[q], im + at, sizeof(V));
      }
      Transpose<V, H>(vr);
      if constexpr (kIsComplex<T>) Transpose<V, H>(vi);
      for (int l = 0; l < H; ++l) {
        // The line the next block writes, fetched for writing now: H
        // matrices each take a store that misses (they lie a matrix apart),
        // and without the prefetch their fetches queued behind the stores
        // (16 x 16 float64, 2048 matrices: unpacking 95 -> 46 ns a matrix).
        if (e + H < done) __builtin_prefetch(dst[l0 + l] + e + H, 1);
        if constexpr (kIsComplex<T>) {
          V a, b;
          Merge<V, H>(vr[l], vi[l], a, b, std::make_integer_sequence<int, H>{});
          std::memcpy(static_cast<void*>(dst[l0 + l] + e), &a, sizeof(V));
          std::memcpy(static_cast<void*>(dst[l0 + l] + e + H / 2), &b, sizeof(V));
        } else {
          std::memcpy(dst[l0 + l] + e, &vr[l], sizeof(V));
        }
      }
    }
  }
  return done;
}

// The block moves compiled for each instruction set: a whole group's lanes
// in one AVX-512 vector, half of them in an AVX2 one. With AVX-512, the
// float types then move what the whole blocks leave in half blocks, where
// that is at least 8 elements (all of an 8 x 1 float32 right-hand side,
// which element by element took 11% of a small `solve`).
template <typename T>
__attribute__((target("avx512f"))) int64_t PackAvx512(const T* const* src, int64_t rows,
                                                      int64_t cols, bool column_major, Real<T>* re,
                                                      Real<T>* im) {
  const int64_t done = PackBlocks<T, kLanes<T>>(src, rows, cols, column_major, re, im, 0);
  if constexpr (std::is_same_v<Real<T>, float>) {
    return PackBlocks<T, kLanes<T> / 2>(src, rows, cols, column_major, re, im, done);
  } else {
    return done;
  }
}
template <typename T>
__attribute__((target("avx2"))) int64_t PackAvx2(const T* const* src, int64_t rows, int64_t cols,
                                                 bool column_major, Real<T>* re, Real<T>* im) {
  return PackBlocks<T, kLanes<T> / 2>(src, rows, cols, column_major, re, im, 0);
}
// Whether a group's lanes all write matrices a multiple of 4 KiB apart.
// Each block then stores one line to every lane at the same offset within
// a page, so all of a block's lines fall in one L1 cache set; 8 of them fit
// a set's ways, 16 (the float types' lanes) do not, and unpacking 32 x 32
// and 64 x 64 float32 matrices took 2.2x as long as with the matrices
// padded apart.
template <typename T>
bool CrowdsOneCacheSet(T* const* dst) {
  if constexpr (kLanes<T> <= 8) {
    return false;
  } else {
    const auto first = reinterpret_cast<uintptr_t>(dst[0]);
    for (int l = 1; l < kLanes<T>; ++l) {
      if ((reinterpret_cast<uintptr_t>(dst[l]) - first) % 4096 != 0) return false;
    }
    return true;
  }
}

template <typename T>
__attribute__((target("avx512f"))) int64_t UnpackAvx512(const Real<T>* re, const Real<T>* im,
                                                        int64_t rows, int64_t cols,
                                                        bool column_major, T* const* dst) {
  if (CrowdsOneCacheSet(dst)) {
    // Half the lanes at a time, each half over the whole matrix: a set then
    // takes 8 lines a block.
    constexpr int H = kLanes<T> / 2;
    const int64_t done = UnpackBlocks<T, H>(re, im, rows, cols, column_major, dst, 0, 0, H);
    UnpackBlocks<T, H>(re, im, rows, cols, column_major, dst, 0, H, kLanes<T>);
    return done;
  }
  const int64_t done = UnpackBlocks<T, kLanes<T>>(re, im, rows, cols, column_major, dst, 0);
  if constexpr (std::is_same_v<Real<T>, float>) {
    return UnpackBlocks<T, kLanes<T> / 2>(re, im, rows, cols, column_major, dst, done);
  } else {
    return done;
  }
}
template <typename T>
__attribute__((target("avx2"))) int64_t UnpackAvx2(const Real<T>* re, const Real<T>* im,
                                                   int64_t rows, int64_t cols, bool column_major,
                                                   T* const* dst) {
  return UnpackBlocks<T, kLanes<T> / 2>(re, im, rows, cols, column_major, dst, 0);
}

// UnpackIndices' block moves: int32 lanes moved as the float lanes of the
// same size (the transposes only move bits), in whole W x W blocks and then
// half blocks; the AVX2 clone in blocks of 8 (one 256-bit vector).
template <int W>
__attribute__((target("avx512f"))) int64_t UnpackIndicesAvx512(const int32_t* lanes, int64_t rows,
                                                               int32_t* const* dst) {
  const auto* re = reinterpret_cast<const float*>(lanes);
  auto* const* out = reinterpret_cast<float* const*>(dst);
  const int64_t done = UnpackBlocks<float, W, W>(re, nullptr, rows, 1, true, out, 0);
  return UnpackBlocks<float, W / 2, W>(re, nullptr, rows, 1, true, out, done);
}
template <int W>
__attribute__((target("avx2"))) int64_t UnpackIndicesAvx2(const int32_t* lanes, int64_t rows,
                                                          int32_t* const* dst) {
  const auto* re = reinterpret_cast<const float*>(lanes);
  auto* const* out = reinterpret_cast<float* const*>(dst);
  return UnpackBlocks<float, 8, W>(re, nullptr, rows, 1, true, out, 0);
}

Isa DetectedIsa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
    return Isa::kNone;
  }();
  return isa;
}

#else

Isa DetectedIsa() { return Isa::kNone; }

#endif  // BATCHPART_INTERLEAVED_SIMD

Isa BestIsa() { return std::min(DetectedIsa(), g_limit.load(std::memory_order_relaxed)); }

}  // namespace

void SetSmallPath(SmallKernel kernel, SmallPath path) {
  g_paths[static_cast<int>(kernel)].store(path);
}
SmallPath GetSmallPath(SmallKernel kernel) {
  return g_paths[static_cast<int>(kernel)].load(std::memory_order_relaxed);
}

void SetBlockTransposes(Isa limit) { g_limit.store(limit); }
Isa BlockTransposes() { return BestIsa(); }
Isa SupportedBlockTransposes() { return DetectedIsa(); }

// Runs the block moves for the best instruction set allowed: avx512() or
// avx2() (float only, see above); 0 (no elements moved) where none applies
// or the strides are not dense. The callables take (column_major).
template <typename T, typename Avx512, typename Avx2>
int64_t DispatchBlocks(int64_t rows, int64_t cols, Strides s, const Avx512& avx512,
                       const Avx2& avx2) {
#ifdef BATCHPART_INTERLEAVED_SIMD
  const Order order = DenseOrder(rows, cols, s);
  if (order == Order::kStrided) return 0;
  const bool column_major = order == Order::kColumnMajor;
  switch (BestIsa()) {
    case Isa::kAvx512:
      return avx512(column_major);
    case Isa::kAvx2:
      if constexpr (std::is_same_v<Real<T>, float>) return avx2(column_major);
      break;
    case Isa::kNone:
      break;
  }
#endif
  return 0;
}

template <typename T>
int64_t PackFlat(const T* const* src, int64_t rows, int64_t cols, Strides s, Real<T>* re,
                 Real<T>* im) {
#ifdef BATCHPART_INTERLEAVED_SIMD
  return DispatchBlocks<T>(
      rows, cols, s,
      [&](bool column_major) { return PackAvx512<T>(src, rows, cols, column_major, re, im); },
      [&](bool column_major) { return PackAvx2<T>(src, rows, cols, column_major, re, im); });
#else
  return 0;
#endif
}

template <typename T>
int64_t UnpackFlat(const Real<T>* re, const Real<T>* im, int64_t rows, int64_t cols, Strides s,
                   T* const* dst) {
#ifdef BATCHPART_INTERLEAVED_SIMD
  return DispatchBlocks<T>(
      rows, cols, s,
      [&](bool column_major) { return UnpackAvx512<T>(re, im, rows, cols, column_major, dst); },
      [&](bool column_major) { return UnpackAvx2<T>(re, im, rows, cols, column_major, dst); });
#else
  return 0;
#endif
}

template <int W>
void UnpackIndices(const int32_t* lanes, int64_t rows, int64_t count, int32_t* const* dst) {
  int64_t done = 0;
#ifdef BATCHPART_INTERLEAVED_SIMD
  if (count == W) {
    switch (BestIsa()) {
      case Isa::kAvx512:
        done = UnpackIndicesAvx512<W>(lanes, rows, dst);
        break;
      case Isa::kAvx2:
        done = UnpackIndicesAvx2<W>(lanes, rows, dst);
        break;
      case Isa::kNone:
        break;
    }
  }
#endif
  for (int64_t l = 0; l < count; ++l) {
    int32_t* __restrict out = dst[l];
    for (int64_t i = done; i < rows; ++i) out[i] = lanes[i * W + l];
  }
}

template void UnpackIndices<8>(const int32_t*, int64_t, int64_t, int32_t* const*);
template void UnpackIndices<16>(const int32_t*, int64_t, int64_t, int32_t* const*);

#define BATCHPART_INSTANTIATE(T)                                                              \
  template int64_t PackFlat<T>(const T* const*, int64_t, int64_t, Strides, Real<T>*,          \
                               Real<T>*);                                                     \
  template int64_t UnpackFlat<T>(const Real<T>*, const Real<T>*, int64_t, int64_t, Strides, \
                                 T* const*);
BATCHPART_FOR_EACH_SCALAR(BATCHPART_INSTANTIATE)
#undef BATCHPART_INSTANTIATE

}  // namespace batchpart::lapack::interleaved
