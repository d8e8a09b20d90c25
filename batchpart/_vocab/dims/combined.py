"""Named combiners: ``reduce={"n": "argmax" | "argmin" | "logsumexp"}``.

A combiner is a reduction whose results are not each combined on their
own: they are read together, in result order.

- ``"argmax"``, ``"argmin"``: results ``(value, index)``, the index local to
  the part the call saw. Combined: NumPy's argmax (argmin) over the whole
  dim, the lowest global index among ties and the first NaN over any number;
  the value is the extreme value (NaN where a NaN wins).
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

ARG_COMBINERS = ("argmax", "argmin")
COMBINERS = (*ARG_COMBINERS, "logsumexp")

# What the per-device module does after the call, for bp.explain.
_MERGES = {
    "argmax": "all-reduces of the largest value, a NaN flag and the lowest global index",
    "argmin": "all-reduces of the smallest value, a NaN flag and the lowest global index",
    "logsumexp": "all-reduces of the largest lse, the weights exp(lse - max) and the "
                 "weighted averages",
}


def is_combiner(op: str | None) -> bool:
  """Whether ``op`` reads the results together (not one all-reduce each)."""
  return op in COMBINERS


def merge_text(op: str) -> str:
  """How the parts of a combiner's results merge, in words."""
  return _MERGES[op]


def check_combiner_dims(owner: str, op: str, names) -> None:
  """An argmax or argmin indexes one dim: refuses several."""
  if op in ARG_COMBINERS and len(names) > 1:
    raise ValueError(f"{owner}: reduce '{op}' over the dims {', '.join(names)}: an index "
                     f"result counts along one dim; declare '{op}' on one dim only.")


def check_combining_results(owner: str, op: str, dims: str, shapes, dtypes) -> None:
  """Refuses results that do not fit combiner ``op`` over the dim(s) ``dims``:
  their number, dtypes and shapes."""
  shapes = [tuple(int(v) for v in s) for s in shapes]
  dtypes = [np.dtype(t) for t in dtypes]
  where = f"{owner}: reduce '{op}' over the dim(s) {dims}"
  if op in ARG_COMBINERS:
    _check_arg_results(where, shapes, dtypes)
  else:
    _check_logsumexp_results(where, shapes, dtypes)


def _check_arg_results(where: str, shapes, dtypes) -> None:
  if len(shapes) != 2:
    raise ValueError(f"{where} needs exactly two results, (value, index); the call has "
                     f"{len(shapes)}.")
  if dtypes[0] == np.bool_ or np.issubdtype(dtypes[0], np.complexfloating):
    raise ValueError(f"{where}: result 0 (the value) has dtype {dtypes[0].name}, which "
                     "has no order to take an extreme in.")
  if not np.issubdtype(dtypes[1], np.integer):
    raise ValueError(f"{where}: result 1 (the index) has dtype {dtypes[1].name}; it must "
                     "be an integer dtype.")
  if shapes[0] != shapes[1]:
    raise ValueError(f"{where}: result 0 (the value) has shape {shapes[0]} and result 1 "
                     f"(the index) {shapes[1]}; they must be the same.")


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
