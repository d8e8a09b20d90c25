"""A ``bp.Combiner``'s merge in the per-device module.

Each device gathers every part's combining results (one all-gather), then
folds them in part order with the user's merge, vmapped over the batch
dims. Over several reduced dims the parts form a grid, folded in
lexicographic order of their starts, the first declared dim major: with a
merge that combines the parts along each dim on its own, any bracketing of
that sequence is the merge of whole rows, so the fold is the unsharded
answer. The fold is a ``jax.numpy`` function lowered into the module
(``emit.jax_function``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from batchpart import _compat as compat
from batchpart._partition import emit
from batchpart._vocab.dims.core import core_dims
from batchpart._vocab.dims.user_combiner import Registered

ir = compat.ir


def part_order(groups, part_offsets) -> list[int]:
  """The gathered slots in part order (``part_offsets[dim][partition]``:
  lexicographic in the dims' starts, the first dim major): the same for
  every group, since the plan's groups all run over the same mesh axes."""
  offsets = np.asarray(part_offsets).reshape(-1, np.shape(part_offsets)[-1])
  # lexsort's last key is the primary one.
  orders = {tuple(int(i) for i in np.lexsort(offsets[::-1][:, list(g)])) for g in groups}
  if len(orders) != 1:
    raise AssertionError(f"reduce groups {groups} disagree on the order of their parts")
  return list(orders.pop())


def batch_first(rank: int, lead: int, core: int) -> list[int]:
  """The permutation that puts an array's batch dims in front of its core
  dims (those in core order: ``core_dims``), as the merge sees them."""
  return [*range(lead, rank - core), *core_dims(rank, lead, core)]


def fold(reg: Registered, results, layouts, groups, order) -> list:
  """``results`` (this device's combining results, index results already
  global; ``layouts``: each one's ``(lead, core)`` ranks) merged over each
  device group, parts in ``order``."""
  shapes = [list(ir.RankedTensorType(r.type).shape) for r in results]
  lifted = [emit.reshaped(r, [1, *s]) for r, s in zip(results, shapes)]
  gathered = emit.all_gather(lifted, 0, groups)
  batch_rank = len(shapes[0]) - len(reg.element_types[0].shape)
  perms = [batch_first(len(s), lead, core) for s, (lead, core) in zip(shapes, layouts)]

  def merge_parts(*parts):
    merge = reg.combiner.merge
    for _ in range(batch_rank):
      merge = jax.vmap(merge)
    parts = [jnp.transpose(p, [0, *(d + 1 for d in perm)]) for p, perm in zip(parts, perms)]
    acc = tuple(p[order[0]] for p in parts)
    for j in order[1:]:
      acc = tuple(merge(acc, tuple(p[j] for p in parts)))
    return tuple(jnp.transpose(a, tuple(int(d) for d in np.argsort(perm)))
                 for a, perm in zip(acc, perms))

  types = [jax.ShapeDtypeStruct((len(order), *s), t.dtype)
           for s, t in zip(shapes, reg.element_types)]
  return emit.jax_function(merge_parts, types, gathered, [r.type for r in results],
                           x64=reg.x64)
