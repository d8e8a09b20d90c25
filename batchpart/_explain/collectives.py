"""The collectives XLA put around a compiled FFI call.

Walked in the compiled computation that holds the call, backwards from its
operands and forwards from its results, through instructions that only move,
convert or combine data element by element (copies, bitcasts, slices,
transposes, get-tuple-element, loop fusions...), stopping at parameters,
other custom calls and instructions that compute across elements (dot,
reduce, sort, gather, scatter, control flow...).
"""

from __future__ import annotations

from collections import deque

from batchpart import _hlo
from batchpart._explain.report import Collective

# Instructions a walk does not cross: they compute across elements (or hold
# other programs), so a collective beyond them serves them, not the call.
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


def _opaque(module: _hlo.Module, inst: _hlo.Instruction, call: _hlo.Instruction) -> bool:
  if inst.opcode == "conditional" and call.op_name and inst.op_name == call.op_name:
    return False   # the call's own halo window, picked per part (``_partition/halo``)
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


def collectives(module: _hlo.Module, call: _hlo.Instruction, *, forward: bool
                ) -> tuple[Collective, ...]:
  """The collectives feeding ``call``'s operands (``forward=False``) or
  consuming its results (``forward=True``), in program order."""
  comp = module.computation_of.get(call.name)
  position = {i.name: k for k, i in enumerate(module.computations.get(comp or "", ()))}
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
    if _opaque(module, inst, call):
      continue
    todo.extend(step(inst))
  return tuple(sorted(found.values(), key=lambda c: position.get(c.name, 0)))


def own(module: _hlo.Module, call: _hlo.Instruction, kinds) -> tuple[Collective, ...]:
  """The collectives of ``kinds`` inlined from ``call``'s per-device module
  (they carry its op name), wherever they sit: also those a conditional
  around the call (a sequential scan's stages) keeps off its data edges. A
  call inside such a conditional has no op name of its own: the
  conditional's is the call's."""
  op_name = call.op_name or next(
      (i.op_name for i in module.all_instructions()
       if i.opcode == "conditional" and any(c is call for c in module.called_instructions(i))),
      "")
  if not op_name:
    return ()
  seen, out = set(), []
  for inst in module.all_instructions():
    kind = _kind(module, inst)
    if kind is not None and kind in kinds and inst.op_name == op_name:
      c = _collective_of(module, inst, kind)
      if c.name not in seen:
        seen.add(c.name)
        out.append(c)
  return tuple(out)
