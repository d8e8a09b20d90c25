"""``explain``: lower and compile a function, read both programs, and
report on each FFI call."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax

from batchpart import _compat as compat, _dtypes, _hlo
from batchpart._explain import callbacks, collectives, matching, replication
from batchpart._explain.lowered import (
  FRONTEND_CALLBACK,
  LoweredCall,
  batch_dims,
  halos,
  leading_core_dims,
  lowered_calls,
  reductions,
  scans,
  unit_batch,
)
from batchpart._explain.report import (
  CallReport,
  Collective,
  ExplainReport,
  HaloDimReport,
  ReducedDim,
  ScanDimReport,
)
from batchpart._primitive.lowering import FRONTEND_DECLARATION
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.named_combiners import gathers


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ExplainReport:
  """Compiles ``fn`` for the given arguments and reports on its FFI calls.

  For every FFI call in the program (``batchpart.ffi_call``, a
  ``batchpart.batch_partitionable`` wrapper, or a plain
  ``jax.ffi.ffi_call``, including jax's own LAPACK calls): the target, global
  and per-device operand and result shapes, the collectives XLA inserted to
  feed the call and to consume its results (kind and bytes per device), and
  how many devices compute each batch element. The program is lowered and
  compiled, never run.

  Args:
    fn: the function to explain. A ``jax.jit``-wrapped function is used as
      is (so its ``static_argnums``, ``in_shardings`` and ``out_shardings``
      apply); anything else is wrapped in ``jax.jit``.
    *args: positional arguments for ``fn``: arrays (their shardings are used)
      or ``jax.ShapeDtypeStruct`` objects with a ``sharding``.
    **kwargs: keyword arguments for ``fn``. ``explain`` takes no options of
      its own, so every keyword goes to ``fn``.

  Returns:
    An ``ExplainReport``: ``.calls`` holds one ``CallReport`` per call
    (``.calls`` is empty when the program has no FFI call); ``str(report)`` is
    a readable table.
  """
  lowerable = fn if hasattr(fn, "lower") else jax.jit(fn)
  lowered = lowerable.lower(*args, **kwargs)
  calls_asked = lowered_calls(lowered.compiler_ir())
  text = lowered.compile().as_text() or ""
  module = _hlo.parse_module(text)
  num_devices = max(module.num_partitions * module.replica_count, 1)
  partitioner = "shardy" if compat.use_shardy() else "gspmd"

  compiled = matching.compiled_ffi_calls(module)
  instances = matching.match(calls_asked, compiled, module)

  calls = []
  for index, low in enumerate(calls_asked):
    mine = instances.get(index, [])
    if not mine:
      calls.append(_report(low, None, module, num_devices))
    for inst in mine:
      calls.append(_report(low, inst, module, num_devices))
  for inst in instances.get(None, []):
    calls.append(_report(None, inst, module, num_devices))
  return ExplainReport(calls=tuple(calls), num_devices=num_devices,
                       partitioner=partitioner, hlo_text=text)


def _report(low: LoweredCall | None, inst: _hlo.Instruction | None,
            module: _hlo.Module, num_devices: int) -> CallReport:
  callback = _callback_name(low, inst)
  hidden = _hidden_operands(low, inst)
  device_operands: tuple[tuple[int, ...], ...] | None = None
  device_results: tuple[tuple[int, ...], ...] | None = None
  global_operands: tuple[tuple[int, ...], ...] | None
  global_results: tuple[tuple[int, ...], ...] | None
  before: tuple[Collective, ...] = ()
  after: tuple[Collective, ...] = ()
  one_device = None
  if inst is not None:
    operand_types = inst.operand_types or tuple(
        t for o in module.operands(inst) for t in o.result_types)
    device_operands = tuple(t.shape for t in operand_types)[hidden:]
    device_results = tuple(t.shape for t in inst.result_types)
    around, one_device = _placement(module, inst)
    before = collectives.collectives(module, around, forward=False)
    after = collectives.collectives(module, around, forward=True)
  if low is not None:
    operand_dtypes = tuple(d for d, _ in low.operands)
    result_dtypes = tuple(d for d, _ in low.results)
    global_operands = tuple(s for _, s in low.operands)
    global_results = tuple(s for _, s in low.results)
  else:
    assert inst is not None, "a call is lowered, compiled or both"
    operand_dtypes = tuple(_dtypes.from_hlo(t.dtype) for t in inst.operand_types)[hidden:]
    result_dtypes = tuple(_dtypes.from_hlo(t.dtype) for t in inst.result_types)
    global_operands = global_results = None
  shared_by = None
  derived = low.derived_name if low is not None else _compiled(inst).derived_name
  leads = leading_core_dims(derived, hidden)
  reduced = _reduced_dims(reductions(derived, hidden), global_operands, device_operands)
  if reduced and inst is not None:
    after = _mark_declared(module, inst, after, gathers=gathers(reduced[0].op))
  halo_dims = _halo_dims(halos(derived, hidden), global_results, device_results, device_operands,
                         _permuted_shapes(module, inst))
  if halo_dims and inst is not None:
    # The exchange is inlined from the call's per-device module: its
    # permutes carry the call's op name.
    before = tuple(dataclasses.replace(c, declared_halo=True)
                   if c.kind == "collective-permute" and c.op_name == inst.op_name else c
                   for c in before)
  scan_dims = _scan_dims(scans(derived, hidden), global_operands, device_operands,
                         collectives.own(module, inst, _SCAN_COLLECTIVES) if inst else ())
  if one_device is not None or (unit_batch(derived) and low is not None
                                and not low.in_shard_map):
    # One device computes everything (a callback without batch dims: its
    # unit batch dim gives the others padding), so nothing twice.
    shared_by = 1
  elif low is not None and inst is not None and not low.in_shard_map:
    shared_by = replication.replication(
        num_devices, global_operands, global_results, device_operands,
        device_results, low.num_batch_dims, leads)
    parts = math.prod(r.parts or 1 for r in reduced) * math.prod(
        h.parts or 1 for h in halo_dims) * math.prod(t.parts or 1 for t in scan_dims)
    if shared_by is not None and shared_by % parts == 0:
      shared_by //= parts
  frames = low.frames if low is not None and low.frames else (
      module.stack(inst.stack_frame_id) if inst is not None else ())
  if low is not None:
    num_batch_dims, declaration = low.num_batch_dims, low.declaration
    target = low.target
  else:
    # A call explain could not tie to the lowered program is still known as
    # a batchpart call by the attributes it carries into the compiled one.
    compiled = _compiled(inst)
    num_batch_dims = batch_dims(compiled.frontend_attribute("num_batch_dims"),
                                compiled.derived_name)
    declaration = compiled.frontend_attribute(FRONTEND_DECLARATION)
    target = compiled.target or ""
  return CallReport(
      target=target,
      num_batch_dims=num_batch_dims,
      operand_dtypes=operand_dtypes, result_dtypes=result_dtypes,
      global_operand_shapes=global_operands, global_result_shapes=global_results,
      device_operand_shapes=device_operands, device_result_shapes=device_results,
      collectives_before=before, collectives_after=after,
      replication=shared_by, num_devices=num_devices,
      source=_source(frames), hlo_name=inst.name if inst is not None else None,
      op_name=inst.op_name if inst is not None else "",
      in_shard_map=low.in_shard_map if low is not None else False,
      removed=inst is None, callback=callback,
      leading_core_dims=leads, reduced_dims=reduced, declaration=declaration,
      single_device=one_device, halo_dims=halo_dims, scan_dims=scan_dims)


def _compiled(inst: _hlo.Instruction | None) -> _hlo.Instruction:
  """The compiled call of a report that has no lowered one: every report has
  one or the other."""
  assert inst is not None, "a call is lowered, compiled or both"
  return inst


def _hidden_operands(low: LoweredCall | None, inst: _hlo.Instruction | None) -> int:
  """How many leading custom-call operands are batchpart's, not the user's:
  1 for a batchpart callback (its block vector), else 0."""
  if low is not None and low.callback is not None:
    return 1
  return int(inst is not None and inst.frontend_attribute(FRONTEND_CALLBACK) is not None)


def _placement(module: _hlo.Module, inst: _hlo.Instruction
               ) -> tuple[_hlo.Instruction, int | None]:
  """The instruction to walk collectives from, and the one device that runs
  ``inst`` (None: every device). A call XLA runs on one device sits in a
  conditional, whose parameter would end a walk started inside it, so its
  collectives are those around the conditional."""
  only = callbacks.single_device(module, inst)
  return (inst, None) if only is None else only


def _callback_name(low: LoweredCall | None, inst: _hlo.Instruction | None) -> str | None:
  """The entry point that made a host callback (batchpart's, as its
  frontend attribute names it; jax's, from the op name of its target's
  call); None for an FFI call."""
  if low is not None and low.callback is not None:
    return low.callback
  if inst is not None and inst.frontend_attribute(FRONTEND_CALLBACK) is not None:
    return inst.frontend_attribute(FRONTEND_CALLBACK)
  if low is not None:
    target = low.target
  else:
    assert inst is not None, "a call is lowered, compiled or both"
    target = inst.target or ""
  if not callbacks.is_stock_target(target):
    return None
  op_name = inst.op_name if inst is not None else ""
  return callbacks.entry_point(target, op_name, ordered=low is not None and low.ordered)


def _reduced_dims(declared, global_operands, device_operands) -> tuple[ReducedDim, ...]:
  """Each declared reduced dim with its global size and how many parts the
  devices split it into, read off the first operand that has it."""
  out = []
  for r in declared:
    k, axis = r.dims[0]
    size = parts = None
    if global_operands is not None and k < len(global_operands):
      dim = absolute_dim(axis, len(global_operands[k]))
      size = global_operands[k][dim]
      if device_operands is not None and k < len(device_operands):
        local = device_operands[k][dim]
        parts = size // local if local and size % local == 0 else None
    out.append(ReducedDim(r.name, r.op, size, parts))
  return tuple(out)


def _halo_dims(declared, global_results, device_results, device_operands,
               permuted) -> tuple[HaloDimReport, ...]:
  """Each declared halo dim with its global size and how many parts the
  devices split it into, read off result 0 (every result has it): a split
  dim's kernel sees windows of ``part + lo + hi``, a whole one the dim."""
  out = []
  for h in declared:
    size = parts = None
    if global_results:
      dim = absolute_dim(dict(h.result_dims)[0], len(global_results[0]))
      size = global_results[0][dim]
      if device_results:
        local = device_results[0][dim]
        part = local - h.width if local != size or _exchanged(
            h, device_operands, permuted) else local
        parts = -(-size // part) if part > 0 else None
    out.append(HaloDimReport(h.name, h.lo, h.hi, h.periodic, size, parts, h.ends, h.cval))
  return tuple(out)


_SCAN_COLLECTIVES = ("all-gather", "collective-permute")


def _scan_dims(declared, global_operands, device_operands, own
               ) -> tuple[ScanDimReport, ...]:
  """Each declared scanned dim with its global size, its parts (read off
  the first operand that has it) and the bytes its ``own`` collectives
  (inlined from the call's per-device module) bring each device."""
  out = []
  for t in declared:
    size = parts = None
    if global_operands and t.operand_dims:
      k, axis = t.operand_dims[0]
      dim = absolute_dim(axis, len(global_operands[k]))
      size = global_operands[k][dim]
      if device_operands:
        local = device_operands[k][dim]
        parts = size // local if local and size % local == 0 else None
    moved = sum(c.bytes for c in own) if (parts or 1) > 1 else 0
    out.append(ScanDimReport(t.name, t.parallel, t.reverse, size, parts, moved))
  return tuple(out)


def _exchanged(h, device_operands, permuted) -> bool:
  """Whether the call's collective-permutes carry slabs of ``h``: fewer
  elements along its dim than an operand's window, no more along the
  others. This tells apart the one split the window alone cannot: two parts
  of ``lo + hi`` make a window as long as the whole dim. Another dim's slabs
  span this dim's window, or its part where this dim is exchanged too."""
  if not h.width or device_operands is None:
    return False
  for k, axis in h.operand_dims:
    if k >= len(device_operands):
      continue
    shape = device_operands[k]
    dim = absolute_dim(axis, len(shape))
    if any(len(s) == len(shape) and s[dim] < shape[dim] and all(
        a <= b for a, b in zip(s, shape)) for s in permuted):
      return True
  return False


def _permuted_shapes(module: _hlo.Module, inst: _hlo.Instruction | None
                     ) -> tuple[tuple[int, ...], ...]:
  """The shapes the collective-permutes of ``inst``'s halo exchange carry
  (the exchange is inlined from the call's per-device module, so its
  permutes carry the call's op name)."""
  if inst is None or not inst.op_name:
    return ()
  return tuple(t.shape for i in module.all_instructions()
               if _hlo.collective_kind(i) == "collective-permute" and i.op_name == inst.op_name
               for t in i.result_types)


def _mark_declared(module: _hlo.Module, call: _hlo.Instruction, after, *, gathers: bool):
  """``after`` with batchpart's own all-reduces (and, with ``gathers``, a
  top-k merge's all-gather), which combine the parts of the call's reduced
  dims, marked: those that take the call's results directly, and those a
  named combiner's merge reaches from them through instructions that carry
  the call's op name (the merge is inlined from the call's per-device
  module; another call or the user's ops end the walk)."""
  direct, seen = set(), set()
  todo = [(inst, True) for inst in module.users_of(call)]
  while todo:
    inst, adjacent = todo.pop()
    if inst.name in seen or inst.opcode == "custom-call":
      continue
    seen.add(inst.name)
    if inst.opcode == "get-tuple-element":
      todo.extend((user, adjacent) for user in module.users_of(inst))
      continue
    if not (adjacent or (call.op_name and inst.op_name == call.op_name)):
      continue
    if _hlo.collective_kind(inst) == "all-reduce" or (
        gathers and _hlo.collective_kind(inst) == "all-gather"):
      direct.add(inst.name)
    todo.extend((user, False) for user in module.users_of(inst))
  return tuple(dataclasses.replace(c, declared_reduction=True) if c.name in direct else c
               for c in after)


# batchpart's own package directory: frames inside it are not the user's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _source(frames: Sequence[_hlo.Frame]) -> str:
  """The innermost frame outside batchpart's own package, as text."""
  if not frames:
    return ""
  frame = next((f for f in frames
                if not os.path.abspath(f.file).startswith(_PACKAGE_DIR)), frames[0])
  return f"{frame.file}:{frame.line} ({frame.function})"
