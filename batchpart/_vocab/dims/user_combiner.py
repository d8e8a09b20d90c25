"""A user's own combiner: ``reduce={"n": bp.Combiner(merge, index_results=...)}``.

``merge(a, b)`` takes two tuples of one batch element's combining results
(those without the reduced dim, in result order) and returns one such
tuple: associative, written in ``jax.numpy``. batchpart applies it, vmapped
over the batch dims, to the parts in order along the dim (``a`` earlier),
inside the compiled program. One Combiner may name several dims: the grid of
parts is folded in order, the first declared dim major (``_partition/merge``).
``index_results`` lists the results that hold indices into the dim (one dim
only): each part's global offset is added to them first, so the kernel
returns part-local indices.

A combiner is identified by what it computes: when a call is lowered, the
merge is lowered on one element's shapes and the digest of that text names
it (``merge_<digest>`` in the derived name), so the partition cache and
jax's persistent cache see a changed merge as a new call. The per-device
module looks the merge up by that digest (``registered``); an exported
program carries it (``lowered_functions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

from batchpart._vocab.lowered_functions import (
  Registry,
  check_closure,
  check_same,
  export_batched,
  fmt,
  lowered_text,
  restore_batched,
)

OP_PREFIX = "merge_"


class Combiner:
  """How the parts of a call's results over a reduced dim merge.

  Args:
    merge: ``merge(a, b) -> c``, each a tuple of one batch element's
      combining results (the results without the reduced dim, in order):
      associative, in ``jax.numpy``; ``a`` comes from the earlier part. Over
      several dims it merges the parts along each dim on its own, and the
      grid of parts is folded in order, the first declared dim major.
    index_results: positions (among the combining results) of results that
      hold indices into the reduced dim, local to the part the call saw;
      each part's global offset is added before merging. Only over one dim.
  """

  def __init__(self, merge: Callable, *, index_results: Sequence[int] = ()) -> None:
    if not callable(merge):
      raise TypeError(f"batchpart.Combiner: merge must be callable, got {type(merge).__name__}.")
    self.merge = merge
    self.index_results = tuple(int(i) for i in index_results)
    if len(set(self.index_results)) != len(self.index_results) or any(
        i < 0 for i in self.index_results):
      raise ValueError(f"batchpart.Combiner: index_results={index_results!r} must be "
                       "distinct non-negative result positions.")

  def __repr__(self):
    name = getattr(self.merge, "__qualname__", type(self.merge).__name__)
    return f"Combiner({name}, index_results={self.index_results})"


@dataclasses.dataclass(frozen=True)
class Registered:
  """A lowered combiner: the merge, its index results, one element's result
  types, and whether 64-bit types were on when it was lowered (the
  per-device module traces it again the same way)."""
  combiner: Combiner
  element_types: tuple[jax.ShapeDtypeStruct, ...]
  x64: bool


def _carry(reg: Registered, platform: str) -> dict:
  """What an exported call carries of ``reg``: the merge exported, its
  index results and 64-bit mode."""
  types = reg.element_types
  return {"merge": export_batched(reg.combiner.merge, platform, reg.x64, types, types),
          "index_results": list(reg.combiner.index_results), "x64": reg.x64}


def _restore(data: dict) -> Registered:
  """The combiner ``_carry`` wrote, its merge the exported one."""
  merge, (types, _) = restore_batched(data["merge"])
  return Registered(Combiner(merge, index_results=data["index_results"]), tuple(types),
                    bool(data["x64"]))


COMBINERS: Registry[Registered] = Registry(OP_PREFIX, "merges its parts with the Combiner",
                                           _carry, _restore)


def is_user_combiner(op) -> bool:
  return isinstance(op, Combiner) or COMBINERS.is_name(op)


def check_index_results(where: str, combiner: Combiner, dtypes) -> None:
  """Refuses index results out of range or of a non-integer dtype."""
  for i in combiner.index_results:
    if i >= len(dtypes):
      raise ValueError(f"{where}: index_results names result {i}; the call has "
                       f"{len(dtypes)} combining result(s).")
    if not np.issubdtype(np.dtype(dtypes[i]), np.integer):
      raise TypeError(f"{where}: result {i} is an index result (index_results) but has "
                      f"dtype {np.dtype(dtypes[i]).name}; it must be an integer dtype.")


def lowered_name(where: str, combiner: Combiner, element_types) -> str:
  """The op name ``merge_<digest>`` of ``combiner`` on one element's
  combining results ``element_types`` (ShapeDtypeStructs), registered for
  the per-device module.

  Raises:
    ValueError: naming ``where`` and the result, if the merge closes over
      traced values, fails to trace or returns another tree, shape or dtype.
  """
  types = tuple(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in element_types)
  x64 = bool(jax.config.read("jax_enable_x64"))
  what = "the Combiner's merge"

  def lower() -> tuple[str, Registered]:
    check_closure(where, what, combiner.merge, types, types)
    try:
      out = jax.eval_shape(combiner.merge, types, types)
    except Exception as e:
      raise ValueError(f"{where}: {what} fails on two tuples of one batch element's "
                       f"combining results {fmt(types)}: {e}") from e
    check_same(where, what, out, types)
    # The index results are part of what the name stands for: the same
    # merge with others offsets other results.
    text = (f"{lowered_text(combiner.merge, types, types)}\n"
            f"index_results={list(combiner.index_results)}")
    return text, Registered(combiner, types, x64)

  return COMBINERS.name((combiner, tuple((t.shape, np.dtype(t.dtype).str) for t in types),
                         x64), lower)


def registered(name: str, target: str) -> Registered:
  """The combiner lowered under ``name`` (raises ``ValueError`` naming
  ``target`` where this process never lowered it)."""
  return COMBINERS.get(name, target)
