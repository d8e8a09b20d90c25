"""jaxlib's ``HloSharding`` <-> the planner's plain ``Sharding``."""

from __future__ import annotations

import numpy as np

from batchpart import _compat as compat, _core

HloSharding = compat.HloSharding
_Kind = _core.Sharding.Kind
_Subgroup = _core.Sharding.Subgroup
_OpType = compat.OpShardingType


def to_planner(sharding, rank: int) -> _core.Sharding:
  """The planner's view of one array's sharding (None: replicated)."""
  out = _core.Sharding()
  if sharding is None or sharding.is_replicated():
    return out
  if sharding.is_manual():
    out.kind = _Kind.MANUAL
    return out
  if sharding.is_maximal():
    out.kind = _Kind.MAXIMAL
    out.devices = list(sharding.tile_assignment_devices())[:1]
    return out
  if not sharding.is_tiled():
    raise ValueError(f"unsupported sharding {sharding}")
  dims = list(sharding.tile_assignment_dimensions())
  if sharding.replicate_on_last_tile_dim():
    kinds = [_Subgroup.REPLICATED]
  else:
    kinds = [_Subgroup.MANUAL if t == _OpType.MANUAL else _Subgroup.REPLICATED
             for t in sharding.subgroup_types()]
  if len(dims) - len(kinds) != rank:
    raise ValueError(f"sharding {sharding} does not fit an array of rank {rank}")
  return tiled(dims[:rank], dims[rank:], kinds, sharding.tile_assignment_devices())


def tiled(tile_dims, subgroup_dims, subgroup_kinds, devices) -> _core.Sharding:
  """A tiled planner sharding (``devices`` in the order of tile dims then
  subgroup dims)."""
  out = _core.Sharding()
  out.kind = _Kind.TILED
  out.tile_dims = list(tile_dims)
  out.subgroup_dims = list(subgroup_dims)
  out.subgroup_kinds = list(subgroup_kinds)
  out.devices = [int(v) for v in devices]
  return out


def from_planner(sharding: _core.Sharding):
  """The HloSharding of a planned array sharding."""
  if sharding.kind == _Kind.REPLICATED:
    return HloSharding.replicate()
  if sharding.kind == _Kind.MANUAL:
    return HloSharding.manual()
  if sharding.kind == _Kind.MAXIMAL:
    raise ValueError("the planner never plans a maximal sharding")
  types = [_OpType.MANUAL if k == _Subgroup.MANUAL else _OpType.REPLICATED
           for k in sharding.subgroup_kinds]
  return HloSharding.subgroup_with_device_ordering(device_grid(sharding),
                                                   subgroup_types=types)


def device_grid(sharding: _core.Sharding) -> np.ndarray:
  """A tiled planned sharding's devices as an int64 array of its tile dims
  followed by its subgroup dims."""
  return np.asarray(sharding.devices, dtype=np.int64).reshape(
      list(sharding.tile_dims) + list(sharding.subgroup_dims))


def array_shapes(shape) -> list:
  """The array shapes of a possibly-tuple XLA shape."""
  return list(shape.tuple_shapes()) if shape.is_tuple() else [shape]


def element_shardings(sharding, shape) -> list:
  """Per-array shardings of a possibly-tuple result (None: no proposal)."""
  if shape.is_tuple():
    n = len(shape.tuple_shapes())
    if sharding is None:
      return [None] * n
    elements = sharding.tuple_elements()
    return list(elements) if elements else [sharding] * n
  return [sharding]


def pack(shape, shardings):
  """One sharding for a possibly-tuple result."""
  if shape.is_tuple():
    return HloSharding.tuple_sharding(shape, list(shardings))
  return shardings[0]


def replicated_like(shape):
  return pack(shape, [HloSharding.replicate()] * len(array_shapes(shape)))
