"""Core dims: the dims of an array that are not batch dims, its leading ones
(before a signature's ``...``) and its trailing ones.

A core dim is named by its core axis: ``>= 0`` counts the core dims before
the array's batch dims, ``< 0`` the trailing ones from the end. Both are
invariant under vmap, which adds batch dims between them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DimName:
  """Where a named core dim first appears: ``kind`` "o" (operand) or "r"
  (result), the array's index and its core axis."""
  name: str
  kind: str
  index: int
  axis: int


def core_dims(rank: int, lead: int, core: int) -> list[int]:
  """The core dims of an array of ``rank`` with ``lead`` core dims before its
  batch dims and ``core`` after them, in core order (leading, then
  trailing)."""
  return [*range(lead), *range(rank - core, rank)]


def core_shape(shape, lead: int, core: int) -> tuple[int, ...]:
  """The sizes of ``shape``'s core dims (``core_dims``)."""
  return tuple(int(shape[d]) for d in core_dims(len(shape), lead, core))


def absolute_dim(axis: int, rank: int) -> int:
  """An array dim from a core axis (``>= 0`` leading, ``< 0`` trailing)."""
  return axis if axis >= 0 else rank + axis
