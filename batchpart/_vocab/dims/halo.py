"""Halo dims: ``halo={"n": w}`` or ``halo={"n": Halo(lo, hi, periodic)}``.

A halo dim is a core dim that the operands and the results have with one
size, along which the call is *local*: result element ``i`` depends only on
operand elements ``i - lo .. i + hi`` and on where ``i`` lies relative to
the array's two ends (the kernel's own boundary rule). Where the dim is
split into parts, each device calls the kernel on a window of
``lo + part + hi`` elements and keeps its part of the results; at the
array's ends the window is shifted inward (it starts at 0, or ends at
``n``), so the kernel's boundary rule meets the true ends. With
``periodic`` every window wraps around instead.

A halo names its dim by its core axis in each operand and each result that
has it (``core``).
"""

from __future__ import annotations

import dataclasses
import numbers

from batchpart._vocab.dims.core import absolute_dim


@dataclasses.dataclass(frozen=True)
class Halo:
  """The window of a halo dim: ``lo`` elements below and ``hi`` above each
  result element that it depends on; ``periodic``: the kernel wraps around
  (the window of a part at an end continues at the other end)."""
  lo: int
  hi: int
  periodic: bool = False

  def __post_init__(self):
    for field in ("lo", "hi"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"batchpart.Halo: {field} must be an int, got {value!r}.")
      object.__setattr__(self, field, int(value))
    object.__setattr__(self, "periodic", bool(self.periodic))

  @property
  def width(self) -> int:
    """``lo + hi``: the slab each part sends its neighbours, and the
    shortest part a split may make."""
    return self.lo + self.hi


@dataclasses.dataclass(frozen=True)
class HaloDim:
  """One declared halo dim: its signature name, its window, and where each
  operand and result that has it holds it, as ``(array, core axis)`` pairs."""
  name: str
  lo: int
  hi: int
  periodic: bool
  operand_dims: tuple[tuple[int, int], ...]
  result_dims: tuple[tuple[int, int], ...]

  @property
  def width(self) -> int:
    return self.lo + self.hi


def check_halo_mapping(owner: str, halo) -> dict[str, Halo]:
  """``halo`` as a dict of dim name -> ``Halo`` (an int ``w`` is
  ``Halo(w, w)``), checked for shape and for negative widths."""
  if not isinstance(halo, dict) or not all(isinstance(k, str) for k in halo):
    raise TypeError(f"{owner}: halo must be a dict of core dim name -> width or "
                    f"batchpart.Halo(lo, hi, periodic=False), e.g. halo={{'n': 1}}; got "
                    f"{halo!r}.")
  out = {}
  for name, value in halo.items():
    if isinstance(value, Halo):
      spec = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
      spec = Halo(int(value), int(value))
    else:
      raise TypeError(f"{owner}: halo={{{name!r}: {value!r}}}: the width of the halo dim "
                      f"'{name}' must be an int or batchpart.Halo(lo, hi, periodic=False).")
    if spec.lo < 0 or spec.hi < 0:
      raise ValueError(f"{owner}: halo={{{name!r}: {value!r}}}: the halo dim '{name}' has a "
                       f"negative width (lo={spec.lo}, hi={spec.hi}); widths count elements "
                       "on each side and are >= 0.")
    out[name] = spec
  return out


def halo_tables(halos, operand_ranks, result_ranks):
  """Per operand and per result: for each halo, the array dim that holds it
  or None (a list per array, one entry per halo)."""
  def table(ranks, field):
    rows = [[None] * len(halos) for _ in ranks]
    for i, h in enumerate(halos):
      for k, axis in getattr(h, field):
        rows[k][i] = absolute_dim(axis, int(ranks[k]))
    return rows
  return table(operand_ranks, "operand_dims"), table(result_ranks, "result_dims")


def splits_into(h, size: int, parts: int) -> bool:
  """Whether a halo dim of ``size`` elements may be cut into ``parts``
  parts: evenly (a kernel cannot be told where padding starts) and none
  shorter than ``lo + hi`` (each window then takes its halo from one
  neighbour on each side)."""
  return parts == 1 or (size % parts == 0 and size // parts >= h.width)


def halo_text(halos) -> str:
  """The declaration's ``halo=`` as written back, for messages and explain."""
  def one(h):
    if h.lo == h.hi and not h.periodic:
      return f"{h.name!r}: {h.lo}"
    return f"{h.name!r}: Halo({h.lo}, {h.hi}{', periodic=True' if h.periodic else ''})"
  return "{" + ", ".join(one(h) for h in halos) + "}"


def check_halo_sizes(owner: str, halos, operand_shapes, result_shapes) -> None:
  """Every array that has a halo dim has it with one size."""
  for h in halos:
    sizes = [(f"{what} {k}", int(shapes[k][absolute_dim(axis, len(shapes[k]))]))
             for what, dims, shapes in (("operand", h.operand_dims, operand_shapes),
                                        ("result", h.result_dims, result_shapes))
             for k, axis in dims]
    for where, size in sizes[1:]:
      if size != sizes[0][1]:
        raise ValueError(f"{owner}: the halo dim '{h.name}' has size {size} in {where} and "
                         f"{sizes[0][1]} in {sizes[0][0]}; the operands and results must "
                         "have a halo dim with one size.")


def part_extent(h, size: int, parts: int, c: int) -> tuple[int, int, int, int]:
  """Where part ``c`` of ``parts`` of a halo dim of ``size`` elements has
  its window and keeps its results, in global positions: ``(window start,
  window stop, kept start, kept stop)``. A periodic window may start below 0
  or stop past ``size``: its positions are taken modulo ``size``."""
  if parts == 1:
    return 0, size, 0, size
  p = size // parts
  start, stop = c * p - h.lo, (c + 1) * p + h.hi
  if not h.periodic:
    shift = max(0, -start) - max(0, stop - size)
    start, stop = start + shift, stop + shift
  return start, stop, c * p, (c + 1) * p


def whole_extents(halos, sizes) -> list[int]:
  """The halo columns of a block vector where nothing is split: each halo
  dim's window and kept part are the whole dim."""
  return [v for h, n in zip(halos, sizes) for v in part_extent(h, int(n), 1, 0)]
