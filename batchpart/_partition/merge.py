"""A ``bp.Combiner``'s merge in the per-device module.

Each device gathers every part's combining results (one all-gather), then
folds them in part order with the user's merge, vmapped over the batch
dims. The fold is a ``jax.numpy`` function lowered into the module
(``emit.jax_function``).
"""

from __future__ import annotations

import jax
import numpy as np

from batchpart import _compat as compat
from batchpart._partition import emit
from batchpart._vocab.dims.user_combiner import Registered

ir = compat.ir


def part_order(groups, part_offsets) -> list[int]:
  """The gathered slots in part order: the same for every group, since the
  plan's groups all run over the same mesh axes."""
  orders = {tuple(int(i) for i in np.argsort([part_offsets[d] for d in g], kind="stable"))
            for g in groups}
  if len(orders) != 1:
    raise AssertionError(f"reduce groups {groups} disagree on the order of their parts")
  return list(orders.pop())


def fold(reg: Registered, results, groups, order) -> list:
  """``results`` (this device's combining results, index results already
  global) merged over each device group, parts in ``order``."""
  shapes = [list(ir.RankedTensorType(r.type).shape) for r in results]
  lifted = [emit.reshaped(r, [1, *s]) for r, s in zip(results, shapes)]
  gathered = emit.all_gather(lifted, 0, groups)
  batch_rank = len(shapes[0]) - len(reg.element_types[0].shape)

  def merge_parts(*parts):
    merge = reg.combiner.merge
    for _ in range(batch_rank):
      merge = jax.vmap(merge)
    acc = tuple(p[order[0]] for p in parts)
    for j in order[1:]:
      acc = tuple(merge(acc, tuple(p[j] for p in parts)))
    return acc

  types = [jax.ShapeDtypeStruct((len(order), *s), t.dtype)
           for s, t in zip(shapes, reg.element_types)]
  return emit.jax_function(merge_parts, types, gathered, [r.type for r in results],
                           x64=reg.x64)
