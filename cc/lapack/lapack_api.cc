#include "lapack/lapack_api.h"

#include <atomic>
#include <complex>
#include <functional>
#include <string>
#include <vector>

#include "lapack/scalar_types.h"

namespace batchpart::lapack {
namespace {

// Set (with release order) after every pointer is stored, so a kernel that
// reads it with acquire order sees complete tables.
std::atomic<bool> g_initialized{false};

// LAPACK's one-letter type prefix for T.
template <typename T>
constexpr char Prefix() {
  if constexpr (std::is_same_v<T, float>) return 's';
  if constexpr (std::is_same_v<T, double>) return 'd';
  if constexpr (std::is_same_v<T, std::complex<float>>) return 'c';
  if constexpr (std::is_same_v<T, std::complex<double>>) return 'z';
}

// Lookups are collected first and stored only when all succeeded, so that a
// failed initialize() leaves the tables as they were.
struct Binder {
  std::vector<std::function<void()>> stores;
  std::string missing;

  // Queues storing the routine `prefix + stem` in `slot`, or records it as
  // missing.
  template <typename Fn>
  void Add(const SymbolLookup& lookup, char prefix, const char* stem, Fn*& slot) {
    const std::string name = std::string(1, prefix) + stem;
    Fn* fn = reinterpret_cast<Fn*>(lookup(name));
    if (fn == nullptr) {
      missing += (missing.empty() ? "" : ", ") + name;
    } else {
      stores.push_back([&slot, fn] { slot = fn; });
    }
  }
};

template <typename T>
void BindType(const SymbolLookup& lapack, const SymbolLookup& blas, Binder& binder) {
  using Table = Lapack<T>;
  constexpr char p = Prefix<T>();
  binder.Add(lapack, p, "potrf", Table::potrf);
  binder.Add(lapack, p, "getrf", Table::getrf);
  binder.Add(lapack, p, "getrs", Table::getrs);
  binder.Add(lapack, p, "geqrf", Table::geqrf);
  binder.Add(lapack, p, kIsComplex<T> ? "ungqr" : "orgqr", Table::orgqr);
  binder.Add(lapack, p, "gelqf", Table::gelqf);
  binder.Add(lapack, p, kIsComplex<T> ? "unglq" : "orglq", Table::orglq);
  binder.Add(lapack, p, kIsComplex<T> ? "heevd" : "syevd", Table::syevd);
  binder.Add(lapack, p, "gesdd", Table::gesdd);
  binder.Add(lapack, p, "potrs", Table::potrs);
  binder.Add(lapack, p, "geqp3", Table::geqp3);
  binder.Add(lapack, p, "gesvd", Table::gesvd);
  binder.Add(blas, p, "trsm", Table::trsm);
}

}  // namespace

std::string BindLapack(const SymbolLookup& lapack, const SymbolLookup& blas) {
  Binder binder;
  ForEachScalarType([&](auto tag) {
    BindType<typename decltype(tag)::type>(lapack, blas, binder);
  });
  if (!binder.missing.empty()) return binder.missing;
  for (const auto& store : binder.stores) store();
  g_initialized.store(true, std::memory_order_release);
  return "";
}

bool LapackInitialized() { return g_initialized.load(std::memory_order_acquire); }

}  // namespace batchpart::lapack
