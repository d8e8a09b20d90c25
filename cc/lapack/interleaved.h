// The batch-interleaved layout of the small-matrix kernels (small_*.cc).
//
// For n up to a few dozen, one LAPACK call per matrix costs more in fixed
// overhead (argument checks, blocking decisions, a BLAS call per column) than
// in arithmetic. The small-matrix kernels instead run the unblocked algorithm
// on kLanes<T> matrices at once: a Group holds them side by side, element
// (i, j) of matrix l at [(i * cols + j) * kLanes + l], so every scalar step of
// the algorithm becomes one loop over the lanes, which the compiler turns into
// one SIMD instruction (kLanes is one 512-bit register of the real type: 8
// doubles, 16 floats; AVX2 takes two). A complex matrix is two such planes,
// real and imaginary, so complex arithmetic is real SIMD arithmetic too.
//
// Packing reads each matrix once and unpacking writes it once, so a kernel on
// a group touches its matrices' memory twice, as a memory pass would; the
// group (<= 64 KiB at n = 32) stays in cache in between.
#ifndef BATCHPART_LAPACK_INTERLEAVED_H_
#define BATCHPART_LAPACK_INTERLEAVED_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lapack/lapack_api.h"

namespace batchpart::lapack::interleaved {

// Matrices per group: one 512-bit vector of the real type.
template <typename T>
inline constexpr int kLanes = static_cast<int>(64 / sizeof(Real<T>));

// The kLanes<T> lanes of one element as one vector value (GCC and Clang
// vector extensions), for the kernels compiled per instruction set: its
// arithmetic is one instruction per 512 bits of the clone's instruction set,
// and a few such values stay in registers where arrays of lanes spilled.
// Only inside always-inlined code: passed to a call, a vector's ABI would
// depend on the caller's instruction set.
template <typename T>
struct LaneVector {
  typedef Real<T> type __attribute__((vector_size(64)));
};

template <typename R>
[[gnu::always_inline]] inline typename LaneVector<R>::type LoadLanes(const R* p) {
  typename LaneVector<R>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename R>
[[gnu::always_inline]] inline void StoreLanes(R* p, const typename LaneVector<R>::type& v) {
  std::memcpy(p, &v, sizeof(v));
}

// v as stored, rounded: an optimization barrier, so that the compiler does
// not fuse the operation that made v (a halving, say) into a later
// multiply-add. Where two kernels must give the same bits, each fused
// multiply-add is otherwise the compiler's choice.
template <typename V>
[[gnu::always_inline]] inline V Rounded(V v) {
  __asm__("" : "+m"(v));
  return v;
}

// One interleaved matrix as planes of reals, for the kernels: element
// (i, j)'s W lanes at re + (i * cols + j) * W, and at im for complex T (null
// for real T). W = 1 is one matrix, row-major.
template <typename T, int W = kLanes<T>>
struct Planes {
  using R = Real<T>;
  R* re;
  R* im;
  int64_t cols;
  [[gnu::always_inline]] R* Re(int64_t i, int64_t j) const { return re + (i * cols + j) * W; }
  [[gnu::always_inline]] R* Im(int64_t i, int64_t j) const { return im + (i * cols + j) * W; }
};

// Whether any lane of a lane-vector comparison's result is set: its 64
// bytes OR-ed as words (lane by lane, the compiler extracted each lane on
// its own).
template <typename Mask>
[[gnu::always_inline]] inline bool AnyLane(const Mask& mask) {
  static_assert(sizeof(Mask) == 8 * sizeof(uint64_t));
  uint64_t words[8];
  std::memcpy(words, &mask, sizeof(words));
  return ((words[0] | words[1]) | (words[2] | words[3]) | (words[4] | words[5]) |
          (words[6] | words[7])) != 0;
}

// Where a matrix's element (i, j) lies: data + i * row_stride + j * col_stride
// (column-major n x n: row_stride 1, col_stride n; row-major: the reverse).
struct Strides {
  int64_t row_stride;
  int64_t col_stride;
};

inline Strides ColumnMajor(int64_t rows) { return {1, rows}; }
inline Strides RowMajor(int64_t cols) { return {cols, 1}; }
// A dense rows x cols matrix's strides in either order.
inline Strides Dense(bool row_major, int64_t rows, int64_t cols) {
  return row_major ? RowMajor(cols) : ColumnMajor(rows);
}
// The strides that read the transpose of what s reads.
inline Strides Transposed(Strides s) { return {s.col_stride, s.row_stride}; }

// How a rows x cols matrix with strides s lies in memory.
enum class Order { kColumnMajor, kRowMajor, kStrided };
inline Order DenseOrder(int64_t rows, int64_t cols, Strides s) {
  if (s.row_stride == 1 && s.col_stride == rows) return Order::kColumnMajor;
  if (s.col_stride == 1 && s.row_stride == cols) return Order::kRowMajor;
  return Order::kStrided;
}

// Which path a batched kernel family takes for small matrices, for tests
// that compare both paths and for measurements: kAuto, the switch points
// measured against the per-matrix path (each kernel's source), by size and
// dtype only, so that a matrix gets the same bits in any batch; kAlways,
// the interleaved algorithm at any size (groups, and the one-matrix twins
// for groups of a few, with the same bits); kNever, the per-matrix path.
enum class SmallKernel {
  kCholesky,        // potrf and posv (small_cholesky.h)
  kTriangularSolve, // trsm (small_triangular_solve.h)
  kLu,              // getrf and gesv (small_lu.h)
  kQr,              // qr (small_qr.h)
  kEigh,            // eigh (small_eigh.h)
  kCount,           // the number of kernel families
};
enum class SmallPath { kAuto, kAlways, kNever };

void SetSmallPath(SmallKernel kernel, SmallPath path);
SmallPath GetSmallPath(SmallKernel kernel);

// Whether `kernel` takes the interleaved path: as set, or where that is
// kAuto, `automatic` (the kernel's own switch points).
inline bool UseSmallPath(SmallKernel kernel, bool automatic) {
  switch (GetSmallPath(kernel)) {
    case SmallPath::kAlways:
      return true;
    case SmallPath::kNever:
      return false;
    case SmallPath::kAuto:
      break;
  }
  return automatic;
}

// The sizes at which a kernel takes the interleaved path: where it beat the
// per-matrix path when measured (each kernel's header has its ranges; the
// measurements: docs/benchmarks-small-matrices.md, "Measured switch
// points").
struct SizeRange {
  int64_t min, max;
  bool contains(int64_t n) const { return min <= n && n <= max; }
};
template <typename T>
inline constexpr bool kSingle = sizeof(Real<T>) == 4;

// The instruction sets a block transpose can use, in order.
enum class Isa { kNone, kAvx2, kAvx512 };
// Caps the instruction set of the block transposes (kNone: the element
// loops only) and of the fixed-size LU (small_lu_fixed.h, AVX-512 only),
// for tests that compare the paths and for measurements; the CPU's own
// limit still applies. BlockTransposes() is the one in use,
// SupportedBlockTransposes() the CPU's (and the build's) best.
void SetBlockTransposes(Isa limit);
Isa BlockTransposes();
Isa SupportedBlockTransposes();

// The block-transposing halves of Group::Pack and Group::Unpack for a full
// group (kLanes<T> matrices) of dense matrices (interleaved.cc): they move
// the elements at memory offsets [0, returned), a multiple of kLanes<T>,
// kLanes<T> x kLanes<T> elements at a time in SIMD registers, and return 0
// where the strides are not dense or the compiler has no vector shuffles.
// re and im are a group's planes (im null for real T).
template <typename T>
int64_t PackFlat(const T* const* src, int64_t rows, int64_t cols, Strides s, Real<T>* re,
                 Real<T>* im);
template <typename T>
int64_t UnpackFlat(const Real<T>* re, const Real<T>* im, int64_t rows, int64_t cols, Strides s,
                   T* const* dst);

// Writes int32 lane rows (row i's W lanes at lanes + i * W, as a group of
// kLanes<T> == W keeps its pivots) to per-matrix arrays: dst[l][i] =
// lanes[i * W + l] for i < rows, l < count. A full group moves by block
// transposes, as UnpackFlat; the rest element by element.
template <int W>
void UnpackIndices(const int32_t* lanes, int64_t rows, int64_t count, int32_t* const* dst);

// W matrices of rows x cols in the interleaved layout: re (and im for
// complex T) of rows * cols * W reals each. W = 1 holds one matrix as the
// planes its one-matrix kernels work on.
template <typename T, int Width = kLanes<T>>
class Group {
 public:
  using R = Real<T>;
  static constexpr int W = Width;

  Group(int64_t rows, int64_t cols)
      : rows_(rows), cols_(cols), re_(rows * cols * W), im_(kIsComplex<T> ? rows * cols * W : 0) {}

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // The W lanes of element (i, j).
  R* re(int64_t i, int64_t j) { return re_.data() + (i * cols_ + j) * W; }
  R* im(int64_t i, int64_t j) { return im_.data() + (i * cols_ + j) * W; }
  const R* re(int64_t i, int64_t j) const { return re_.data() + (i * cols_ + j) * W; }
  const R* im(int64_t i, int64_t j) const { return im_.data() + (i * cols_ + j) * W; }

  // Reads matrices src[0..count) (count <= W) into lanes [0, count); lanes
  // may read the same matrix (a broadcast operand). Lanes past count get the
  // identity (zero where not square), which every kernel factors and solves
  // without a failure, so padding lanes never produce NaN or Inf work.
  void Pack(const T* const* src, int64_t count, Strides s) {
    if (W == 1 && PackRows(src[0], s)) return;
    const int64_t done =
        Full(count) ? PackFlat<T>(src, rows_, cols_, s, re_.data(), im_.data()) : 0;
    ForEachElementFrom(done, s, [&](int64_t i, int64_t j) { PackElement(src, count, s, i, j); });
  }

  // As Pack, but for kernels that read only the lower (or upper) triangle
  // and the diagonal; the other triangle holds anything. Element by element
  // this reads half as much; a full group's block transposes read it all
  // faster still.
  void PackTriangle(const T* const* src, int64_t count, Strides s, bool lower) {
    if (W == 1 && PackRows(src[0], s)) return;
    if (Full(count) && DenseOrder(rows_, cols_, s) != Order::kStrided) return Pack(src, count, s);
    for (int64_t i = 0; i < rows_; ++i) {
      const int64_t j_begin = lower ? 0 : i, j_end = lower ? std::min(i + 1, cols_) : cols_;
      for (int64_t j = j_begin; j < j_end; ++j) PackElement(src, count, s, i, j);
    }
  }

  // Writes lanes [0, count) back, lane l to the matrix at dst[l].
  void Unpack(T* const* dst, int64_t count, Strides s) const {
    if (W == 1 && UnpackRows(dst[0], s)) return;
    const int64_t done =
        Full(count) ? UnpackFlat<T>(re_.data(), im_.data(), rows_, cols_, s, dst) : 0;
    ForEachElementFrom(done, s, [&](int64_t i, int64_t j) {
      const R* r = re(i, j);
      [[maybe_unused]] const R* m = kIsComplex<T> ? im(i, j) : nullptr;
      const int64_t offset = i * s.row_stride + j * s.col_stride;
      for (int64_t l = 0; l < count; ++l) {
        if constexpr (kIsComplex<T>) {
          dst[l][offset] = T(r[l], m[l]);
        } else {
          dst[l][offset] = r[l];
        }
      }
    });
  }

 private:
  // One matrix (W = 1) whose rows lie as the planes' (element (i, j) at
  // i * cols + j): its parts copied in one pass, where element by element
  // each took a call and the strides' arithmetic. False, nothing done,
  // for any other layout.
  bool PackRows(const T* src, Strides s) {
    if (DenseOrder(rows_, cols_, s) != Order::kRowMajor) return false;
    for (int64_t e = 0; e < rows_ * cols_; ++e) {
      if constexpr (kIsComplex<T>) {
        re_[e] = src[e].real();
        im_[e] = src[e].imag();
      } else {
        re_[e] = src[e];
      }
    }
    return true;
  }
  bool UnpackRows(T* dst, Strides s) const {
    if (DenseOrder(rows_, cols_, s) != Order::kRowMajor) return false;
    for (int64_t e = 0; e < rows_ * cols_; ++e) {
      if constexpr (kIsComplex<T>) {
        dst[e] = T(re_[e], im_[e]);
      } else {
        dst[e] = re_[e];
      }
    }
    return true;
  }

  // Whether the block transposes move the group: a full group of kLanes<T>.
  static bool Full(int64_t count) { return W == kLanes<T> && count == W; }

  // Calls f(i, j) for every element when first is 0, else for the elements
  // at memory offsets [first, rows * cols) of a dense matrix (the ones the
  // block transposes of PackFlat and UnpackFlat left).
  template <typename F>
  void ForEachElementFrom(int64_t first, Strides s, F f) const {
    if (first == 0) {
      for (int64_t i = 0; i < rows_; ++i) {
        for (int64_t j = 0; j < cols_; ++j) f(i, j);
      }
      return;
    }
    const bool column_major = DenseOrder(rows_, cols_, s) == Order::kColumnMajor;
    for (int64_t o = first; o < rows_ * cols_; ++o) {
      if (column_major) {
        f(o % rows_, o / rows_);
      } else {
        f(o / cols_, o % cols_);
      }
    }
  }

  void PackElement(const T* const* src, int64_t count, Strides s, int64_t i, int64_t j) {
    R* r = re(i, j);
    [[maybe_unused]] R* m = kIsComplex<T> ? im(i, j) : nullptr;
    const int64_t offset = i * s.row_stride + j * s.col_stride;
    const auto read = [&](int64_t l) {
      const T v = src[l][offset];
      if constexpr (kIsComplex<T>) {
        r[l] = v.real();
        m[l] = v.imag();
      } else {
        r[l] = v;
      }
    };
    // A full group (all but a batch's last) needs no padding, and a loop of
    // constant trip count the compiler can unroll.
    if (count == W) {
      for (int l = 0; l < W; ++l) read(l);
      return;
    }
    // The padding first, all lanes at once (a vector store), then the
    // matrices over it: lane by lane, padding is most of the packing of a
    // group that holds a few matrices.
    std::fill_n(r, W, i == j ? R(1) : R(0));
    if constexpr (kIsComplex<T>) std::fill_n(m, W, R(0));
    for (int64_t l = 0; l < count; ++l) read(l);
  }

  int64_t rows_, cols_;
  std::vector<R> re_, im_;
};

}  // namespace batchpart::lapack::interleaved

#endif  // BATCHPART_LAPACK_INTERLEAVED_H_
