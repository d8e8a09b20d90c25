"""XLA's SPMD partitioner: registering custom-call partitioners, jaxlib's
``HloSharding``, and whether (and over how many devices) XLA will partition
the op being lowered.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.lib.xla_client``: ``register_custom_call_partitioner``,
  ``HloSharding``, ``OpSharding.Type`` and the shape types the partitioner's
  callbacks receive.
- ``jax._src.xla_bridge.register_plugin_callbacks``: partitioners on PJRT
  plugins (CUDA), including plugins discovered later.
- a lowering's axis context (``ShardingContext`` / ``SPMDAxisContext``): its
  device count, and inside ``shard_map`` its mesh and manual axes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from jax._src import xla_bridge
from jax._src.lib import xla_client as xla_client

HloSharding = xla_client.HloSharding
OpShardingType = xla_client.OpSharding.Type


def register_partitioner(name: str, *, propagate_user_sharding: Callable,
                         partition: Callable,
                         infer_sharding_from_operands: Callable) -> None:
  """Registers callbacks for ``name`` on the CPU client and every PJRT plugin,
  including plugins discovered later."""
  register = functools.partial(
      xla_client.register_custom_call_partitioner,
      name,
      propagate_user_sharding,
      partition,
      infer_sharding_from_operands,
      True,  # can_side_effecting_have_replicated_sharding
  )
  register()
  xla_bridge.register_plugin_callbacks(lambda c_api: register(c_api=c_api))


def _mesh_and_manual_axes(ctx):
  """The mesh of a lowering inside ``shard_map`` (None elsewhere) and its
  manual axes."""
  axis_context = ctx.module_context.axis_context
  return (getattr(axis_context, "mesh", None),
          frozenset(getattr(axis_context, "manual_axes", frozenset())))


def is_manual_lowering(ctx) -> bool:
  """Whether the op is lowered inside a fully manual region (shard_map)."""
  mesh, manual = _mesh_and_manual_axes(ctx)
  return bool(mesh is not None and manual and frozenset(mesh.axis_names) <= manual)


def is_partially_manual_lowering(ctx) -> bool:
  """Whether the op is lowered in a ``shard_map`` over some mesh axes only
  (the others automatic)."""
  mesh, manual = _mesh_and_manual_axes(ctx)
  return bool(mesh is not None and manual and not frozenset(mesh.axis_names) <= manual)


def num_partitions(ctx) -> int:
  """How many partitions (devices) the program being lowered has."""
  mesh, _ = _mesh_and_manual_axes(ctx)
  if mesh is not None:
    return int(mesh.size)
  return int(getattr(ctx.module_context.axis_context, "num_devices", 1))


def xla_partitions(ctx) -> bool:
  """Whether XLA's SPMD partitioner will partition the ops being lowered:
  more than one device, outside a fully manual region. Elsewhere (one
  device, inside ``shard_map`` over every mesh axis) an op runs as lowered."""
  return num_partitions(ctx) > 1 and not is_manual_lowering(ctx)
