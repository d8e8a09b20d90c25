"""``batchpart.explain``: what XLA made of each FFI call in a program.

It lowers and compiles a function for the given (sharded) arguments and, per
FFI call, puts side by side what the program asked for (global shapes, from
the lowered StableHLO) and what every device runs (per-device shapes, from the
compiled, partitioned HLO), with the collectives XLA inserted around the call
and how many devices compute each batch element. Nothing is executed.

How the two programs are tied together (see docs/explain.md):
- FFI calls: ``stablehlo.custom_call`` ops in the typed-FFI encoding (an
  ``mhlo.backend_config`` dictionary, or ``api_version = 4``) and, in the
  compiled module, ``custom-call`` instructions with
  ``api_version=API_VERSION_TYPED_FFI``. XLA never fuses an FFI custom call on
  CPU, but it schedules, deduplicates, removes and copies them, so calls are
  matched by target name and source location: XLA keeps each op's Python stack
  (innermost frame first) in the instruction's ``stack_frame_id``; a compiled
  call matches a lowered call when the lowered stack is a prefix of the
  compiled one (inlining adds caller frames). Remaining ties go by order of
  appearance.
- Collectives: walked in the compiled computation that holds the call,
  backwards from its operands and forwards from its results, through
  instructions that only move, convert or combine data element by element
  (copies, bitcasts, slices, transposes, get-tuple-element, loop fusions...),
  stopping at parameters, other custom calls and instructions that compute
  across elements (dot, reduce, sort, gather, scatter, control flow...).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from collections import deque
from collections.abc import Callable, Sequence

import jax

from batchpart import _hlo
from batchpart._partition import derived_names

__all__ = ["CallReport", "Collective", "ExplainReport", "explain"]


# --------------------------------------------------------------------------
# Reading the lowered program. Relies on the StableHLO that jax 0.10.2 emits
# (checked against jax/jaxlib 0.10.2), read with the MLIR Python bindings jax
# exports as ``jax.extend.mlir.ir``:
# - jax.ffi.ffi_call and batchpart.ffi_call lower to ``stablehlo.custom_call``
#   with the FFI attributes in an ``mhlo.backend_config`` dictionary;
#   batchpart adds ``mhlo.frontend_attributes = {num_batch_dims = "k"}``.
# - shard_map bodies are ``sdy.manual_computation`` regions (Shardy) or
#   ``func.call``s whose operands come from ``SPMDFullToShardShape`` custom
#   calls (GSPMD).
# - an op's location prints as nested ``callsite("fn"("file":line:col ...)
#   at ...)``, innermost frame first; XLA keeps the same frames in the
#   compiled module's StackFrames table.
# --------------------------------------------------------------------------

from jax.extend.mlir import ir  # noqa: E402

_LOC_FRAME = re.compile(r'"((?:[^"\\]|\\.)*)"\("((?:[^"\\]|\\.)*)":(\d+):(\d+)')
_MLIR_INT = re.compile(r"^(u?)i(\d+)$")


@dataclasses.dataclass(frozen=True)
class _LoweredCall:
  target: str
  operands: tuple[tuple[str, tuple[int, ...]], ...]   # (dtype, global shape)
  results: tuple[tuple[str, tuple[int, ...]], ...]
  num_batch_dims: int | None
  in_shard_map: bool
  frames: tuple[_hlo.Frame, ...]


def _mlir_dtype(t: ir.Type) -> str:
  s = str(t)
  if s == "i1":
    return "bool"
  m = _MLIR_INT.match(s)
  if m:
    return f"{'uint' if m.group(1) else 'int'}{m.group(2)}"
  if s.startswith("complex<f") and s.endswith(">"):
    return f"complex{2 * int(s[9:-1])}"
  if s == "bf16":
    return "bfloat16"
  if re.fullmatch(r"f\d+", s):
    return f"float{s[1:]}"
  return s


def _mlir_array(v: ir.Value) -> tuple[str, tuple[int, ...]]:
  try:
    t = ir.RankedTensorType(v.type)
  except (ValueError, TypeError):
    return str(v.type), ()
  return _mlir_dtype(t.element_type), tuple(t.shape)


def _string_attr(attrs, name: str) -> str | None:
  if name not in attrs:
    return None
  try:
    return ir.StringAttr(attrs[name]).value
  except (ValueError, TypeError):
    return None


def _is_ffi_call(op) -> bool:
  attrs = op.attributes
  if "mhlo.backend_config" in attrs:
    try:
      ir.DictAttr(attrs["mhlo.backend_config"])
      return True
    except (ValueError, TypeError):
      pass
  if "api_version" in attrs:
    try:
      return ir.IntegerAttr(attrs["api_version"]).value == 4
    except (ValueError, TypeError):
      pass
  return False


def _num_batch_dims(op) -> int | None:
  attrs = op.attributes
  if "mhlo.frontend_attributes" not in attrs:
    return None
  try:
    fe = ir.DictAttr(attrs["mhlo.frontend_attributes"])
    if "num_batch_dims" not in fe:
      return None
    return int(ir.StringAttr(fe["num_batch_dims"]).value)
  except (ValueError, TypeError):
    return None


def _frames(location) -> tuple[_hlo.Frame, ...]:
  return tuple(_hlo.Frame(f, file, int(line), int(col))
               for f, file, line, col in _LOC_FRAME.findall(str(location)))


def _defined_by_full_to_shard(value) -> bool:
  owner = value.owner
  if isinstance(owner, ir.Block):
    return False
  op = getattr(owner, "operation", owner)
  return (op.name == "stablehlo.custom_call" and
          _string_attr(op.attributes, "call_target_name") == "SPMDFullToShardShape")


def _lowered_calls(module) -> list[_LoweredCall]:
  """The FFI calls of the lowered module in program order, following
  ``func.call``s into their callees (as XLA inlines them)."""
  funcs = {}
  for op in module.body.operations:
    name = _string_attr(op.operation.attributes, "sym_name")
    if op.operation.name == "func.func" and name:
      funcs[name] = op.operation
  out: list[_LoweredCall] = []

  def visit_region(region, manual, depth):
    for block in region.blocks:
      for op in block.operations:
        visit(op.operation, manual, depth)

  def visit(op, manual, depth):
    if depth > 64:
      return
    if op.name == "stablehlo.custom_call" and _is_ffi_call(op):
      out.append(_LoweredCall(
          target=derived_names.user_target(
              _string_attr(op.attributes, "call_target_name") or ""),
          operands=tuple(_mlir_array(v) for v in op.operands),
          results=tuple(_mlir_array(v) for v in op.results),
          num_batch_dims=_num_batch_dims(op), in_shard_map=manual,
          frames=_frames(op.location)))
      return
    if op.name == "func.call":
      callee = str(op.attributes["callee"]).lstrip("@").strip('"')
      if callee in funcs:
        inner = manual or any(_defined_by_full_to_shard(v) for v in op.operands)
        for region in funcs[callee].regions:
          visit_region(region, inner, depth + 1)
      return
    inner = manual or op.name == "sdy.manual_computation"
    for region in op.regions:
      visit_region(region, inner, depth)

  main = funcs.get("main")
  if main is not None:
    for region in main.regions:
      visit_region(region, False, 0)
  return out


# --------------------------------------------------------------------------
# The report.
# --------------------------------------------------------------------------

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Collective:
  """A collective XLA put in front of or behind an FFI call.

  Attributes:
    kind: the HLO opcode, e.g. ``"all-gather"``, ``"all-to-all"``,
      ``"collective-permute"``, ``"all-reduce"`` (async ``-start``/``-done``
      pairs count once, under the plain name).
    bytes: bytes of the collective's result on each device (for a combined,
      tuple-shaped collective: all of its results).
    name: the instruction's name in the compiled HLO.
    op_name: the jax operation XLA attributes it to (its metadata), e.g.
      ``"jit(f)/ffi_call"``; a collective inserted for another operation on
      the way (a ``reduce_sum`` over a sharded axis) names that operation.
  """
  kind: str
  bytes: int
  name: str = ""
  op_name: str = ""


@dataclasses.dataclass(frozen=True)
class CallReport:
  """One FFI call of the program.

  Attributes:
    target: the FFI target name.
    num_batch_dims: the leading dims batchpart treats as batch dims (the
      call's ``num_batch_dims`` frontend attribute), or None for a call that
      does not carry one (a plain ``jax.ffi.ffi_call``).
    operand_dtypes, result_dtypes: NumPy dtype names.
    global_operand_shapes, global_result_shapes: shapes in the program as
      written (inside ``shard_map``: the per-shard shapes the body sees).
      None for a compiled call explain could not tie to the lowered program.
    device_operand_shapes, device_result_shapes: what the kernel gets and
      returns on each device after partitioning; None if XLA removed the call.
    collectives_before: collectives feeding the call's operands.
    collectives_after: collectives consuming its results.
    replication: how many devices compute each batch element (1: no
      redundant work; ``num_devices``: every device computes everything);
      None inside ``shard_map``, for removed calls, or when the shapes do not
      determine it.
    num_devices: devices the program is partitioned over.
    source: ``file:line (function)`` of the call site in user code.
    hlo_name: the custom call's instruction name in the compiled HLO.
    op_name: the jax operation XLA attributes the call to, e.g.
      ``"jit(f)/ffi_call"``.
    in_shard_map: the call runs inside a ``shard_map`` body.
    removed: the call is not in the compiled program (XLA dropped it as
      unused or merged it with an identical call).
  """
  target: str
  num_batch_dims: int | None
  operand_dtypes: tuple[str, ...]
  result_dtypes: tuple[str, ...]
  global_operand_shapes: tuple[Shape, ...] | None
  global_result_shapes: tuple[Shape, ...] | None
  device_operand_shapes: tuple[Shape, ...] | None
  device_result_shapes: tuple[Shape, ...] | None
  collectives_before: tuple[Collective, ...]
  collectives_after: tuple[Collective, ...]
  replication: int | None
  num_devices: int
  source: str = ""
  hlo_name: str | None = None
  op_name: str = ""
  in_shard_map: bool = False
  removed: bool = False


@dataclasses.dataclass(frozen=True)
class ExplainReport:
  """What ``batchpart.explain`` found; ``str()`` renders it as text.

  Attributes:
    calls: one ``CallReport`` per FFI call, in program order (a call XLA
      copied, e.g. by unrolling a loop, appears once per copy).
    num_devices: devices the program is partitioned over.
    partitioner: ``"shardy"`` or ``"gspmd"``, as configured when compiling.
    hlo_text: the compiled module's text.
  """
  calls: tuple[CallReport, ...]
  num_devices: int
  partitioner: str
  hlo_text: str = dataclasses.field(default="", repr=False, compare=False)

  def __str__(self) -> str:
    return _render(self)


# --------------------------------------------------------------------------
# explain
# --------------------------------------------------------------------------

def explain(fn: Callable, *args, **kwargs) -> ExplainReport:
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
      or ``jax.ShapeDtypeStruct``s with a ``sharding``.
    **kwargs: keyword arguments for ``fn``. ``explain`` takes no options of
      its own, so every keyword goes to ``fn``.

  Returns:
    An ``ExplainReport``: ``.calls`` holds one ``CallReport`` per call
    (``.calls`` is empty when the program has no FFI call); ``str(report)`` is
    a readable table.
  """
  lowerable = fn if hasattr(fn, "lower") else jax.jit(fn)
  lowered = lowerable.lower(*args, **kwargs)
  lowered_calls = _lowered_calls(lowered.compiler_ir())
  text = lowered.compile().as_text() or ""
  module = _hlo.parse_module(text)
  num_devices = max(module.num_partitions * module.replica_count, 1)
  partitioner = "shardy" if jax.config.jax_use_shardy_partitioner else "gspmd"

  compiled = [i for i in module.all_instructions()
              if i.opcode == "custom-call" and i.target is not None and
              "api_version=API_VERSION_TYPED_FFI" in i.text]
  instances = _match(lowered_calls, compiled, module)

  calls = []
  for index, low in enumerate(lowered_calls):
    mine = instances.get(index, [])
    if not mine:
      calls.append(_report(low, None, module, num_devices))
    for inst in mine:
      calls.append(_report(low, inst, module, num_devices))
  for inst in instances.get(None, []):
    calls.append(_report(None, inst, module, num_devices))
  return ExplainReport(calls=tuple(calls), num_devices=num_devices,
                       partitioner=partitioner, hlo_text=text)


def _match(lowered: Sequence[_LoweredCall], compiled: Sequence[_hlo.Instruction],
           module: _hlo.Module) -> dict[int | None, list[_hlo.Instruction]]:
  """Ties compiled calls to lowered calls: same target, and the lowered
  call's stack is a prefix of the compiled call's; first in order wins.
  Lowered calls left without a compiled call then take, in order, compiled
  calls of the same target left over; compiled calls still left are copies
  (they go to their first matching lowered call) or unknown (key None)."""
  stacks = [module.stack(c.stack_frame_id) for c in compiled]

  def fits(low: _LoweredCall, j: int) -> bool:
    return (low.target == compiled[j].target and bool(low.frames) and
            stacks[j][:len(low.frames)] == low.frames)

  owner: dict[int, int] = {}
  for i, low in enumerate(lowered):
    for j in range(len(compiled)):
      if j not in owner and fits(low, j):
        owner[j] = i
        break
  taken = set(owner.values())
  for i, low in enumerate(lowered):
    if i in taken:
      continue
    for j in range(len(compiled)):
      if (j not in owner and compiled[j].target == low.target and
          not any(fits(other, j) for other in lowered)):
        owner[j] = i
        taken.add(i)
        break
  out: dict[int | None, list[_hlo.Instruction]] = {}
  for j, inst in enumerate(compiled):
    i = owner.get(j)
    if i is None:
      i = next((k for k, low in enumerate(lowered) if fits(low, j)), None)
    out.setdefault(i, []).append(inst)
  return out


def _report(low: _LoweredCall | None, inst: _hlo.Instruction | None,
            module: _hlo.Module, num_devices: int) -> CallReport:
  device_operands = device_results = None
  before = after = ()
  if inst is not None:
    operand_types = inst.operand_types or tuple(
        t for o in module.operands(inst) for t in o.result_types)
    device_operands = tuple(t.shape for t in operand_types)
    device_results = tuple(t.shape for t in inst.result_types)
    before = _collectives(module, inst, forward=False)
    after = _collectives(module, inst, forward=True)
  if low is not None:
    operand_dtypes = tuple(d for d, _ in low.operands)
    result_dtypes = tuple(d for d, _ in low.results)
    global_operands = tuple(s for _, s in low.operands)
    global_results = tuple(s for _, s in low.results)
  else:
    operand_dtypes = tuple(_hlo_dtype(t.dtype) for t in inst.operand_types)
    result_dtypes = tuple(_hlo_dtype(t.dtype) for t in inst.result_types)
    global_operands = global_results = None
  replication = None
  if (low is not None and inst is not None and not low.in_shard_map):
    replication = _replication(
        num_devices, global_operands, global_results, device_operands,
        device_results, low.num_batch_dims)
  frames = low.frames if low is not None and low.frames else (
      module.stack(inst.stack_frame_id) if inst is not None else ())
  return CallReport(
      target=low.target if low is not None else inst.target,
      num_batch_dims=low.num_batch_dims if low is not None else None,
      operand_dtypes=operand_dtypes, result_dtypes=result_dtypes,
      global_operand_shapes=global_operands, global_result_shapes=global_results,
      device_operand_shapes=device_operands, device_result_shapes=device_results,
      collectives_before=before, collectives_after=after,
      replication=replication, num_devices=num_devices,
      source=_source(frames), hlo_name=inst.name if inst is not None else None,
      op_name=inst.op_name if inst is not None else "",
      in_shard_map=low.in_shard_map if low is not None else False,
      removed=inst is None)


# --------------------------------------------------------------------------
# Collectives around a call.
# --------------------------------------------------------------------------

# Instructions a walk does not cross: they compute across elements (or hold
# other programs), so a collective beyond them was inserted for them.
_OPAQUE = frozenset({
    "custom-call", "dot", "convolution", "reduce", "reduce-window",
    "select-and-scatter", "scatter", "gather", "sort", "fft", "map",
    "triangular-solve", "cholesky", "while", "conditional", "call",
    "rng", "rng-bit-generator", "rng-get-and-update-state",
    "batch-norm-training", "batch-norm-inference", "batch-norm-grad",
    "infeed", "outfeed", "send", "send-done", "recv", "recv-done",
    "parameter", "top-k",
})


def _kind(module: _hlo.Module, inst: _hlo.Instruction) -> str | None:
  kind = _hlo.collective_kind(inst)
  if kind is None and inst.opcode in ("async-start", "async-done"):
    for i in module.called_instructions(inst):
      kind = _hlo.collective_kind(i)
      if kind:
        break
  return kind


def _opaque(module: _hlo.Module, inst: _hlo.Instruction) -> bool:
  if inst.opcode in _OPAQUE:
    return True
  if inst.opcode == "fusion":
    return any(i.opcode in _OPAQUE and i.opcode != "parameter"
               for i in module.called_instructions(inst))
  return False


def _collective_of(module: _hlo.Module, inst: _hlo.Instruction, kind: str
                   ) -> Collective:
  """The collective ``inst`` belongs to, its async halves read as one:
  named after the start, sized by the done."""
  start, types = inst, inst.result_types
  if inst.opcode.endswith("-done"):
    ops = module.operands(inst)
    start = ops[0] if ops else inst
  elif inst.opcode.endswith("-start"):
    done = next((u for u in module.users_of(inst)
                 if u.opcode.endswith("-done")), None)
    types = done.result_types if done is not None else inst.result_types[-1:]
  return Collective(kind=kind, bytes=sum(t.nbytes for t in types),
                    name=start.name, op_name=start.op_name or inst.op_name)


def _collectives(module: _hlo.Module, call: _hlo.Instruction, *, forward: bool
                 ) -> tuple[Collective, ...]:
  comp = module.computation_of.get(call.name)
  position = {i.name: k for k, i in enumerate(module.computations.get(comp, ()))}
  step = module.users_of if forward else module.operands
  found: dict[str, Collective] = {}
  seen = {call.name}
  todo = deque(step(call))
  while todo:
    inst = todo.popleft()
    if inst.name in seen:
      continue
    seen.add(inst.name)
    kind = _kind(module, inst)
    if kind is not None:
      c = _collective_of(module, inst, kind)
      found.setdefault(c.name, c)
      continue
    if _opaque(module, inst):
      continue
    todo.extend(step(inst))
  return tuple(sorted(found.values(), key=lambda c: position.get(c.name, 0)))


# --------------------------------------------------------------------------
# Replication: how many devices compute each batch element.
# --------------------------------------------------------------------------

def _replication(n: int, global_operands, global_results, device_operands,
                 device_results, num_batch_dims: int | None) -> int | None:
  """n / (number of distinct batch shards the call runs on).

  The reference array is the call's largest result (its largest operand if
  it has none). Its batch dims are the first ``num_batch_dims`` dims, or, for
  a call without the attribute, all of them. Along each dim with global size
  G and per-device size L the number of shards k satisfies ceil(G / k) == L
  (XLA pads uneven shards); the shard counts must multiply to a divisor of n.
  When padding leaves several choices (a dim smaller than the number of
  devices), the finest sharding is assumed.
  """
  if global_results and device_results and len(global_results) == len(device_results):
    pairs = list(zip(global_results, device_results))
  elif global_operands and device_operands and len(global_operands) == len(device_operands):
    pairs = list(zip(global_operands, device_operands))
  else:
    return None if num_batch_dims != 0 else n
  g, l = max(pairs, key=lambda p: math.prod(p[0]))
  if len(g) != len(l):
    return None
  dims = range(len(g)) if num_batch_dims is None else range(min(num_batch_dims, len(g)))
  divisors = [k for k in range(1, n + 1) if n % k == 0]
  choices = []
  for d in dims:
    G, L = g[d], l[d]
    if L == G:
      choices.append([1])
    elif L <= 0 or L > G:
      return None
    else:
      ks = [k for k in divisors if -(-G // k) == L]
      if not ks:
        return None
      choices.append(ks)
  best = None
  for combo in itertools.product(*choices):
    shards = math.prod(combo)
    if n % shards == 0 and (best is None or shards > best):
      best = shards
  return None if best is None else n // best


# --------------------------------------------------------------------------
# Rendering.
# --------------------------------------------------------------------------

_SHORT = {"bool": "pred", "bfloat16": "bf16"}
_HLO_TO_NUMPY = {"pred": "bool", "bf16": "bfloat16"}


def _hlo_dtype(name: str) -> str:
  if name in _HLO_TO_NUMPY:
    return _HLO_TO_NUMPY[name]
  m = re.fullmatch(r"([sufc])(\d+)", name)
  if m:
    kind = {"s": "int", "u": "uint", "f": "float", "c": "complex"}[m.group(1)]
    return f"{kind}{m.group(2)}"
  return name


def _short(dtype: str) -> str:
  if dtype in _SHORT:
    return _SHORT[dtype]
  m = re.fullmatch(r"(int|uint|float|complex)(\d+)", dtype)
  if m:
    return {"int": "s", "uint": "u", "float": "f", "complex": "c"}[m.group(1)] + m.group(2)
  return dtype


def _type(dtype: str, shape: Shape | None) -> str:
  if shape is None:
    return "?"
  return f"{_short(dtype)}[{','.join(map(str, shape))}]"


def _bytes(n: int) -> str:
  size = float(n)
  for unit in ("B", "KiB", "MiB", "GiB"):
    if size < 1024 or unit == "GiB":
      return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
    size /= 1024
  return f"{n} B"


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _source(frames: Sequence[_hlo.Frame]) -> str:
  """The innermost frame outside batchpart's own package, as text."""
  if not frames:
    return ""
  frame = next((f for f in frames
                if not os.path.abspath(f.file).startswith(_PACKAGE_DIR)), frames[0])
  return f"{frame.file}:{frame.line} ({frame.function})"


def _collective_text(cs: Sequence[Collective], call_op_names: set[str]) -> str:
  if not cs:
    return "none"
  parts = []
  for c in cs:
    text = f"{c.kind} {_bytes(c.bytes)}"
    if c.op_name and c.op_name not in call_op_names:
      text += f" (for {c.op_name})"
    parts.append(text)
  return ", ".join(parts)


def _render(report: ExplainReport) -> str:
  n = len(report.calls)
  head = (f"batchpart.explain: {n} FFI call{'s' if n != 1 else ''}, "
          f"{report.num_devices} device{'s' if report.num_devices != 1 else ''}"
          f" ({report.partitioner})")
  if not n:
    return head + "\nno FFI call in this program"
  lines = [head]
  for k, call in enumerate(report.calls):
    lines.append("")
    where = f"  at {os.path.basename(call.source)}" if call.source else ""
    lines.append(f"[{k}] {call.target}{where}")
    if call.removed:
      lines.append("    not in the compiled program (XLA removed it: unused, "
                   "or merged with an identical call)")
    rows = [("", "shard_map body" if call.in_shard_map else "global", "per device")]
    for i, dtype in enumerate(call.operand_dtypes):
      rows.append((f"operand {i}",
                   _type(dtype, call.global_operand_shapes[i]
                         if call.global_operand_shapes is not None else None),
                   _type(dtype, call.device_operand_shapes[i]
                         if call.device_operand_shapes is not None and
                         i < len(call.device_operand_shapes) else None)))
    for i, dtype in enumerate(call.result_dtypes):
      rows.append((f"result {i}",
                   _type(dtype, call.global_result_shapes[i]
                         if call.global_result_shapes is not None else None),
                   _type(dtype, call.device_result_shapes[i]
                         if call.device_result_shapes is not None and
                         i < len(call.device_result_shapes) else None)))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    for r in rows:
      lines.append(f"    {r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}".rstrip())
    if not call.removed:
      own = {call.op_name}
      lines.append(f"    collectives before: "
                   f"{_collective_text(call.collectives_before, own)}")
      lines.append(f"    collectives after:  "
                   f"{_collective_text(call.collectives_after, own)}")
    if call.num_batch_dims is None:
      batch = "none declared (replication judged over all dims)"
    else:
      batch = f"{call.num_batch_dims} leading (num_batch_dims)"
    lines.append(f"    batch dims:  {batch}")
    if call.in_shard_map:
      rep = "n/a (inside shard_map: each device runs the body on its own block)"
    elif call.replication is None:
      rep = "unknown"
    else:
      rep = (f"{call.replication} (each batch element computed by "
             f"{call.replication} of {call.num_devices} devices"
             + ("; no redundant work)" if call.replication == 1 else ")"))
    lines.append(f"    replication: {rep}")
  return "\n".join(lines)
