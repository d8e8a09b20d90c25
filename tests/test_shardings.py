"""Sharding conversion: jaxlib's HloSharding <-> the planner's Sharding."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from batchpart import _compat, _core
from batchpart._partition import shardings

H = _compat.HloSharding
Kind = _core.Sharding.Kind
Subgroup = _core.Sharding.Subgroup
MANUAL, REPLICATED = _compat.OpShardingType.MANUAL, _compat.OpShardingType.REPLICATED


def test_replicated_and_absent():
  for sharding in (None, H.replicate()):
    planned = shardings.to_planner(sharding, 2)
    assert planned.kind == Kind.REPLICATED
    assert shardings.from_planner(planned) == H.replicate()


def test_manual():
  planned = shardings.to_planner(H.manual(), 3)
  assert planned.kind == Kind.MANUAL
  assert shardings.from_planner(planned) == H.manual()


def test_maximal_keeps_its_device_and_is_never_planned():
  planned = shardings.to_planner(H.from_string("{maximal device=3}"), 2)
  assert planned.kind == Kind.MAXIMAL and list(planned.devices) == [3]
  with pytest.raises(ValueError, match="maximal"):
    shardings.from_planner(planned)


def test_tiled():
  planned = shardings.to_planner(H.iota_tile([4, 2]), 2)
  assert planned.kind == Kind.TILED
  assert list(planned.tile_dims) == [4, 2] and list(planned.subgroup_dims) == []
  assert list(planned.devices) == list(range(8))
  assert shardings.from_planner(planned) == H.iota_tile([4, 2])


def test_last_tile_dim_replicate():
  # the second tile on devices 0-3: order across tiles is kept (within a
  # replicated group XLA sorts it)
  devices = np.array([4, 5, 6, 7, 0, 1, 2, 3]).reshape(2, 1, 4)
  hlo = H.subgroup_with_device_ordering(devices, subgroup_types=[REPLICATED])
  assert hlo.replicate_on_last_tile_dim()
  planned = shardings.to_planner(hlo, 2)
  assert list(planned.tile_dims) == [2, 1] and list(planned.subgroup_dims) == [4]
  assert list(planned.subgroup_kinds) == [Subgroup.REPLICATED]
  assert list(planned.devices) == devices.ravel().tolist()
  back = shardings.from_planner(planned)
  assert shardings.to_planner(back, 2).devices == planned.devices
  assert back.tile_assignment_dimensions() == [2, 1, 4]


def test_manual_and_replicated_subgroups():
  hlo = H.subgroup_with_device_ordering(np.arange(8).reshape(2, 2, 2),
                                        subgroup_types=[MANUAL, REPLICATED])
  planned = shardings.to_planner(hlo, 1)
  assert list(planned.subgroup_kinds) == [Subgroup.MANUAL, Subgroup.REPLICATED]
  assert shardings.from_planner(planned) == hlo


def test_rank_mismatch_is_an_error():
  with pytest.raises(ValueError, match="rank 3"):
    shardings.to_planner(H.iota_tile([4, 2]), 3)


@given(st.permutations(range(8)), st.sampled_from([(8,), (4, 2), (2, 2, 2), (1, 8)]),
       st.lists(st.sampled_from([MANUAL, REPLICATED]), max_size=1))
def test_round_trip(order, dims, subgroups):
  tiles = dims[:len(dims) - len(subgroups)] if subgroups else dims
  if not tiles:
    return
  hlo = H.subgroup_with_device_ordering(np.array(order).reshape(dims),
                                        subgroup_types=subgroups)
  rank = len(tiles)
  planned = shardings.to_planner(hlo, rank)
  again = shardings.to_planner(shardings.from_planner(planned), rank)
  assert (again.kind, list(again.tile_dims), list(again.subgroup_dims),
          list(again.devices)) == (planned.kind, list(planned.tile_dims),
                                   list(planned.subgroup_dims), list(planned.devices))


def test_tuple_helpers():
  shape = _compat.xla_client.Shape.tuple_shape([
      _compat.xla_client.Shape.array_shape(np.dtype(np.float32), (4, 2)),
      _compat.xla_client.Shape.array_shape(np.dtype(np.int32), (4,))])
  assert len(shardings.array_shapes(shape)) == 2
  assert shardings.element_shardings(None, shape) == [None, None]
  tile = H.iota_tile([4, 1])
  packed = shardings.pack(shape, [tile, H.iota_tile([4])])
  assert shardings.element_shardings(packed, shape) == [tile, H.iota_tile([4])]
  assert shardings.element_shardings(tile, shape) == [tile, tile]
  assert shardings.replicated_like(shape).tuple_elements() == [H.replicate()] * 2
