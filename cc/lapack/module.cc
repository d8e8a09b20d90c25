#include "lapack/module.h"

#include <Python.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/capsules.h"
#include "lapack/batch_loop.h"
#include "lapack/kernels.h"
#include "lapack/lapack_api.h"
#include "lapack/option_kernels.h"
#include "lapack/scalar_types.h"
#include "lapack/small_cholesky.h"
#include "lapack/small_eigh.h"
#include "lapack/small_lu.h"
#include "lapack/small_qr.h"
#include "lapack/small_triangular_solve.h"

namespace nb = nanobind;

namespace batchpart::lapack {
namespace {

// Finds `name` in a Cython __pyx_capi__ dict: a PyCapsule whose name is the
// routine's C signature, so the pointer is fetched under that same name.
void* CapsulePointer(const nb::dict& capi, const std::string& name) {
  if (!capi.contains(name.c_str())) return nullptr;
  PyObject* capsule = nb::object(capi[name.c_str()]).ptr();
  if (!PyCapsule_CheckExact(capsule)) return nullptr;
  void* pointer = PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule));
  if (pointer == nullptr) PyErr_Clear();
  return pointer;
}

void Initialize(const nb::dict& lapack_capi, const nb::dict& blas_capi) {
  const std::string missing =
      BindLapack([&](const std::string& name) { return CapsulePointer(lapack_capi, name); },
                 [&](const std::string& name) { return CapsulePointer(blas_capi, name); });
  if (!missing.empty()) {
    throw std::invalid_argument("batchpart._core.lapack.initialize: routines not found: " +
                                missing);
  }
}

// Takes the address of OpenBLAS's openblas_set_num_threads_local (0: none).
void SetBlasThreadControl(uintptr_t address) {
  SetLocalBlasThreadsFunction(reinterpret_cast<SetLocalBlasThreadsFn>(address));
}

// The names of SetSmallPath's kernel families and paths, as Python gives them.
constexpr std::pair<interleaved::SmallKernel, const char*> kSmallKernelNames[] = {
    {interleaved::SmallKernel::kCholesky, "cholesky"},
    {interleaved::SmallKernel::kTriangularSolve, "triangular_solve"},
    {interleaved::SmallKernel::kLu, "lu"},
    {interleaved::SmallKernel::kQr, "qr"},
    {interleaved::SmallKernel::kEigh, "eigh"},
};
constexpr std::pair<interleaved::SmallPath, const char*> kSmallPathNames[] = {
    {interleaved::SmallPath::kAuto, "auto"},
    {interleaved::SmallPath::kAlways, "always"},
    {interleaved::SmallPath::kNever, "never"},
};

// The value named `name` in `table`, or a ValueError naming `what` and the choices.
template <typename Value, size_t N>
Value Named(const std::pair<Value, const char*> (&table)[N], const std::string& name,
            const char* what) {
  std::string choices;
  for (const auto& [value, entry] : table) {
    if (name == entry) return value;
    choices += std::string(choices.empty() ? "'" : ", '") + entry + "'";
  }
  throw std::invalid_argument(std::string("batchpart._core.lapack.") + what + " must be one of " +
                              choices + ", not '" + name + "'");
}

template <typename Value, size_t N>
std::string NameOf(const std::pair<Value, const char*> (&table)[N], Value value) {
  for (const auto& [entry, name] : table) {
    if (entry == value) return name;
  }
  return "?";
}

void SetSmallPath(const std::string& kernel, const std::string& path) {
  interleaved::SetSmallPath(Named(kSmallKernelNames, kernel, "set_small_path: kernel"),
                            Named(kSmallPathNames, path, "set_small_path: path"));
}

std::string SmallPathOf(const std::string& kernel) {
  return NameOf(kSmallPathNames,
                interleaved::GetSmallPath(Named(kSmallKernelNames, kernel, "small_path: kernel")));
}

constexpr std::pair<interleaved::Isa, const char*> kIsaNames[] = {
    {interleaved::Isa::kNone, "none"},
    {interleaved::Isa::kAvx2, "avx2"},
    {interleaved::Isa::kAvx512, "avx512"},
};

// A switch-point table's entry as Python sees it: (min, max).
nb::tuple Range(interleaved::SizeRange r) { return nb::make_tuple(r.min, r.max); }

// Sets table[(prefix..., complex, single precision)] = value(TypeTag<T>{}) for
// each scalar type T: the key every per-dtype table Python reads ends with.
template <typename Fn, typename... Prefix>
void AddByScalarType(nb::dict& table, const Fn& value, const Prefix&... prefix) {
  ForEachScalarType([&](auto tag) {
    using T = typename decltype(tag)::type;
    table[nb::make_tuple(prefix..., kIsComplex<T>, interleaved::kSingle<T>)] = value(tag);
  });
}

void SetBlockTransposes(const std::string& limit) {
  interleaved::SetBlockTransposes(Named(kIsaNames, limit, "set_block_transposes: limit"));
}

}  // namespace

void DefineLapackSubmodule(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("lapack", "CPU LAPACK kernels (typed XLA FFI handlers).");
  m.def("initialize", &Initialize, nb::arg("lapack_capi"), nb::arg("blas_capi"),
        "Takes LAPACK/BLAS function pointers from scipy.linalg.cython_lapack.__pyx_capi__ and "
        "scipy.linalg.cython_blas.__pyx_capi__. Raises ValueError if a routine is missing.");
  m.def("initialized", &LapackInitialized);
  m.def(
      "handlers", [] { return HandlerCapsules(Handlers()); },
      "{target name: XLA FFI handler capsule}, one per target of the CPU registration table");
  m.def("set_intra_op_parallelism", &SetIntraOpParallelism, nb::arg("enabled"),
        "Lets batch loops use XLA's intra-op thread pool (default) or forces them serial.");
  m.def("intra_op_parallelism", &IntraOpParallelism);
  m.def("set_small_path", &SetSmallPath, nb::arg("kernel"), nb::arg("path"),
        "Which path a kernel family ('cholesky': potrf and posv; 'triangular_solve': trsm; "
        "'lu': getrf and gesv; 'qr'; 'eigh') takes for small matrices: 'auto' (the measured "
        "switch points, by size and dtype, default), 'always' (the batch-interleaved "
        "algorithm at any size) or 'never' (one LAPACK call per matrix); for tests and "
        "measurements.");
  m.def("small_path", &SmallPathOf, nb::arg("kernel"), "The path set_small_path set.");
  m.def(
      "small_lu_sizes",
      [] {
        namespace il = interleaved;
        nb::dict sizes;
        // Keyed (target, row_major, single precision); complex types take
        // their real type's ranges.
        sizes[nb::make_tuple("getrf", false, true)] = Range(il::kGetrfColumnMajorSizes<float>);
        sizes[nb::make_tuple("getrf", false, false)] = Range(il::kGetrfColumnMajorSizes<double>);
        sizes[nb::make_tuple("getrf", true, true)] = Range(il::kGetrfRowMajorSizes<float>);
        sizes[nb::make_tuple("getrf", true, false)] = Range(il::kGetrfRowMajorSizes<double>);
        sizes[nb::make_tuple("gesv", false, true)] = Range(il::kGesvColumnMajorSizes<float>);
        sizes[nb::make_tuple("gesv", false, false)] = Range(il::kGesvColumnMajorSizes<double>);
        sizes[nb::make_tuple("gesv", true, true)] = Range(il::kGesvRowMajorSizes<float>);
        sizes[nb::make_tuple("gesv", true, false)] = Range(il::kGesvRowMajorSizes<double>);
        return sizes;
      },
      "{(target, row_major, single precision): (min n, max n)} that getrf ('getrf') and gesv "
      "('gesv') factor interleaved (small_lu.h), in any batch.");
  m.def(
      "small_qr_sizes",
      [] {
        namespace il = interleaved;
        nb::dict sizes;
        for (const bool row_major : {false, true}) {
          AddByScalarType(
              sizes,
              [&](auto tag) {
                using T = typename decltype(tag)::type;
                return Range(row_major ? il::kQrRowMajorSizes<T> : il::kQrColumnMajorSizes<T>);
              },
              row_major);
        }
        return sizes;
      },
      "{(row_major, complex, single precision): (min, max)} of max(m, n) that the qr targets "
      "factor interleaved (small_qr.h), in any batch.");
  m.def(
      "small_eigh_sizes",
      [] {
        nb::dict sizes;
        AddByScalarType(sizes, [](auto tag) {
          return Range(interleaved::kEighSizes<typename decltype(tag)::type>);
        });
        return sizes;
      },
      "{(complex, single precision): (min n, max n)} that batchpart_eigh decomposes "
      "interleaved (small_eigh.h), in any batch.");
  m.def("set_blas_thread_control", &SetBlasThreadControl, nb::arg("address"),
        "Address of openblas_set_num_threads_local in the BLAS scipy uses (0 for none).");
  m.def(
      "small_trsm_max_sizes",
      [] {
        nb::dict sizes;
        AddByScalarType(sizes,
                        [](auto tag) { return SmallTrsmMaxSize<typename decltype(tag)::type>(); });
        return sizes;
      },
      "{(complex, single precision): the largest triangle 'auto' solves interleaved}.");
  m.def(
      "small_cholesky_limits",
      [] {
        return nb::make_tuple(interleaved::SmallCholeskyMaxSize(), interleaved::SmallPosvMaxSize(),
                              interleaved::SmallCholeskyMinGroup());
      },
      "(largest n of potrf, largest n of posv, fewest matrices in a group) factored "
      "interleaved; smaller groups factor one matrix at a time, with the same bits.");
  m.def("set_block_transposes", &SetBlockTransposes, nb::arg("limit"),
        "Caps the instruction set of the small-matrix kernels' hand-vectorized paths: the "
        "packing's block transposes and, at 'avx512' only, the fixed-size LU and solve. "
        "'avx512' (default: the CPU's best), 'avx2', or 'none' (element by element); for "
        "tests and measurements.");
  m.def(
      "block_transposes", [] { return NameOf(kIsaNames, interleaved::BlockTransposes()); },
      "The instruction set the block transposes use now.");
  m.def(
      "supported_block_transposes",
      [] { return NameOf(kIsaNames, interleaved::SupportedBlockTransposes()); },
      "The best instruction set this CPU and build give the block transposes.");
  m.def("num_chunks", &NumChunks, nb::arg("batch"), nb::arg("flops_per_element"),
        nb::arg("num_threads"), "How a batch loop would be split (1: serial).");
}

}  // namespace batchpart::lapack
