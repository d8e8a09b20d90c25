"""Tying compiled FFI calls to lowered ones.

XLA never fuses an FFI custom call on CPU, but it schedules, deduplicates,
removes and copies them, so calls are matched by target name and source
location: XLA keeps each op's Python stack (innermost frame first) in the
instruction's ``stack_frame_id``; a compiled call matches a lowered call when
the lowered stack is a prefix of the compiled one (inlining adds caller
frames). Remaining ties go by order of appearance.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchpart import _hlo
from batchpart._explain.lowered import LoweredCall


def compiled_ffi_calls(module: _hlo.Module) -> list[_hlo.Instruction]:
  """The typed-FFI custom calls of a compiled module."""
  return [i for i in module.all_instructions()
          if i.opcode == "custom-call" and i.target is not None and
          i.api_version == "API_VERSION_TYPED_FFI"]


def match(lowered: Sequence[LoweredCall], compiled: Sequence[_hlo.Instruction],
          module: _hlo.Module) -> dict[int | None, list[_hlo.Instruction]]:
  """Ties compiled calls to lowered calls: same target, and the lowered
  call's stack is a prefix of the compiled call's; first in order wins.
  Lowered calls left without a compiled call then take, in order, compiled
  calls of the same target left over; compiled calls still left are copies
  (they go to their first matching lowered call) or unknown (key None)."""
  stacks = [module.stack(c.stack_frame_id) for c in compiled]

  def fits(low: LoweredCall, j: int) -> bool:
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
    match = owner.get(j)
    if match is None:
      match = next((k for k, low in enumerate(lowered) if fits(low, j)), None)
    out.setdefault(match, []).append(inst)
  return out
