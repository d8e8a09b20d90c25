// LAPACK and BLAS entry points, one table per scalar type.
//
// batchpart links against no BLAS: like jaxlib, it takes the function
// pointers that scipy exports from scipy.linalg.cython_lapack and
// scipy.linalg.cython_blas (one PyCapsule per routine) when Python calls
// batchpart._core.lapack.initialize. Until then every pointer is null and the
// kernels answer with an FFI error.
//
// scipy's wrappers use 32-bit `int` for every LAPACK integer and pass
// character options as `char*` without hidden Fortran length arguments; the
// complex types are layout-compatible with std::complex.
#ifndef BATCHPART_LAPACK_LAPACK_API_H_
#define BATCHPART_LAPACK_LAPACK_API_H_

#include <complex>
#include <functional>
#include <string>
#include <type_traits>

namespace batchpart::lapack {

using lapack_int = int;

template <typename T>
struct IsComplex : std::false_type {};
template <typename R>
struct IsComplex<std::complex<R>> : std::true_type {};
template <typename T>
inline constexpr bool kIsComplex = IsComplex<T>::value;

// The real type underlying T (float for std::complex<float>).
template <typename T>
struct RealOf {
  using type = T;
};
template <typename R>
struct RealOf<std::complex<R>> {
  using type = R;
};
template <typename T>
using Real = typename RealOf<T>::type;

// Signatures of the routines the kernels call, for scalar type T. Where the
// real and complex routines differ (syevd vs heevd, gesdd's rwork), the table
// holds the variant that fits T.
template <typename T>
struct Lapack {
  using R = Real<T>;
  using L = lapack_int;
  // RealFn for real T, ComplexFn for complex T.
  template <typename RealFn, typename ComplexFn>
  using ByKind = std::conditional_t<kIsComplex<T>, ComplexFn, RealFn>;

  // Routine<F> points to a routine of type F.
  template <typename F>
  using Routine = F*;

  static inline Routine<void(char* uplo, L* n, T* a, L* lda, L* info)> potrf = nullptr;
  static inline Routine<void(L* m, L* n, T* a, L* lda, L* ipiv, L* info)> getrf = nullptr;
  static inline Routine<void(char* trans, L* n, L* nrhs, T* a, L* lda, L* ipiv, T* b, L* ldb,
                             L* info)>
      getrs = nullptr;
  static inline Routine<void(L* m, L* n, T* a, L* lda, T* tau, T* work, L* lwork, L* info)> geqrf =
      nullptr;
  // orgqr for real T, ungqr for complex T: same argument list.
  static inline Routine<void(L* m, L* n, L* k, T* a, L* lda, T* tau, T* work, L* lwork, L* info)>
      orgqr = nullptr;
  // gelqf and orglq/unglq: the same argument lists as geqrf and orgqr.
  static inline decltype(geqrf) gelqf = nullptr;
  static inline decltype(orgqr) orglq = nullptr;
  // syevd for real T, heevd (with rwork) for complex T.
  static inline Routine<ByKind<void(char* jobz, char* uplo, L* n, T* a, L* lda, R* w, T* work,
                                    L* lwork, L* iwork, L* liwork, L* info),
                               void(char* jobz, char* uplo, L* n, T* a, L* lda, R* w, T* work,
                                    L* lwork, R* rwork, L* lrwork, L* iwork, L* liwork, L* info)>>
      syevd = nullptr;
  static inline Routine<ByKind<void(char* jobz, L* m, L* n, T* a, L* lda, R* s, T* u, L* ldu, T* vt,
                                    L* ldvt, T* work, L* lwork, L* iwork, L* info),
                               void(char* jobz, L* m, L* n, T* a, L* lda, R* s, T* u, L* ldu, T* vt,
                                    L* ldvt, T* work, L* lwork, R* rwork, L* iwork, L* info)>>
      gesdd = nullptr;
  // Routines behind the option targets (option_kernels.h).
  static inline Routine<void(char* uplo, L* n, L* nrhs, T* a, L* lda, T* b, L* ldb, L* info)>
      potrs = nullptr;
  static inline Routine<
      ByKind<void(L* m, L* n, T* a, L* lda, L* jpvt, T* tau, T* work, L* lwork, L* info),
             void(L* m, L* n, T* a, L* lda, L* jpvt, T* tau, T* work, L* lwork, R* rwork, L* info)>>
      geqp3 = nullptr;
  static inline Routine<ByKind<void(char* jobu, char* jobvt, L* m, L* n, T* a, L* lda, R* s, T* u,
                                    L* ldu, T* vt, L* ldvt, T* work, L* lwork, L* info),
                               void(char* jobu, char* jobvt, L* m, L* n, T* a, L* lda, R* s, T* u,
                                    L* ldu, T* vt, L* ldvt, T* work, L* lwork, R* rwork, L* info)>>
      gesvd = nullptr;
  // BLAS.
  static inline Routine<void(char* side, char* uplo, char* transa, char* diag, L* m, L* n, T* alpha,
                             T* a, L* lda, T* b, L* ldb)>
      trsm = nullptr;
};

// Looks a routine up by its scipy name ("dpotrf"); null when absent.
using SymbolLookup = std::function<void*(const std::string& name)>;

// Fills every table from the two lookups. Returns the names of the routines
// it could not find ("" when all were found); when any is missing, nothing is
// stored and the tables stay as they were.
std::string BindLapack(const SymbolLookup& lapack, const SymbolLookup& blas);

// Whether BindLapack has run and found every routine.
bool LapackInitialized();

}  // namespace batchpart::lapack

#endif  // BATCHPART_LAPACK_LAPACK_API_H_
