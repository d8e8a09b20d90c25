"""Halo dims: ``halo={"n": w}`` or ``halo={"n": Halo(lo, hi, periodic, ends)}``.

A halo dim is a core dim that the operands and the results have with one
size, along which the call is *local*: result element ``i`` depends only on
operand elements ``i - lo .. i + hi`` and on where ``i`` lies relative to
the array's two ends (the kernel's own boundary rule). Where the dim is
split into parts, each device calls the kernel on a window of
``lo + part + hi`` elements and keeps its part of the results. Where the
rule is unstated, the window at the array's ends is shifted inward (it
starts at 0, or ends at ``n``), so the kernel's rule meets the true ends.
Where it is stated (``ends``: the kernel reads past the ends as if the
array were padded by that rule), every window reaches ``lo`` below and
``hi`` above its part and batchpart pads the true ends itself, so each
part needs only ``lo`` elements from below and ``hi`` from above. With
``ends="wrap"`` (``periodic``) every window wraps around.

Parts may be uneven (XLA's: ``ceil(n / parts)`` elements each, the last one
short); the last part must still hold ``lo + hi`` elements, so every window
takes its halo from one neighbour on each side.

A halo names its dim by its core axis in each operand and each result that
has it (``core``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping

from batchpart._vocab.dims.core import absolute_dim

#: How a kernel may read past an array's ends, scipy.ndimage's names: the
#: array padded with ``cval`` ("constant"; "zero": 0), with its edge element
#: ("nearest"), mirrored about its edge ("reflect": ``d c b a | a b c d``;
#: "mirror": ``d c b | a b c d``), or continued at the other end ("wrap").
ENDS = ("zero", "constant", "nearest", "reflect", "mirror", "wrap")


@dataclasses.dataclass(frozen=True)
class Halo:
  """The window of a halo dim: ``lo`` elements below and ``hi`` above each
  result element that it depends on.

  ``ends``: how the kernel treats the array's ends, where it says so (one of
  ``ENDS``; ``cval`` the constant's value); the exchange then moves ``lo``
  elements one way and ``hi`` the other, and batchpart pads the true ends.
  Unstated (None), the windows at the ends are shifted inward instead, which
  is exact for any rule. ``periodic=True`` is ``ends="wrap"``; "zero" is
  "constant" with ``cval=0``.

  Example:
    A 4-point stencil whose result element ``i`` reads operand elements
    ``i - 1 .. i + 2``, and reads zeros past the array's ends (docs/halos.md)::

      bp.ffi_call("my_stencil", out, signature="(n)->(n)",
                  halo={"n": bp.Halo(1, 2, ends="zero")})(x)
  """
  lo: int
  hi: int
  periodic: bool = False
  ends: str | None = None
  cval: float = 0.0

  def __post_init__(self):
    for field in ("lo", "hi"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"batchpart.Halo: {field} must be an int, got {value!r}.")
      object.__setattr__(self, field, int(value))
    if self.ends is not None and self.ends not in ENDS:
      raise ValueError(f"batchpart.Halo: ends={self.ends!r} is not one of "
                       f"{', '.join(map(repr, ENDS))} (or None: unstated).")
    if self.periodic and self.ends not in (None, "wrap"):
      raise ValueError(f"batchpart.Halo: periodic=True wraps around, which contradicts "
                       f"ends={self.ends!r}; give one of them.")
    if isinstance(self.cval, bool) or not isinstance(self.cval, numbers.Real):
      raise TypeError(f"batchpart.Halo: cval must be a number, got {self.cval!r}.")
    if self.cval != 0 and self.ends != "constant":
      raise ValueError(f"batchpart.Halo: cval={self.cval!r} is the padding of "
                       f"ends='constant'; ends is {self.ends!r}.")
    periodic = bool(self.periodic) or self.ends == "wrap"
    object.__setattr__(self, "periodic", periodic)
    object.__setattr__(self, "ends", "wrap" if periodic else
                       "constant" if self.ends == "zero" else self.ends)
    object.__setattr__(self, "cval", float(self.cval))

  def __repr__(self) -> str:
    ends = ", periodic=True" if self.periodic else f", ends={self.ends!r}" if self.ends else ""
    cval = f", cval={self.cval!r}" if self.cval else ""
    return f"Halo({self.lo}, {self.hi}{ends}{cval})"

  @property
  def width(self) -> int:
    """``lo + hi``: the slab each part sends its neighbours, and the
    shortest part a split may make."""
    return self.lo + self.hi


@dataclasses.dataclass(frozen=True)
class HaloDim:
  """One declared halo dim: its signature name, its window, where each
  operand and result that has it holds it, as ``(array, core axis)`` pairs,
  and its ends as ``Halo`` holds them (None: unstated; "wrap" where
  ``periodic``)."""
  name: str
  lo: int
  hi: int
  periodic: bool
  operand_dims: tuple[tuple[int, int], ...]
  result_dims: tuple[tuple[int, int], ...]
  ends: str | None = None
  cval: float = 0.0

  def __post_init__(self):
    if self.periodic:
      object.__setattr__(self, "ends", "wrap")

  @property
  def width(self) -> int:
    return self.lo + self.hi

  @property
  def padded(self) -> bool:
    """Whether batchpart pads the array's ends (a stated rule that does not
    wrap), rather than shifting the end windows inward or wrapping."""
    return self.ends is not None and not self.periodic

  def declared(self) -> Halo:
    """The ``Halo`` this dim was declared with."""
    return Halo(self.lo, self.hi, self.periodic, self.ends, self.cval)


def check_halo_mapping(owner: str, halo) -> dict[str, Halo]:
  """``halo`` as a dict of dim name -> ``Halo`` (an int ``w`` is
  ``Halo(w, w)``), checked for shape and for negative widths."""
  if not isinstance(halo, Mapping) or not all(isinstance(k, str) for k in halo):
    raise TypeError(f"{owner}: halo must be a dict of core dim name -> width or "
                    f"batchpart.Halo(lo, hi, periodic=False, ends=None, cval=0.0), e.g. "
                    f"halo={{'n': 1}}; got {halo!r}.")
  out = {}
  for name, value in halo.items():
    if isinstance(value, Halo):
      spec = value
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
      spec = Halo(int(value), int(value))
    else:
      raise TypeError(f"{owner}: halo={{{name!r}: {value!r}}}: the width of the halo dim "
                      f"'{name}' must be an int or batchpart.Halo(lo, hi, periodic=False, "
                      "ends=None, cval=0.0).")
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


def part_sizes(size: int, parts: int) -> tuple[int, int]:
  """XLA's split of ``size`` elements into ``parts``: each part's length
  (``ceil(size / parts)``) and how many of the last part's are elements
  (the rest is padding; <= 0 where the last parts are all padding)."""
  p = -(-size // parts)
  return p, size - (parts - 1) * p


def splits_into(h, size: int, parts: int, *, even: bool = False) -> bool:
  """Whether a halo dim of ``size`` elements may be cut into ``parts``
  parts: the last (shortest) part holds at least ``lo + hi`` elements, so
  each window takes its halo from one neighbour on each side, and at least
  one; padded ends are mirrored from one part. ``even``: only an even
  split."""
  if parts == 1:
    return True
  p, last = part_sizes(size, parts)
  if even and last != p:
    return False
  if last < max(h.width, 1):
    return False
  if h.ends not in ("reflect", "mirror"):
    return True
  # A mirrored end is read off the part at that end: lo elements of the
  # first, and hi plus the last part's padding of the last.
  mirror = h.ends == "mirror"
  return h.lo + mirror <= p and h.hi + p - last + mirror <= last


def halo_value(h):
  """A halo dim's window as the user writes it: ``w`` or a ``Halo``."""
  return h.lo if h.lo == h.hi and h.ends is None else h.declared()


def halo_text(halos) -> str:
  """The declaration's ``halo=`` as written back, for messages and explain."""
  return "{" + ", ".join(f"{h.name!r}: {halo_value(h)!r}" for h in halos) + "}"


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
  window stop, kept start, kept stop)``. A window with stated ends may start
  below 0 or stop past ``size``: its positions there are the padding (taken
  modulo ``size`` where periodic). Every window holds ``lo + p + hi``
  elements, ``p`` the parts' length, also where the last part is short."""
  if parts == 1:
    return 0, size, 0, size
  p, _ = part_sizes(size, parts)
  start, stop = c * p - h.lo, (c + 1) * p + h.hi
  if h.ends is None:
    shift = max(0, -start) - max(0, stop - size)
    start, stop = start + shift, stop + shift
  return start, stop, c * p, min((c + 1) * p, size)


def whole_extents(halos, sizes) -> list[int]:
  """The halo columns of a block vector where nothing is split: each halo
  dim's window and kept part are the whole dim."""
  return [v for h, n in zip(halos, sizes) for v in part_extent(h, int(n), 1, 0)]
