"""Named combiners: ``reduce={"n": "argmax" | "argmin" | "max_k" | "min_k" | "logsumexp"}``.

A combiner is a reduction whose results are not each combined on their
own: they are read together, in result order.

- ``"argmax"``, ``"argmin"``: results ``(value, index)``, the index local to
  the part the call saw. Combined: NumPy's argmax (argmin) over the whole
  dim, the lowest global index among ties and the first NaN over any number;
  the value is the extreme value (NaN where a NaN wins).
- ``"max_k"``, ``"min_k"``: results ``(values, indices)`` of one shape
  ``(..., k)``, the values sorted (descending for max_k, ascending for
  min_k; NaNs first, as they win argmax and argmin) and the indices local
  to the part. Combined: the k best of every part's candidates with their
  global indices, ties to the lower global index (a stable sort of the
  whole dim). A dim is split only into parts of at least k.
- ``"logsumexp"``: results ``(m_1, ..., m_j, lse)``, ``lse`` the part's
  log-normaliser and each ``m_i`` an average over the part weighted by
  ``exp(. - lse)`` (an attention output), its shape ``lse``'s followed by
  any trailing dims. Combined: ``lse = logsumexp_p(lse_p)``,
  ``m_i = sum_p exp(lse_p - lse) m_i,p``; a part with ``lse = -inf`` adds
  nothing, and where every part has it the results are ``lse = -inf`` and
  ``m_i = 0``.
"""

from __future__ import annotations

import numpy as np

from batchpart._vocab.dims.user_combiner import (
  OP_PREFIX,
  Combiner,
  check_index_results,
  is_user_combiner,
)

ARG_COMBINERS = ("argmax", "argmin")
TOP_K_COMBINERS = ("max_k", "min_k")
# The combiners with an index result, which counts along one dim.
INDEX_COMBINERS = (*ARG_COMBINERS, *TOP_K_COMBINERS)
COMBINERS = (*INDEX_COMBINERS, "logsumexp")

# What the per-device module does after the call, for bp.explain.
_MERGES = {
    "argmax": "all-reduces of the largest value, a NaN flag and the lowest global index",
    "argmin": "all-reduces of the smallest value, a NaN flag and the lowest global index",
    "max_k": "an all-gather of each part's k largest values and global indices, then a "
             "sort by (value, index) keeping k",
    "min_k": "an all-gather of each part's k smallest values and global indices, then a "
             "sort by (value, index) keeping k",
    "logsumexp": "all-reduces of the largest lse, the weights exp(lse - max) and the "
                 "weighted averages",
}


def is_combiner(op) -> bool:
  """Whether ``op`` reads the results together (not one all-reduce each)."""
  return op in COMBINERS or is_user_combiner(op)


def gathers(op) -> bool:
  """Whether ``op``'s merge starts with an all-gather of the parts' results
  (max_k, min_k, a Combiner) rather than all-reduces."""
  return op in TOP_K_COMBINERS or is_user_combiner(op)


def merge_text(op: str) -> str:
  """How the parts of a combiner's results merge, in words."""
  if is_user_combiner(op):
    return (f"an all-gather of each part's combining results, then the Combiner's merge "
            f"({op.removeprefix(OP_PREFIX)}) over the parts in order")
  return _MERGES[op]


def check_combiner_dims(owner: str, op: str, names) -> None:
  """An index result (argmax, argmin, max_k, min_k) counts along one dim:
  refuses several."""
  if isinstance(op, Combiner) and len(names) > 1:
    raise ValueError(f"{owner}: reduce {op!r} over the dims {', '.join(names)}: a Combiner "
                     "merges the parts of one dim in order; declare it on one dim only.")
  if op in INDEX_COMBINERS and len(names) > 1:
    raise ValueError(f"{owner}: reduce '{op}' over the dims {', '.join(names)}: an index "
                     f"result counts along one dim; declare '{op}' on one dim only.")


def check_combining_results(owner: str, op: str | Combiner, dims: str, shapes,
                            dtypes) -> None:
  """Refuses results that do not fit combiner ``op`` over the dim(s) ``dims``:
  their number, dtypes and shapes."""
  shapes = [tuple(int(v) for v in s) for s in shapes]
  dtypes = [np.dtype(t) for t in dtypes]
  where = f"{owner}: reduce {op if isinstance(op, Combiner) else repr(op)} over the dim(s) {dims}"
  if isinstance(op, Combiner):
    check_index_results(where, op, dtypes)
  elif op in INDEX_COMBINERS:
    _check_index_results(where, op, shapes, dtypes)
  else:
    _check_logsumexp_results(where, shapes, dtypes)


def _check_index_results(where: str, op: str, shapes, dtypes) -> None:
  names = ("value", "index") if op in ARG_COMBINERS else ("values", "indices")
  if len(shapes) != 2:
    raise ValueError(f"{where} needs exactly two results, ({', '.join(names)}); the call "
                     f"has {len(shapes)}.")
  if dtypes[0] == np.bool_ or np.issubdtype(dtypes[0], np.complexfloating):
    raise ValueError(f"{where}: result 0 (the {names[0]}) has dtype {dtypes[0].name}, "
                     "which has no order to take an extreme in.")
  if not np.issubdtype(dtypes[1], np.integer):
    raise ValueError(f"{where}: result 1 (the {names[1]}) has dtype {dtypes[1].name}; it "
                     "must be an integer dtype.")
  if shapes[0] != shapes[1]:
    raise ValueError(f"{where}: result 0 (the {names[0]}) has shape {shapes[0]} and "
                     f"result 1 (the {names[1]}) {shapes[1]}; they must be the same.")
  if op in TOP_K_COMBINERS and (not shapes[0] or shapes[0][-1] < 1):
    raise ValueError(f"{where}: result 0 (the values) has shape {shapes[0]}; it must end "
                     "in k >= 1, the candidates kept.")


def min_part(op: str | Combiner | None, result_shapes) -> int:
  """The smallest part of the reduced dim a device may see: k for max_k and
  min_k (each part must give k candidates), 1 otherwise."""
  if op in TOP_K_COMBINERS and result_shapes and len(result_shapes[0]):
    return int(result_shapes[0][-1])
  return 1


def _check_logsumexp_results(where: str, shapes, dtypes) -> None:
  if not shapes:
    raise ValueError(f"{where} needs at least one result, (m_1, ..., m_j, lse); the call "
                     "has none.")
  last = len(shapes) - 1
  if not _is_real_float(dtypes[last]):
    raise ValueError(f"{where}: result {last} (the lse) has dtype {dtypes[last].name}; it "
                     "must be a real floating dtype.")
  lse = shapes[last]
  for i, (shape, dtype) in enumerate(zip(shapes[:last], dtypes[:last])):
    if not (_is_real_float(dtype) or np.issubdtype(dtype, np.complexfloating)):
      raise ValueError(f"{where}: result {i} has dtype {dtype.name}; a weighted average "
                       "must be floating or complex.")
    if shape[:len(lse)] != lse:
      raise ValueError(f"{where}: result {i} has shape {shape}, which does not start with "
                       f"the lse's (result {last}) shape {lse}.")


def _is_real_float(dtype: np.dtype) -> bool:
  """Real floating, bfloat16 and the other ml_dtypes floats included."""
  return np.issubdtype(dtype, np.floating) or (
      dtype.kind == "V" and "float" in dtype.name)
