"""The halo exchange around a partitioned call (``_vocab/dims/halo``).

For each halo dim the plan splits into ``t`` parts of ``p`` elements, every
device sends the first and the last ``w = lo + hi`` elements of its part to
its neighbours below and above (two collective-permutes per operand that has
the dim), and joins its window of ``p + w`` elements:

- an interior part: the last ``lo`` elements it received from below, its
  part, the first ``hi`` from above;
- the first part (not periodic): its part and the ``w`` elements from above,
  so the window starts at the array's start;
- the last part (not periodic): the ``w`` elements from below and its part,
  so the window ends at the array's end.

Each is one concatenate of static pieces, in a branch chosen by the part's
kind (a copy of the part, as a hand-written exchange makes).

With ``periodic`` every part is interior and the first and last parts are
each other's neighbours. The plan cuts parts of ``p >= w`` only, so a slab
comes from one neighbour. The kernel runs on the windows, and each result
keeps the part's own ``p`` elements: from ``lo`` (interior), 0 (first) or
``w`` (last). Halo dims are exchanged one after another, each on the windows
of the ones before, so corners come along. Which part a device holds is
read from tables indexed by ``partition_id``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from batchpart import _compat as compat, _core
from batchpart._partition import emit, shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.halo import HaloDim

ir, hlo = compat.ir, compat.hlo
_Kind = _core.Sharding.Kind
FIRST, INTERIOR, LAST = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Exchange:
  """One split halo dim: its window, the (source, target) device pairs that
  send to the part above and to the part below, and per partition id the
  part's kind (``FIRST``, ``INTERIOR``, ``LAST``) and the kept part's start
  in the window."""
  halo: HaloDim
  up: np.ndarray
  down: np.ndarray
  kind: np.ndarray
  keep_start: np.ndarray


def exchanges(d: CallDescription, result_shardings, halo_tiles) -> list[Exchange]:
  """The exchanges of the halo dims the plan splits, read off each one's
  tiling in result 0 (every result has every halo dim)."""
  out = []
  for h, tiles in zip(d.halos, halo_tiles):
    if tiles == 1 or h.width == 0:
      continue
    sharding, rank = result_shardings[0], d.result_ranks[0]
    out.append(_exchange(h, sharding, absolute_dim(dict(h.result_dims)[0], rank), rank))
  return out


def _exchange(h: HaloDim, sharding, dim: int, rank: int) -> Exchange:
  assert sharding.kind == _Kind.TILED and len(sharding.tile_dims) == rank
  devices = sh.device_grid(sharding)
  t = devices.shape[dim]
  size = int(devices.max()) + 1
  kind, keep = np.full(size, INTERIOR, np.int64), np.zeros(size, np.int64)
  up, down = [], []
  for index, device in np.ndenumerate(devices):
    c = index[dim]
    first, last = c == 0 and not h.periodic, c == t - 1 and not h.periodic
    if not last:
      up.append((int(device), _neighbour(devices, index, dim, 1)))
    if not first:
      down.append((int(device), _neighbour(devices, index, dim, -1)))
    kind[device] = FIRST if first else LAST if last else INTERIOR
    keep[device] = 0 if first else h.width if last else h.lo
  return Exchange(h, np.asarray(up, np.int64).reshape(-1, 2),
                  np.asarray(down, np.int64).reshape(-1, 2), kind, keep)


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
      size = ir.RankedTensorType(value.type).shape[dim] - x.halo.width
      value = emit.slice_along(value, dim, emit.partition_scalar(x.keep_start), size)
  return value


def _window(value, dim: int, x: Exchange):
  shape = list(ir.RankedTensorType(value.type).shape)
  p, hi, w = shape[dim], x.halo.hi, x.halo.width
  # The part below's top, and the part above's bottom.
  below = emit.collective_permute(_static_slice(value, dim, p - w, p), x.up)
  above = emit.collective_permute(_static_slice(value, dim, 0, w), x.down)
  joins = {
      FIRST: lambda: [value, above],
      INTERIOR: lambda: [_static_slice(below, dim, hi, w), value,
                         _static_slice(above, dim, 0, hi)],
      LAST: lambda: [below, value],
  }
  if x.halo.periodic:
    return _concatenate(joins[INTERIOR](), dim)
  out = list(shape)
  out[dim] = p + w
  index = emit.partition_index(x.kind)
  element = ir.RankedTensorType(value.type).element_type
  case = hlo.CaseOp([ir.RankedTensorType.get(out, element)], index, 3)
  for kind in (FIRST, INTERIOR, LAST):
    with ir.InsertionPoint(case.regions[kind].blocks.append()):
      hlo.return_([_concatenate(joins[kind](), dim)])
  return case.result


def _concatenate(pieces, dim: int):
  pieces = [v for v in pieces if ir.RankedTensorType(v.type).shape[dim] > 0]
  if len(pieces) == 1:
    return pieces[0]
  return hlo.concatenate(pieces, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim))


def _static_slice(value, dim: int, start: int, stop: int):
  shape = list(ir.RankedTensorType(value.type).shape)
  begin, end = [0] * len(shape), list(shape)
  begin[dim], end[dim] = start, stop
  return hlo.slice(value, ir.DenseI64ArrayAttr.get(begin), ir.DenseI64ArrayAttr.get(end),
                   ir.DenseI64ArrayAttr.get([1] * len(shape)))
