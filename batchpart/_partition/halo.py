"""The halo exchange around a partitioned call (``_vocab/dims/halo``).

For each halo dim the plan splits into ``t`` parts of ``p`` elements (the
last one ``last <= p``, where XLA splits unevenly), every device sends an
edge slab of its part to each neighbour (one collective-permute per
direction and operand that has the dim; none for an empty slab) and joins
its window of ``lo + p + hi`` elements, one concatenate of static pieces:

- **unstated ends** (exact for any boundary rule): the slabs are ``w = lo +
  hi`` elements (upwards ``p + w - last``, the same where even); an interior
  part joins the last ``lo`` from below, its part, the first ``hi`` from
  above; the first part its part and ``w`` from above, so its window starts
  at the array's start; the last part what came from below and its
  elements, so its window ends at the array's end.
- **stated ends** (``padded``): ``lo`` up, ``hi`` down, as a hand-written
  exchange; every window reaches ``lo`` below and ``hi`` above its part, and
  the first and last parts pad the array's true ends by the rule (a
  constant zero is what a permute delivers where nothing arrives, so those
  need no padding at all).
- **periodic**: as stated ends, the first and last parts each other's
  neighbours.

Where the joins differ by part, a ``stablehlo.case`` on the part's kind
(read by ``partition_id``) picks one. The last part of an uneven split
joins its elements only; its window is filled up to ``lo + p + hi`` with
what lies past them (the padding, or for periodic the first part's next
elements), whose results are dropped. The plan cuts only parts the last of
which holds ``w`` elements, so a slab comes from one neighbour. The kernel
runs on the windows, and each result keeps ``p`` elements from the part's
start in its window. Halo dims are exchanged one after another, each on the
windows of the ones before, so corners come along.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from batchpart import _compat as compat, _core
from batchpart._partition import emit, shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.halo import HaloDim, part_sizes

ir, hlo = compat.ir, compat.hlo
_Kind = _core.Sharding.Kind
FIRST, INTERIOR, LAST = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Exchange:
  """One split halo dim: its window, its parts' length ``part`` (the last
  one's elements ``last``), the (source, target) device pairs that send to
  the part above and to the part below, and per partition id the part's
  kind (``FIRST``, ``INTERIOR``, ``LAST``)."""
  halo: HaloDim
  part: int
  last: int
  up: np.ndarray
  down: np.ndarray
  kind: np.ndarray

  @property
  def uneven(self) -> bool:
    return self.last != self.part

  def slabs(self) -> tuple[int, int]:
    """How many elements each device sends up and down."""
    h, p, w = self.halo, self.part, self.halo.width
    if h.ends is None:
      return p + w - self.last, w
    return h.lo, h.hi + (p - self.last if h.periodic else 0)

  def keep_start(self) -> np.ndarray:
    """Per partition id, where its part starts in its window."""
    if self.halo.ends is not None:
      return np.full(self.kind.shape, self.halo.lo, np.int64)
    up, _ = self.slabs()
    return np.choose(self.kind, [0, self.halo.lo, up]).astype(np.int64)


def exchanges(d: CallDescription, result_shapes, result_shardings,
              halo_tiles) -> list[Exchange]:
  """The exchanges of the halo dims the plan splits, read off each one's
  tiling and global size in result 0 (every result has every halo dim)."""
  out = []
  for h, tiles in zip(d.halos, halo_tiles):
    if tiles == 1 or h.width == 0:
      continue
    sharding, rank = result_shardings[0], d.result_ranks[0]
    dim = absolute_dim(dict(h.result_dims)[0], rank)
    out.append(_exchange(h, sharding, dim, rank, int(result_shapes[0][dim])))
  return out


def _exchange(h: HaloDim, sharding, dim: int, rank: int, size: int) -> Exchange:
  assert sharding.kind == _Kind.TILED and len(sharding.tile_dims) == rank
  devices = sh.device_grid(sharding)
  t = devices.shape[dim]
  kind = np.full(int(devices.max()) + 1, INTERIOR, np.int64)
  up, down = [], []
  for index, device in np.ndenumerate(devices):
    c = index[dim]
    first, last = c == 0, c == t - 1
    if not last or h.periodic:
      up.append((int(device), _neighbour(devices, index, dim, 1)))
    if not first or h.periodic:
      down.append((int(device), _neighbour(devices, index, dim, -1)))
    kind[device] = FIRST if first else LAST if last else INTERIOR
  return Exchange(h, *part_sizes(size, t), np.asarray(up, np.int64).reshape(-1, 2),
                  np.asarray(down, np.int64).reshape(-1, 2), kind)


def _neighbour(devices, index, dim: int, step: int) -> int:
  """The device ``step`` parts along ``dim`` from the one at ``index``
  (wrapping around)."""
  c = (index[dim] + step) % devices.shape[dim]
  return int(devices[index[:dim] + (c,) + index[dim + 1:]])


def window_size(shape, dims, exchanges_) -> list[int]:
  """A local shape grown by ``lo + hi`` along each exchanged halo dim
  (``dims[i]``: the array's dim for exchange i, or None)."""
  out = list(shape)
  for x, dim in zip(exchanges_, dims):
    if dim is not None:
      out[dim] += x.halo.width
  return out


def window_shapes(exchanges_, operand_shapes, result_shapes):
  """The local operand and result shapes the kernel sees: the windows."""
  grow = lambda which, shapes: [
      window_size(s, array_dims(exchanges_, which, k, len(s)), exchanges_)
      for k, s in enumerate(shapes)]
  return grow("o", operand_shapes), grow("r", result_shapes)


def array_dims(exchanges_, which: str, k: int, rank: int) -> list[int | None]:
  """The dim of operand (``which`` "o") or result ("r") ``k`` that each
  exchange's halo dim is, or None."""
  out: list[int | None] = []
  for x in exchanges_:
    pairs = dict(x.halo.operand_dims if which == "o" else x.halo.result_dims)
    out.append(absolute_dim(pairs[k], rank) if k in pairs else None)
  return out


def windowed(value, dims, exchanges_):
  """This device's window of an operand: each halo dim exchanged in turn."""
  for x, dim in zip(exchanges_, dims):
    if dim is not None:
      value = _window(value, dim, x)
  return value


def kept(value, dims, exchanges_):
  """A result on the window cut back to this device's part."""
  for x, dim in zip(exchanges_, dims):
    if dim is not None:
      keep = x.keep_start()
      size = ir.RankedTensorType(value.type).shape[dim] - x.halo.width
      if keep.max() > x.halo.width:
        # The short last part keeps the end of a window that ends at the
        # array's end: what follows it in the result is padding.
        value = _concatenate([value, _filler(value, dim, size - x.last)], dim)
      if (keep == keep[0]).all():   # every part at one place: a static slice
        value = emit.static_slice_along(value, dim, int(keep[0]), int(keep[0]) + size)
      else:
        value = emit.slice_along(value, dim, emit.partition_scalar(keep), size)
  return value


def _window(value, dim: int, x: Exchange):
  """This device's window along ``dim`` (the module doc's joins)."""
  h, p, last = x.halo, x.part, x.last
  up, down = x.slabs()
  below = above = None
  if up:
    top = (emit.static_slice_along(value, dim, p - up, p) if not (h.periodic and x.uneven) else
           emit.slice_along(value, dim, emit.partition_scalar(
               np.where(x.kind == LAST, last, p) - up), up))
    below = emit.collective_permute(top, x.up)
  if down:
    above = emit.collective_permute(emit.static_slice_along(value, dim, 0, down), x.down)
  cut = lambda v, a, b: None if v is None else emit.static_slice_along(v, dim, a, b)
  mine = lambda: value if last == p else emit.static_slice_along(value, dim, 0, last)
  if h.ends is None:
    joins = {
        FIRST: lambda: [value, above],
        INTERIOR: lambda: [cut(below, up - h.lo, up), value, cut(above, 0, h.hi)],
        LAST: lambda: [below, mine()],
    }
  else:
    interior = lambda: [below, value, cut(above, 0, h.hi)]
    past = (lambda: above) if h.periodic else (
        lambda: _end(mine(), dim, h, h.hi + p - last, top=True))
    joins = {
        FIRST: interior if h.periodic else (
            lambda: [_end(value, dim, h, h.lo, top=False), value, above]),
        INTERIOR: interior,
        LAST: lambda: [below, mine(), past()],
    }
    if (h.periodic and not x.uneven) or _zeros_arrive(h, x):
      joins = dict.fromkeys(joins, interior)
  if joins[FIRST] is joins[INTERIOR] is joins[LAST]:
    return _concatenate(joins[INTERIOR](), dim)
  case = hlo.CaseOp([emit.resized_type(value, dim, p + h.width)],
                    emit.partition_index(x.kind), 3)
  for kind in (FIRST, INTERIOR, LAST):
    with ir.InsertionPoint(case.regions[kind].blocks.append()):
      hlo.return_([_concatenate(joins[kind](), dim)])
  return case.result


def _zeros_arrive(h: HaloDim, x: Exchange) -> bool:
  """Whether the padding is exactly what the permutes deliver where nothing
  arrives (zeros at both ends of an even split), so no part pads."""
  return h.ends == "constant" and h.cval == 0 and not x.uneven


def _end(value, dim: int, h: HaloDim, size: int, *, top: bool):
  """``size`` elements past one end of ``value`` along ``dim`` (past its
  last element with ``top``, else before its first) by ``h``'s rule."""
  n = ir.RankedTensorType(value.type).shape[dim]
  to = emit.resized_type(value, dim, size)
  if h.ends == "constant":
    return emit.splat(h.cval, to)
  if h.ends == "nearest":
    edge = emit.static_slice_along(value, dim, n - 1 if top else 0, n if top else 1)
    rank = len(ir.RankedTensorType(to).shape)
    return hlo.broadcast_in_dim(to, edge, ir.DenseI64ArrayAttr.get(list(range(rank))))
  skip = int(h.ends == "mirror")   # mirror leaves out the edge element itself
  piece = (emit.static_slice_along(value, dim, n - size - skip, n - skip) if top else
           emit.static_slice_along(value, dim, skip, size + skip))
  return hlo.reverse(piece, ir.DenseI64ArrayAttr.get([dim]))


def _filler(value, dim: int, size: int):
  """``size`` zeros shaped like ``value`` along ``dim``: padding."""
  return emit.splat(0, emit.resized_type(value, dim, size))


def _concatenate(pieces, dim: int):
  pieces = [v for v in pieces if v is not None and ir.RankedTensorType(v.type).shape[dim] > 0]
  if len(pieces) == 1:
    return pieces[0]
  return hlo.concatenate(pieces, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim))
