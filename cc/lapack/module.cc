#include "lapack/module.h"

#include <Python.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <stdexcept>
#include <string>

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
  m.def("num_chunks", &NumChunks, nb::arg("batch"), nb::arg("flops_per_element"),
        nb::arg("num_threads"), "How a batch loop would be split (1: serial).");
}

}  // namespace batchpart::lapack
