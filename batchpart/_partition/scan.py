"""A call that carries a state along a split dim (``_vocab/dims/scan``).

Where the plan splits the scanned dim into ``P`` parts, each device holds
one part of the sequence and the state operand whole. The call runs in one
of two modes:

- **parallel** (the scan has a merge): pass 1 runs the kernel on the part
  from a zero state; one all-gather (over the devices along the dim) brings
  every part's summary, its results without the dim; each device folds the
  summaries of the parts before its own, in the order the state flows, with
  the user's merge, applies the fold to the true initial state, and runs
  the kernel again from that state (pass 2). The final state is the fold of
  every part applied to the initial state, the same on every device; the
  other summary results are the fold of every part. The fold is a
  ``jax.numpy`` function lowered by jax on the local shapes and imported
  into the module (as ``merge`` does for a ``bp.Combiner``).
- **sequential** (no merge): ``P`` stages; in stage ``s`` the devices
  holding the part the state reaches ``s``-th run the kernel (a conditional
  on ``partition_id``) and send their final state to the next part's
  devices by a collective-permute. After the last stage one all-gather of
  the state-sized final states gives every device the last part's.

Which part a device holds is read from a table indexed by ``partition_id``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from batchpart import _compat as compat, _core
from batchpart._partition import emit, shardings as sh
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.core import absolute_dim
from batchpart._vocab.dims.scan import ScanDim, registered

ir, hlo = compat.ir, compat.hlo
_Kind = _core.Sharding.Kind


@dataclasses.dataclass(frozen=True)
class Carry:
  """A split scanned dim: its parts, the device groups along it (each row
  in part order) and per partition id the part it holds."""
  scan: ScanDim
  parts: int
  groups: np.ndarray
  part: np.ndarray

  def flow(self) -> list[int]:
    """The parts in the order the state passes through them."""
    order = list(range(self.parts))
    return order[::-1] if self.scan.reverse else order


def carry(d: CallDescription, operand_shardings, scan_tiles) -> Carry | None:
  """The split of the call's scanned dim, read off the planner sharding of
  the first operand that has it; None where it is whole."""
  if not d.scans or not scan_tiles or scan_tiles[0] == 1:
    return None
  s = d.scans[0]
  k, axis = s.operand_dims[0]
  sharding = operand_shardings[k]
  assert sharding.kind == _Kind.TILED, "a split scanned dim is tiled"
  devices = sh.device_grid(sharding)
  dim = absolute_dim(axis, len(sharding.tile_dims))
  parts = devices.shape[dim]
  part = np.zeros(int(devices.max()) + 1, np.int64)
  for index, device in np.ndenumerate(devices):
    part[device] = index[dim]
  groups = np.ascontiguousarray(np.moveaxis(devices, dim, -1).reshape(-1, parts))
  return Carry(s, parts, groups, part)


def scanned(c: Carry, call, operands, result_types, target: str) -> list:
  """The results of the call over the whole dim, run on this device's part:
  ``call(operands)`` emits the kernel on local operands."""
  if c.scan.parallel:
    return _parallel(c, call, list(operands), list(result_types), target)
  return _sequential(c, call, list(operands), list(result_types))


def _with_state(operands, k: int, state) -> list:
  out = list(operands)
  out[k] = state
  return out


def _parallel(c: Carry, call, operands, result_types, target: str) -> list:
  s = c.scan
  k, j = s.state
  reg = registered(str(s.fold), target)
  summary = s.summary_results(len(result_types))
  first = call(_with_state(operands, k, emit.splat(0, operands[k].type)))
  shapes = [list(ir.RankedTensorType(first[i].type).shape) for i in summary]
  gathered = emit.all_gather([emit.reshaped(first[i], [1, *shape])
                              for i, shape in zip(summary, shapes)], 0, c.groups)
  index = hlo.convert(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)),
                      emit.partition_scalar(c.part))
  folded = _fold(reg, c, [first[i].type for i in summary], operands[k], gathered, index)
  start, final, totals = folded[0], folded[1], folded[2:]
  second = call(_with_state(operands, k, start))
  out = list(second)
  for slot, i in enumerate(summary):
    out[i] = totals[slot]
  out[j] = final
  return out


def _fold(reg, c: Carry, summary_types, init, gathered, index) -> list:
  """The state this device's part starts in, the final state and the
  summary of every part, in one imported jax function of the gathered
  summaries, the initial state and this device's part."""
  shapes = [list(ir.RankedTensorType(t).shape) for t in summary_types]
  batch_rank = len(shapes[0]) - len(reg.summary_types[0].shape)
  flow, parts = c.flow(), c.parts

  def fold(*args):
    *summaries, state, part = args
    merge, apply = reg.scan.merge, reg.apply
    for _ in range(batch_rank):
      merge, apply = jax.vmap(merge), jax.vmap(apply)
    acc, prefixes = None, []
    for p in flow:
      here = tuple(g[p] for g in summaries)
      acc = here if acc is None else tuple(merge(acc, here))
      prefixes.append(acc)
    position = (parts - 1 - part) if c.scan.reverse else part
    before = tuple(jax.lax.dynamic_index_in_dim(
        jnp.stack([pre[i] for pre in prefixes[:-1]]), jnp.maximum(position - 1, 0),
        keepdims=False) for i in range(len(summaries)))
    start = jnp.where(position == 0, state, apply(before, state))
    return (start, apply(prefixes[-1], state), *prefixes[-1])

  element = ir.RankedTensorType(init.type)
  types = [jax.ShapeDtypeStruct((parts, *s), t.dtype)
           for s, t in zip(shapes, reg.summary_types)]
  types += [jax.ShapeDtypeStruct(tuple(element.shape), reg.state_type.dtype),
            jax.ShapeDtypeStruct((), np.int32)]
  return emit.jax_function(fold, types, [*gathered, init, index],
                           [init.type, init.type, *summary_types], x64=reg.x64)


def _sequential(c: Carry, call, operands, result_types) -> list:
  s = c.scan
  k, j = s.state
  mine = emit.partition_scalar(c.part)
  state = operands[k]
  outs = [emit.splat(0, t) for t in result_types]
  flow = c.flow()
  for stage, part in enumerate(flow):
    runs = emit.compare(mine, _constant(part), "EQ")
    index = hlo.convert(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)), runs)
    case = hlo.CaseOp(list(result_types), index, 2)
    with ir.InsertionPoint(case.regions[0].blocks.append()):
      hlo.return_(outs)
    with ir.InsertionPoint(case.regions[1].blocks.append()):
      hlo.return_(call(_with_state(operands, k, state)))
    outs = list(case.results)
    if stage + 1 < len(flow):
      following = flow[stage + 1]
      pairs = np.asarray([(g[part], g[following]) for g in c.groups], np.int64)
      sent = emit.collective_permute(outs[j], pairs)
      arrives = emit.compare(mine, _constant(following), "EQ")
      state = hlo.select(arrives, sent, state)
  last = flow[-1]
  shape = list(ir.RankedTensorType(outs[j].type).shape)
  (gathered,) = emit.all_gather([emit.reshaped(outs[j], [1, *shape])], 0, c.groups)
  begin, end = [last] + [0] * len(shape), [last + 1] + shape
  one = hlo.slice(gathered, ir.DenseI64ArrayAttr.get(begin), ir.DenseI64ArrayAttr.get(end),
                  ir.DenseI64ArrayAttr.get([1] * (len(shape) + 1)))
  outs[j] = emit.reshaped(one, shape)
  return outs


def _constant(value: int) -> ir.Value:
  return hlo.constant(ir.DenseElementsAttr.get(np.asarray(value, np.int64)))  # type: ignore[call-overload]  # stubs: arrays
