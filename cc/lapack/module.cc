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
#include "lapack/small_cholesky.h"
#include "lapack/small_lu.h"
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

void SetSmallTrsmMode(const std::string& mode) {
  if (mode == "auto") {
    SetSmallTrsmPolicy(SmallTrsmPolicy::kAuto);
  } else if (mode == "always") {
    SetSmallTrsmPolicy(SmallTrsmPolicy::kAlways);
  } else if (mode == "never") {
    SetSmallTrsmPolicy(SmallTrsmPolicy::kNever);
  } else {
    throw std::invalid_argument("batchpart._core.lapack.set_small_trsm: mode must be 'auto', "
                                "'always' or 'never', not '" + mode + "'");
  }
}

std::string SmallTrsmMode() {
  switch (GetSmallTrsmPolicy()) {
    case SmallTrsmPolicy::kAlways:
      return "always";
    case SmallTrsmPolicy::kNever:
      return "never";
    default:
      return "auto";
  }
}

constexpr std::pair<interleaved::Isa, const char*> kIsaNames[] = {
    {interleaved::Isa::kNone, "none"},
    {interleaved::Isa::kAvx2, "avx2"},
    {interleaved::Isa::kAvx512, "avx512"},
};

std::string IsaName(interleaved::Isa isa) {
  for (const auto& [value, name] : kIsaNames) {
    if (value == isa) return name;
  }
  return "none";
}

void SetBlockTransposes(const std::string& limit) {
  for (const auto& [value, name] : kIsaNames) {
    if (limit == name) return interleaved::SetBlockTransposes(value);
  }
  throw std::invalid_argument(
      "batchpart._core.lapack.set_block_transposes: limit must be 'avx512', 'avx2' or 'none', "
      "not '" + limit + "'");
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
  m.def("set_small_lu", &interleaved::SetSmallLuEnabled, nb::arg("enabled"),
        "Lets getrf and gesv factor batches of small matrices interleaved (default) or forces "
        "them one matrix at a time.");
  m.def("small_lu", &interleaved::SmallLuEnabled);
  m.def(
      "small_lu_sizes",
      [] {
        namespace il = interleaved;
        const auto range = [](il::SizeRange r) { return nb::make_tuple(r.min, r.max); };
        nb::dict sizes;
        // Keyed (target, row_major, single precision); complex types take
        // their real type's ranges.
        sizes[nb::make_tuple("getrf", false, true)] = range(il::kGetrfColumnMajorSizes<float>);
        sizes[nb::make_tuple("getrf", false, false)] = range(il::kGetrfColumnMajorSizes<double>);
        sizes[nb::make_tuple("getrf", true, true)] = range(il::kGetrfRowMajorSizes<float>);
        sizes[nb::make_tuple("getrf", true, false)] = range(il::kGetrfRowMajorSizes<double>);
        sizes[nb::make_tuple("gesv", false, true)] = range(il::kGesvColumnMajorSizes<float>);
        sizes[nb::make_tuple("gesv", false, false)] = range(il::kGesvColumnMajorSizes<double>);
        sizes[nb::make_tuple("gesv", true, true)] = range(il::kGesvRowMajorSizes<float>);
        sizes[nb::make_tuple("gesv", true, false)] = range(il::kGesvRowMajorSizes<double>);
        return sizes;
      },
      "{(target, row_major, single precision): (min n, max n)} that getrf ('getrf') and gesv "
      "('gesv') factor interleaved, for batches of at least small_lu_min_batch().");
  m.def("small_lu_min_batch", [] { return interleaved::kSmallLuMinBatch<float>; });
  m.def("set_blas_thread_control", &SetBlasThreadControl, nb::arg("address"),
        "Address of openblas_set_num_threads_local in the BLAS scipy uses (0 for none).");
  m.def("set_single_threaded_blas", &SetSingleThreadedBlas, nb::arg("always"),
        "Run BLAS single-threaded in every loop, or (default) let serial loops over large "
        "matrices use BLAS threads.");
  m.def("single_threaded_blas", &SingleThreadedBlas);
  m.def("set_small_trsm", &SetSmallTrsmMode, nb::arg("mode"),
        "Which triangular solves take the batch-interleaved small-matrix kernel: 'auto' (the "
        "measured switch, default), 'always' or 'never' (BLAS); for tests and measurements.");
  m.def("small_trsm", &SmallTrsmMode);
  m.def("small_trsm_max_size", &SmallTrsmMaxSize,
        "The largest triangle that 'auto' solves in the interleaved kernel.");
  m.def("set_small_cholesky", &interleaved::SetSmallCholesky, nb::arg("enabled"),
        "Lets potrf and posv factor small matrices batch-interleaved (default) or sends every "
        "batch to LAPACK.");
  m.def("small_cholesky", &interleaved::SmallCholesky);
  m.def(
      "small_cholesky_limits",
      [] {
        return nb::make_tuple(interleaved::SmallCholeskyMaxSize(),
                              interleaved::SmallPosvMaxSize(),
                              interleaved::SmallCholeskyMinBatch());
      },
      "(largest n of potrf, largest n of posv, smallest batch) factored interleaved.");
  m.def("set_block_transposes", &SetBlockTransposes, nb::arg("limit"),
        "Caps the instruction set the small-matrix kernels' packing uses for its block "
        "transposes: 'avx512' (default: the CPU's best), 'avx2', or 'none' (element by "
        "element); for tests and measurements.");
  m.def(
      "block_transposes", [] { return IsaName(interleaved::BlockTransposes()); },
      "The instruction set the block transposes use now.");
  m.def(
      "supported_block_transposes", [] { return IsaName(interleaved::SupportedBlockTransposes()); },
      "The best instruction set this CPU and build give the block transposes.");
  m.def("num_chunks", &NumChunks, nb::arg("batch"), nb::arg("flops_per_element"),
        nb::arg("num_threads"), "How a batch loop would be split (1: serial).");
}

}  // namespace batchpart::lapack
