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
  devices by a collective-permute. Where the local batch has more than one
  element (and the call is no host callback), the stages are pipelined over
  ``C`` chunks of it (``pipelined``): ``P + C - 1`` stages of a chunk, ``C``
  devices at work at once. After the last stage one all-gather of the
  state-sized final states gives every device the last part's.

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


def scanned(c: Carry, call, operands, result_types, target: str,
            batch_dims=None) -> list:
  """The results of the call over the whole dim, run on this device's part:
  ``call(operands, result_types)`` emits the kernel on local operands.
  ``batch_dims``: each operand's and each result's first batch dim (None
  where it has none), where the sequential stages may pipeline chunks of
  the batch (``pipelined``); None where they may not (a host callback,
  whose block vector names its whole block)."""
  call_whole = lambda ops: call(ops, result_types)
  if c.scan.parallel:
    return _parallel(c, call_whole, list(operands), list(result_types), target)
  chunks = _chunks(c, result_types, batch_dims)
  if chunks > 1:
    return pipelined(c, call, list(operands), list(result_types), batch_dims, chunks)
  return _sequential(c, call_whole, list(operands), list(result_types))


# A pipeline stage costs a conditional and a collective-permute: on 8
# simulated CPU devices a chunk of 32K elements per step-result beat one
# stage per part (0.65x the time), one of 4K lost to it (1.3x).
MIN_CHUNK_ELEMENTS = 1 << 15


def _chunks(c: Carry, result_types, batch_dims) -> int:
  """How many chunks of the local batch a sequential scan pipelines through
  its parts: the most, up to the parts, that cut the results' first batch
  dim evenly and leave each chunk of the largest result at least
  ``MIN_CHUNK_ELEMENTS``; 1 (no pipeline) where none does, the stages may
  not be cut, or the dim is not split."""
  if batch_dims is None or c.parts < 2:
    return 1
  _, result_dims = batch_dims
  first = next((i for i, dim in enumerate(result_dims) if dim is not None), None)
  if first is None:
    return 1
  size = ir.RankedTensorType(result_types[first]).shape[result_dims[first]]
  largest = max(int(np.prod(ir.RankedTensorType(t).shape)) for t in result_types)
  return max(n for n in range(1, min(c.parts, size) + 1)
             if size % n == 0 and (n == 1 or largest // n >= MIN_CHUNK_ELEMENTS))


def pipelined(c: Carry, call, operands, result_types, batch_dims, chunks: int) -> list:
  """The sequential stages as a wavefront over ``chunks`` chunks of the
  local batch: in stage ``s`` the devices at position ``q`` of the state's
  flow run chunk ``s - q`` from the state the previous position handed on
  for it, so ``parts + chunks - 1`` stages of a chunk each replace
  ``parts`` stages of the whole batch, and ``chunks`` devices along the
  dim work at once instead of one. Each chunk still runs part after part
  from the exact state the previous part ended in: the same operations as
  unpipelined."""
  k, j = c.scan.state
  operand_dims, result_dims = batch_dims
  flow = c.flow()
  position = np.zeros_like(c.part)
  for device, part in enumerate(c.part):
    position[device] = flow.index(int(part))
  shapes = [list(ir.RankedTensorType(t).shape) for t in result_types]
  size = next(s[dim] for s, dim in zip(shapes, result_dims) if dim is not None)
  step = size // chunks
  chunk_types = [t if dim is None else ir.RankedTensorType.get(
      [step if a == dim else n for a, n in enumerate(s)], ir.RankedTensorType(t).element_type)
                 for t, s, dim in zip(result_types, shapes, result_dims)]
  first = emit.compare(emit.partition_scalar((position == 0).astype(np.int64)),
                       emit.int64(1), "EQ")
  pairs = np.asarray([(g[flow[q]], g[flow[q + 1]]) for g in c.groups
                      for q in range(c.parts - 1)], np.int64)
  outs = [emit.splat(0, t) for t in result_types]
  arrived = emit.splat(0, chunk_types[j])
  stages = c.parts + chunks - 1
  for stage in range(stages):
    chunk = stage - position
    active = ((chunk >= 0) & (chunk < chunks)).astype(np.int64)
    offset = emit.partition_scalar(np.clip(chunk, 0, chunks - 1) * step)
    index = emit.partition_index(active)
    case = hlo.CaseOp([*result_types, chunk_types[j]], index, 2)
    with ir.InsertionPoint(case.regions[0].blocks.append()):
      hlo.return_([*outs, emit.splat(0, chunk_types[j])])
    with ir.InsertionPoint(case.regions[1].blocks.append()):
      ops = [o if dim is None or ir.RankedTensorType(o.type).shape[dim] != size
             else emit.slice_along(o, dim, offset, step) for o, dim in zip(operands, operand_dims)]
      ops[k] = hlo.select(first, ops[k], arrived)
      res = call(ops, chunk_types)
      hlo.return_([*(r if dim is None else emit.update_along(o, r, dim, offset)
                     for o, r, dim in zip(outs, res, result_dims)), res[j]])
    results: list = list(case.results)
    outs, sent = results[:-1], results[-1]
    if stage + 1 < stages:
      arrived = emit.collective_permute(sent, pairs)
  outs[j] = _from_last(c, outs[j], flow[-1])
  return list(outs)


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
  index = emit.partition_index(c.part)
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
    merge, apply = reg.merge, reg.apply
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
    index = emit.partition_index(c.part == part)
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
      arrives = emit.compare(mine, emit.int64(following), "EQ")
      state = hlo.select(arrives, sent, state)
  outs[j] = _from_last(c, outs[j], flow[-1])
  return outs


def _from_last(c: Carry, state, last: int):
  """The final ``state`` of the devices holding part ``last``, on every
  device: one all-gather of the state-sized results along the dim."""
  shape = list(ir.RankedTensorType(state.type).shape)
  (gathered,) = emit.all_gather([emit.reshaped(state, [1, *shape])], 0, c.groups)
  return emit.reshaped(emit.static_slice_along(gathered, 0, last, last + 1), shape)
