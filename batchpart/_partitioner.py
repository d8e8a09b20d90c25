"""XLA's custom-call partitioner callbacks for batch-partitionable targets.

XLA hands the callbacks the global shapes, the shardings it proposes and the
call's backend config, but not the frontend attributes: what is batch and
what is core comes from the record each lowering leaves here, keyed by the
target and the global operand and result types.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings

import numpy as np

from batchpart import _core
from batchpart import _jax_adapter as adapter


@dataclasses.dataclass(frozen=True)
class CallRecord:
  """What the per-shard module must restate about one lowered call."""
  operand_batch_ranks: tuple[int, ...]
  result_batch_ranks: tuple[int, ...]
  operand_layouts: tuple[tuple[int, ...], ...]
  result_layouts: tuple[tuple[int, ...], ...]
  aliases: tuple[tuple[int, int], ...]
  has_side_effect: bool
  api_version: int


BATCH_RANKS_ATTRIBUTE = "batchpart_batch_ranks"


def format_batch_ranks(operand_batch_ranks, result_batch_ranks) -> str:
  """E.g. "1,0->1,1": the batch ranks of the operands and of the results."""
  return (",".join(map(str, operand_batch_ranks)) + "->" +
          ",".join(map(str, result_batch_ranks)))


def parse_batch_ranks(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
  ins, outs = text.split("->")
  ranks = lambda part: tuple(int(r) for r in part.split(",") if r.strip())
  return ranks(ins), ranks(outs)


_lock = threading.Lock()
# (target, operand types, result types, backend config) -> records, oldest
# first. A dict keeps insertion order; re-recording moves a record last.
_records: dict[tuple, dict[CallRecord, None]] = {}


def _types_key(shapes_and_dtypes) -> tuple:
  return tuple((tuple(int(d) for d in s), np.dtype(t).name) for s, t in shapes_and_dtypes)


# The record each thread lowered last, per key: XLA partitions on the thread
# that compiles, and jit compiles a program on the thread that lowered it.
_thread_latest = threading.local()


def record_call(target_name: str, operand_types, result_types, backend_config: str,
                record: CallRecord):
  key = (target_name, _types_key(operand_types), _types_key(result_types),
         backend_config)
  if not hasattr(_thread_latest, "records"):
    _thread_latest.records = {}
  _thread_latest.records[key] = record
  with _lock:
    records = _records.setdefault(key, {})
    if records and record not in records:
      _partition_cache.clear()  # answers for this key may change
    records.pop(record, None)
    records[record] = None


def record_module(module) -> int:
  """Records every batchpart call found in a StableHLO module (text, bytes
  or an MLIR module), e.g. one deserialized by jax.export in a process that
  never lowered it. Returns how many calls were recorded."""
  calls = adapter.batchpart_calls_in_module(module, BATCH_RANKS_ATTRIBUTE)
  for call in calls:
    operand_ranks, result_ranks = parse_batch_ranks(call.batch_ranks)
    record_call(call.target, call.operand_types, call.result_types, call.backend_config,
                CallRecord(operand_batch_ranks=operand_ranks,
                           result_batch_ranks=result_ranks,
                           operand_layouts=call.operand_layouts,
                           result_layouts=call.result_layouts,
                           aliases=call.aliases,
                           has_side_effect=call.has_side_effect,
                           api_version=call.api_version))
  return len(calls)


def _lookup(target_name: str, operand_types, result_types, backend_config) -> CallRecord:
  key = (target_name, _types_key(operand_types), _types_key(result_types),
         adapter.canonical_backend_config(backend_config))
  with _lock:
    found = list(_records.get(key, ()))
  if not found:
    raise RuntimeError(
        f"batchpart: XLA asked to partition a call to '{target_name}' with operand "
        f"types {key[1]}, result types {key[2]} and attributes {key[3]}, but no such "
        "call was lowered through batchpart in this process. Once a target is "
        "marked batch partitionable, call it through batchpart.ffi_call or a "
        "batchpart.batch_partitionable wrapper, and lower the program in the "
        "process that compiles it.")
  if len(found) == 1:
    return found[0]
  options = {(r.operand_layouts, r.result_layouts, r.aliases, r.has_side_effect)
             for r in found}
  if len(options) == 1:
    # Only the batch dims differ: the fewest is right for every call site
    # (extra dims are kept whole).
    return min(found, key=lambda r: sum(r.operand_batch_ranks) + sum(r.result_batch_ranks))
  mine = getattr(_thread_latest, "records", {}).get(key)
  if mine in found:
    return mine  # this thread's own lowering: programs compiled by other threads
  warnings.warn(
      f"batchpart: calls to '{target_name}' with identical types and attributes "
      "were lowered with different layouts, aliasing or side effects; using the "
      "most recently lowered one. Give the call sites different attributes or "
      "compile each program right after lowering it.", RuntimeWarning)
  return found[-1]


def _shape_types(shapes):
  return [(s.dimensions(), s.numpy_dtype()) for s in shapes]


def _plan(record: CallRecord, operand_shapes, operand_shardings, result_shapes,
          result_shardings, *, split_axes: bool = True) -> _core.Plan:
  """Plans one call. Shapes are lists of dims; shardings jaxlib HloShardings
  (None: no proposal, i.e. replicated operands or no result hint)."""
  to_planner = lambda hs, shapes: [adapter.to_planner_sharding(h, len(s))
                                   for h, s in zip(hs, shapes)]
  problem = _core.Problem()
  problem.operand_shapes = operand_shapes
  problem.operand_batch_ranks = list(record.operand_batch_ranks)
  problem.operand_shardings = to_planner(operand_shardings, operand_shapes)
  problem.result_shapes = result_shapes
  problem.result_batch_ranks = list(record.result_batch_ranks)
  if result_shardings is not None:
    problem.result_shardings = to_planner(result_shardings, result_shapes)
  problem.split_axes = split_axes
  return _core.make_plan(problem)


def _dims(shapes) -> list[list[int]]:
  return [list(s.dimensions()) for s in shapes]


def _partition(target_name, arg_shapes, arg_shardings, result_shape,
               result_sharding, backend_config):
  # XLA calls this once per call site; sites that agree on every input get
  # the same answer, so it is computed once (compile time of large programs).
  key = (target_name, tuple(map(str, arg_shapes)), tuple(map(str, arg_shardings)),
         str(result_shape), str(result_sharding), bytes(backend_config))
  with _lock:
    cached = _partition_cache.get(key)
  if cached is None:
    cached = _partition_uncached(target_name, arg_shapes, arg_shardings, result_shape,
                                 result_sharding, backend_config)
    with _lock:
      if len(_partition_cache) >= _PARTITION_CACHE_SIZE:
        _partition_cache.pop(next(iter(_partition_cache)))
      _partition_cache[key] = cached
  return cached


_PARTITION_CACHE_SIZE = 1024
_partition_cache: dict[tuple, tuple] = {}


def _partition_uncached(target_name, arg_shapes, arg_shardings, result_shape,
                        result_sharding, backend_config):
  result_shapes = adapter.array_shapes(result_shape)
  record = _lookup(target_name, _shape_types(arg_shapes), _shape_types(result_shapes),
                   backend_config)
  plan = _plan(record, _dims(arg_shapes), arg_shardings, _dims(result_shapes),
               adapter.element_shardings(result_sharding, result_shape))
  module = adapter.build_shard_module(
      target_name,
      operand_shapes=plan.operand_local_shapes,
      operand_dtypes=[s.numpy_dtype() for s in arg_shapes],
      result_shapes=plan.result_local_shapes,
      result_dtypes=[s.numpy_dtype() for s in result_shapes],
      backend_config=backend_config,
      api_version=record.api_version,
      has_side_effect=record.has_side_effect,
      operand_layouts=record.operand_layouts,
      result_layouts=record.result_layouts,
      aliases=record.aliases,
  )
  if plan.passthrough:
    return module, list(arg_shardings), result_sharding
  operand_shardings = [adapter.from_planner_sharding(s) for s in plan.operand_shardings]
  result_shardings = [adapter.from_planner_sharding(s) for s in plan.result_shardings]
  return module, operand_shardings, adapter.pack_result_sharding(
      result_shape, result_shardings)


def _never_raise(callback):
  """XLA aborts the process when GSPMD's propagation callbacks raise
  (custom_partition_callback.cc CHECK-fails); only partition() may report an
  error. On any error these callbacks give no sharding preference
  (replicated), and partition() raises the real error cleanly."""
  @functools.wraps(callback)
  def safe(target_name, *args):
    try:
      return callback(target_name, *args)
    except Exception:  # noqa: BLE001 - any failure must not reach XLA here
      result_shape = args[-2]
      return adapter.pack_result_sharding(
          result_shape,
          [adapter.HloSharding.replicate()] * len(adapter.array_shapes(result_shape)))
  return safe


@_never_raise
def _infer_sharding_from_operands(target_name, arg_shapes, arg_shardings,
                                  result_shape, backend_config):
  result_shapes = adapter.array_shapes(result_shape)
  record = _lookup(target_name, _shape_types(arg_shapes), _shape_types(result_shapes),
                   backend_config)
  # Propagation may make this a jit output's sharding, which jax must express
  # on its mesh: no split mesh axes there.
  plan = _plan(record, _dims(arg_shapes), arg_shardings, _dims(result_shapes), None,
               split_axes=False)
  if plan.passthrough:
    return adapter.pack_result_sharding(
        result_shape, [adapter.HloSharding.manual()] * len(result_shapes))
  return adapter.pack_result_sharding(
      result_shape, [adapter.from_planner_sharding(s) for s in plan.result_shardings])


@_never_raise
def _propagate_user_sharding(target_name, user_sharding, result_shape, backend_config):
  """The sharding to give the call when its users want `user_sharding`: the
  users' batch sharding, with core dims whole."""
  result_shapes = adapter.array_shapes(result_shape)
  result_key = _types_key(_shape_types(result_shapes))
  config = adapter.canonical_backend_config(backend_config)
  with _lock:
    candidates = [(key[1], list(records)) for key, records in _records.items()
                  if key[0] == target_name and key[2] == result_key and key[3] == config]
  if len(candidates) != 1 or len(candidates[0][1]) != 1:
    return user_sharding  # ambiguous: partition() will fix what it must
  operand_key, (record,) = candidates[0]
  plan = _plan(record, [list(s) for s, _ in operand_key], [None] * len(operand_key),
               _dims(result_shapes), adapter.element_shardings(user_sharding, result_shape),
               split_axes=False)
  if plan.passthrough:
    return user_sharding
  return adapter.pack_result_sharding(
      result_shape, [adapter.from_planner_sharding(s) for s in plan.result_shardings])


adapter.on_exported_call_lowering(record_module)


def register(target_name: str) -> None:
  adapter.register_partitioner(
      target_name,
      propagate_user_sharding=functools.partial(_propagate_user_sharding, target_name),
      partition=functools.partial(_partition, target_name),
      infer_sharding_from_operands=functools.partial(
          _infer_sharding_from_operands, target_name),
  )
