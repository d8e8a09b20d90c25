// The batchpart._core extension: the partition planner and the FFI handlers
// (as PyCapsules for jax.ffi.register_ffi_target).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/capsules.h"
#include "lapack/module.h"  // LAPACK kernels
#include "partition/planner.h"
#include "testing/test_kernels.h"

namespace nb = nanobind;
namespace bp = batchpart::partition;

namespace {

void BindPlanner(nb::module_& m) {
  nb::class_<bp::Sharding> sharding(m, "Sharding");
  nb::enum_<bp::Sharding::Kind>(sharding, "Kind")
      .value("REPLICATED", bp::Sharding::Kind::kReplicated)
      .value("TILED", bp::Sharding::Kind::kTiled)
      .value("MANUAL", bp::Sharding::Kind::kManual)
      .value("MAXIMAL", bp::Sharding::Kind::kMaximal);
  nb::enum_<bp::Sharding::Subgroup>(sharding, "Subgroup")
      .value("REPLICATED", bp::Sharding::Subgroup::kReplicated)
      .value("MANUAL", bp::Sharding::Subgroup::kManual);
  sharding.def(nb::init<>())
      .def_rw("kind", &bp::Sharding::kind)
      .def_rw("tile_dims", &bp::Sharding::tile_dims)
      .def_rw("subgroup_dims", &bp::Sharding::subgroup_dims)
      .def_rw("subgroup_kinds", &bp::Sharding::subgroup_kinds)
      .def_rw("devices", &bp::Sharding::devices)
      .def("num_tiles", &bp::Sharding::NumTiles)
      .def("__repr__", &bp::Sharding::ToString);

  nb::class_<bp::Problem>(m, "Problem")
      .def(nb::init<>())
      .def_rw("operand_shapes", &bp::Problem::operand_shapes)
      .def_rw("operand_batch_ranks", &bp::Problem::operand_batch_ranks)
      .def_rw("operand_shardings", &bp::Problem::operand_shardings)
      .def_rw("result_shapes", &bp::Problem::result_shapes)
      .def_rw("result_batch_ranks", &bp::Problem::result_batch_ranks)
      .def_rw("result_shardings", &bp::Problem::result_shardings)
      .def_rw("rebatch", &bp::Problem::rebatch)
      .def_rw("split_axes", &bp::Problem::split_axes)
      .def_rw("operand_reduced_dims", &bp::Problem::operand_reduced_dims)
      .def_rw("result_reduced_dims", &bp::Problem::result_reduced_dims)
      .def_rw("reduced_min_parts", &bp::Problem::reduced_min_parts);

  nb::class_<bp::Plan>(m, "Plan")
      .def_ro("operand_shardings", &bp::Plan::operand_shardings)
      .def_ro("result_shardings", &bp::Plan::result_shardings)
      .def_ro("operand_local_shapes", &bp::Plan::operand_local_shapes)
      .def_ro("result_local_shapes", &bp::Plan::result_local_shapes)
      .def_ro("batch_shape", &bp::Plan::batch_shape)
      .def_ro("batch_tiles", &bp::Plan::batch_tiles)
      .def_ro("replication", &bp::Plan::replication)
      .def_ro("passthrough", &bp::Plan::passthrough)
      .def_ro("reduce_groups", &bp::Plan::reduce_groups)
      .def_ro("reduce_tiles", &bp::Plan::reduce_tiles)
      .def_ro("uneven_reductions", &bp::Plan::uneven_reductions);

  // std::invalid_argument becomes ValueError.
  m.def("make_plan", &bp::MakePlan, nb::arg("problem"),
        "Plans the shardings of one batch-partitionable call.");
  m.def("broadcast_batch_shape", &bp::BroadcastBatchShape, nb::arg("shapes"),
        nb::arg("batch_ranks"));
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "batchpart's compiled core: partition planner and FFI kernels.";
  BindPlanner(m);
  batchpart::lapack::DefineLapackSubmodule(m);  // LAPACK kernels

  nb::module_ testing = m.def_submodule("testing", "Kernels for batchpart's tests.");
  testing.def("handlers",
              [] { return batchpart::HandlerCapsules(batchpart::testing::Handlers()); });
  testing.def("batch_elements_processed", &batchpart::testing::BatchElementsProcessed);
  testing.def("reset_batch_elements_processed", &batchpart::testing::ResetBatchElementsProcessed);
  testing.def("counted_sum", &batchpart::testing::CountedSum);
  testing.def("stateful_offset_type", [] {
    using batchpart::testing::StatefulOffset;
    nb::dict out;
    out["type_id"] = nb::capsule(reinterpret_cast<void*>(&StatefulOffset::id));
    out["type_info"] = nb::capsule(
        const_cast<void*>(reinterpret_cast<const void*>(&StatefulOffset::info)));
    return out;
  });
}
