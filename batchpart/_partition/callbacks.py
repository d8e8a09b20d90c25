"""XLA's custom-call partitioner callbacks for one derived target name.

Each derived name gets its own callbacks with its description bound, so every
decision is a function of what XLA hands over for that one instruction
(shapes, shardings, backend config) and of that immutable description.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading

from batchpart import _compat as compat
from batchpart._partition import blocks, combine, halo, scan, shard_module, shardings as sh
from batchpart._partition.plan import make_plan
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim

_CACHE_SIZE = 256
_cache_lock = threading.Lock()
# Keyed by everything partition() reads: XLA calls it once per call site, and
# sites that agree on every input get the same answer (compile time of large
# programs). The name carries the attribute rule's content digest, so two
# rules share an entry only where they compute the same.
_cache: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()


def _dims(shapes) -> list[list[int]]:
  return [list(s.dimensions()) for s in shapes]


def partition(name: str, d: CallDescription, rule, arg_shapes, arg_shardings,
              result_shape, result_sharding, backend_config):
  """XLA's ``partition``: the per-device module and the shardings XLA must
  reshard the operands to (and will find the results in)."""
  key = (name, tuple(map(str, arg_shapes)), tuple(map(str, arg_shardings)),
         str(result_shape), str(result_sharding), bytes(backend_config))
  with _cache_lock:
    if key in _cache:
      _cache.move_to_end(key)
      return _cache[key]
  out = _partition(d, rule, arg_shapes, arg_shardings, result_shape, result_sharding,
                   backend_config)
  with _cache_lock:
    _cache[key] = out
    while len(_cache) > _CACHE_SIZE:
      _cache.popitem(last=False)
  return out


def _partition(d, rule, arg_shapes, arg_shardings, result_shape, result_sharding,
               backend_config):
  result_shapes = sh.array_shapes(result_shape)
  plan = make_plan(d, _dims(arg_shapes), arg_shardings, _dims(result_shapes),
                   sh.element_shardings(result_sharding, result_shape))
  if d.callback_partitions:
    return _partition_callback(d, plan, arg_shapes, result_shape, backend_config)
  # Every result carries the full batch shape: its local batch dims are the
  # shard's batch shape.
  local_batch = (plan.result_local_shapes[0][
      d.result_leads[0]:d.result_leads[0] + d.result_batch_ranks[0]]
      if result_shapes else ())
  exchanges = halo.exchanges(d, _dims(result_shapes[:1]), plan.result_shardings,
                             getattr(plan, "halo_tiles", ()))
  module = _local_module(
      d, arg_shapes, result_shapes, backend_config, plan.operand_local_shapes,
      plan.result_local_shapes, batch_shape=local_batch, rule=rule,
      reduce_groups=plan.reduce_groups,
      core_sizes=core_sizes(d, *halo.window_shapes(exchanges, plan.operand_local_shapes,
                                                   plan.result_local_shapes)),
      part_offsets=combine.part_offsets(d.reductions, plan.operand_shardings,
                                        plan.operand_local_shapes),
      exchanges=exchanges,
      carry=scan.carry(d, plan.operand_shardings, getattr(plan, "scan_tiles", ())))
  if plan.passthrough:
    return module, list(arg_shardings), result_sharding
  return (module, [sh.from_planner(s) for s in plan.operand_shardings],
          sh.pack(result_shape, [sh.from_planner(s) for s in plan.result_shardings]))


def _local_module(d: CallDescription, arg_shapes, result_shapes, backend_config,
                  operand_local_shapes, result_local_shapes, **options) -> bytes:
  """The per-device module (``shard_module.build`` with ``options``) on these
  local shapes, with the element types and backend config XLA handed over."""
  return shard_module.build(
      d, operand_shapes=operand_local_shapes,
      operand_dtypes=[s.numpy_dtype() for s in arg_shapes],
      result_shapes=result_local_shapes,
      result_dtypes=[s.numpy_dtype() for s in result_shapes],
      backend_config=backend_config, **options)


def core_sizes(d: CallDescription, operand_shapes, result_shapes) -> dict[str, int]:
  """The size of each named core dim in these (local) shapes."""
  shapes = {"o": operand_shapes, "r": result_shapes}
  return {n.name: int(shapes[n.kind][n.index][absolute_dim(n.axis, len(
      shapes[n.kind][n.index]))]) for n in d.dim_names}


def _partition_callback(d, plan, arg_shapes, result_shape, backend_config):
  """A host callback: every device gets a block of its own (never a
  replicated one) and its block vector (``_vocab/blocks``); with halo dims,
  its windows (``halo``); with a scanned dim, its part and the state the
  part starts in (``scan``)."""
  result_shapes = sh.array_shapes(result_shape)
  b = blocks.plan_blocks(d, plan, _dims(arg_shapes), _dims(result_shapes))
  planner = lambda shardings, shapes: [sh.to_planner(h, len(s))
                                       for h, s in zip(shardings, shapes)]
  tiles = [int(sharding.tile_dims[dim]) if sharding.kind == blocks.TILED else 1
           for sharding in planner(b.result_shardings[:1], b.result_local_shapes[:1])
           for dim in blocks.result_halo_dims(d, 0, len(b.result_local_shapes[0]))]
  module = _local_module(d, arg_shapes, result_shapes, backend_config,
                         b.operand_local_shapes, b.result_local_shapes, batch_shape=(),
                         block_table=b.table, reduce_groups=b.reduce_groups,
                         part_offsets=combine.part_offsets(
                             d.reductions,
                             planner(b.operand_shardings, b.operand_local_shapes),
                             b.operand_local_shapes),
                         exchanges=halo.exchanges(
                             d, _dims(result_shapes[:1]),
                             planner(b.result_shardings, b.result_local_shapes), tiles),
                         carry=scan.carry(
                             d, planner(b.operand_shardings, b.operand_local_shapes),
                             b.scan_tiles))
  return module, b.operand_shardings, sh.pack(result_shape, b.result_shardings)


def _never_raise(callback):
  """XLA aborts the process when GSPMD's propagation callbacks raise; only
  partition() may report an error. On any error these callbacks give no
  preference (replicated), and partition() raises the real error cleanly."""
  @functools.wraps(callback)
  def safe(d, *args):
    try:
      return callback(d, *args)
    except Exception:  # noqa: BLE001 - any failure must not reach XLA here
      return sh.replicated_like(args[-2])
  return safe


@_never_raise
def infer_sharding_from_operands(d: CallDescription, arg_shapes, arg_shardings,
                                 result_shape, backend_config):
  """GSPMD's forward propagation: the results' sharding the plan gives."""
  del backend_config
  result_shapes = sh.array_shapes(result_shape)
  # Propagation may make this a jit output's sharding, which jax must express
  # on its mesh: no split mesh axes.
  plan = make_plan(d, _dims(arg_shapes), arg_shardings, _dims(result_shapes),
                   split_axes=False)
  if plan.passthrough:
    return sh.pack(result_shape, [compat.HloSharding.manual()] * len(result_shapes))
  return sh.pack(result_shape, [sh.from_planner(s) for s in plan.result_shardings])


@_never_raise
def propagate_user_sharding(d: CallDescription, user_sharding, result_shape,
                            backend_config):
  """GSPMD's backward propagation: the users' batch sharding, core dims
  whole. The results stand in for the operands (they carry the full batch
  shape), so the plan reads the users' shardings as the call's own."""
  del backend_config
  result_shapes = _dims(sh.array_shapes(result_shape))
  as_operands = CallDescription(
      target=d.target, operand_batch_ranks=d.result_batch_ranks,
      result_batch_ranks=d.result_batch_ranks, operand_layouts=d.result_layouts,
      result_layouts=d.result_layouts, operand_lead_ranks=d.result_lead_ranks,
      result_lead_ranks=d.result_lead_ranks,
      halos=tuple(dataclasses.replace(h, operand_dims=h.result_dims) for h in d.halos),
      scans=tuple(dataclasses.replace(t, operand_dims=t.result_dims, state=(t.state[1],) * 2)
                  for t in d.scans if t.result_dims))
  plan = make_plan(as_operands, result_shapes,
                   sh.element_shardings(user_sharding, result_shape), result_shapes,
                   split_axes=False)
  if plan.passthrough:
    return user_sharding
  return sh.pack(result_shape, [sh.from_planner(s) for s in plan.result_shardings])


def register(name: str, d: CallDescription, rule) -> None:
  """Registers the callbacks of derived name ``name`` with ``d`` and the
  per-shard attribute ``rule`` (or None) bound: the function object itself,
  never looked up by name."""
  compat.register_partitioner(
      name,
      propagate_user_sharding=functools.partial(propagate_user_sharding, d),
      partition=functools.partial(partition, name, d, rule),
      infer_sharding_from_operands=functools.partial(infer_sharding_from_operands, d),
  )
