"""Named combiners: ``reduce={"n": "argmax" | "argmin" | "max_k" | "min_k" | "logsumexp"}``.

A combiner is a reduction whose results are not each combined on their
own: they are read together, in result order.

- ``"argmax"``, ``"argmin"``: results ``(value, index)``, the index local to
  the part the call saw. Combined: NumPy's argmax (argmin) over the whole
  dim, the lowest global index among ties and the first NaN over any number;
  the value is the extreme value (NaN where a NaN wins).
- ``"max_k"``, ``"min_k"``: results ``(values, indices)`` of one shape,
  holding k at the core dim no operand has (``Reduction.k_dims``), the
  values sorted (descending for max_k, ascending for
  min_k; NaNs first, as they win argmax and argmin) and the indices local
  to the part. Combined: the k best of every part's candidates with their
  global indices, ties to the lower global index (a stable sort of the
  whole dim). A dim is split only into parts of at least k.
- ``"logsumexp"``: results ``(m_1, ..., m_j, lse)``, ``lse`` the part's
  log-normaliser and each ``m_i`` an average over the part weighted by
  ``exp(. - lse)`` (an attention output), with ``lse``'s batch dims and
  core dims that start with ``lse``'s in core order (``lse_dims``).
  Combined: ``lse = logsumexp_p(lse_p)``,
  ``m_i = sum_p exp(lse_p - lse) m_i,p``; a part with ``lse = -inf`` adds
  nothing, and where every part has it the results are ``lse = -inf`` and
  ``m_i = 0``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from batchpart._vocab.dims.core import absolute_dim, core_dims, core_shape
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
  """An index result (argmax, argmin, max_k, min_k, a Combiner's
  ``index_results``) counts along one dim: refuses several."""
  if isinstance(op, Combiner) and op.index_results and len(names) > 1:
    raise ValueError(f"{owner}: reduce {op!r} over the dims {', '.join(names)}: its "
                     f"index_results {op.index_results} would count positions along one "
                     "dim, and which one cannot be told; declare a Combiner with index "
                     "results on one dim only (or one without them over several).")
  if op in INDEX_COMBINERS and len(names) > 1:
    raise ValueError(f"{owner}: reduce '{op}' over the dims {', '.join(names)}: an index "
                     f"result counts along one dim; declare '{op}' on one dim only.")


@dataclasses.dataclass(frozen=True)
class ResultDims:
  """One combining result as the checks read it: its index among the call's
  results, its shape, its core dims before (``lead``) and after (``core``)
  its batch dims, and its dtype."""
  index: int
  shape: tuple[int, ...]
  lead: int
  core: int
  dtype: Any

  @property
  def core_shape(self) -> tuple[int, ...]:
    return core_shape(self.shape, self.lead, self.core)

  @property
  def batch_shape(self) -> tuple[int, ...]:
    return self.shape[self.lead:len(self.shape) - self.core]


def lse_dims(average: tuple[int, int, int], lse: tuple[int, int]) -> list[int]:
  """Where each dim of a logsumexp's ``lse`` lies in an average's: batch dims
  on batch dims, and the lse's core dims on the average's first core dims
  in core order. The average is given as ``(rank, lead, core)``, the lse as
  ``(lead, core)``."""
  (rank, lead, core), (lse_lead, lse_core) = average, lse
  cores = core_dims(rank, lead, core)
  batch = rank - lead - core
  out = [cores[j] for j in range(lse_lead)]
  out += [lead + b for b in range(batch)]
  out += [cores[lse_lead + j] for j in range(lse_core)]
  return out


def check_combining_results(owner: str, op: str | Combiner, dims: str, results,
                            k_dims=()) -> None:
  """Refuses results (``ResultDims``, the combining ones in order) that do
  not fit combiner ``op`` over the dim(s) ``dims``: their number, dtypes and
  shapes, read by declared core position; ``k_dims``: where a top-k's
  results hold k, as (result, core axis) pairs."""
  results = [dataclasses.replace(r, dtype=np.dtype(r.dtype)) for r in results]
  where = f"{owner}: reduce {op if isinstance(op, Combiner) else repr(op)} over the dim(s) {dims}"
  if isinstance(op, Combiner):
    check_index_results(where, op, [r.dtype for r in results])
  elif op in INDEX_COMBINERS:
    _check_index_results(where, op, results, dict(k_dims))
  else:
    _check_logsumexp_results(where, results)


def _check_index_results(where: str, op: str, results, k_dims: dict[int, int]) -> None:
  names = ("value", "index") if op in ARG_COMBINERS else ("values", "indices")
  if len(results) != 2:
    raise ValueError(f"{where} needs exactly two results, ({', '.join(names)}); the call "
                     f"has {len(results)}.")
  value, index = results
  if value.dtype == np.bool_ or np.issubdtype(value.dtype, np.complexfloating):
    raise ValueError(f"{where}: result {value.index} (the {names[0]}) has dtype "
                     f"{value.dtype.name}, which has no order to take an extreme in.")
  if not np.issubdtype(index.dtype, np.integer):
    raise ValueError(f"{where}: result {index.index} (the {names[1]}) has dtype "
                     f"{index.dtype.name}; it must be an integer dtype.")
  if (value.shape, value.lead, value.core) != (index.shape, index.lead, index.core):
    raise ValueError(f"{where}: result {value.index} (the {names[0]}) has shape "
                     f"{value.shape} and result {index.index} (the {names[1]}) "
                     f"{index.shape}, with their core dims at different places; they must "
                     "be the same.")
  if op not in TOP_K_COMBINERS:
    return
  if value.index not in k_dims or index.index not in k_dims:
    raise ValueError(f"{where}: result {value.index} (the values) has no core dim k that "
                     "no operand has, to hold each part's k candidates; declare it in the "
                     "signature, e.g. '(n)->(k),(k)'.")
  if k_dims[value.index] != k_dims[index.index]:
    raise ValueError(f"{where}: the values (result {value.index}) and the indices (result "
                     f"{index.index}) hold k at different core axes "
                     f"({k_dims[value.index]} and {k_dims[index.index]}); they must be the "
                     "same.")
  k = value.shape[absolute_dim(k_dims[value.index], len(value.shape))]
  if k < 1:
    raise ValueError(f"{where}: result {value.index} (the values) has shape {value.shape} "
                     f"with k = {k}; k must be >= 1, the candidates kept.")


def min_part(reduction, result_shapes) -> int:
  """The smallest part of the reduced dim a device may see: k for max_k and
  min_k (each part must give k candidates), 1 otherwise."""
  if reduction is None or reduction.op not in TOP_K_COMBINERS or not reduction.k_dims:
    return 1
  i, axis = reduction.k_dims[0]
  return int(result_shapes[i][absolute_dim(axis, len(result_shapes[i]))])


def _check_logsumexp_results(where: str, results) -> None:
  if not results:
    raise ValueError(f"{where} needs at least one result, (m_1, ..., m_j, lse); the call "
                     "has none.")
  lse = results[-1]
  if not _is_real_float(lse.dtype):
    raise ValueError(f"{where}: result {lse.index} (the lse) has dtype {lse.dtype.name}; "
                     "it must be a real floating dtype.")
  for m in results[:-1]:
    if not (_is_real_float(m.dtype) or np.issubdtype(m.dtype, np.complexfloating)):
      raise ValueError(f"{where}: result {m.index} has dtype {m.dtype.name}; a weighted "
                       "average must be floating or complex.")
    if m.core_shape[:len(lse.core_shape)] != lse.core_shape:
      raise ValueError(f"{where}: result {m.index} has shape {m.shape}, which does not "
                       f"start with the lse's (result {lse.index}) shape {lse.shape} in its "
                       f"core dims ({m.core_shape} against {lse.core_shape}).")


def _is_real_float(dtype: np.dtype) -> bool:
  """Real floating, bfloat16 and the other ml_dtypes floats included."""
  return np.issubdtype(dtype, np.floating) or (
      dtype.kind == "V" and "float" in dtype.name)
