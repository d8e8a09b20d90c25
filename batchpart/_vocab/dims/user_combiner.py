"""A user's own combiner: ``reduce={"n": bp.Combiner(merge, index_results=...)}``.

``merge(a, b)`` takes two tuples of one batch element's combining results
(those without the reduced dim, in result order) and returns one such
tuple: associative, written in ``jax.numpy``. batchpart applies it, vmapped
over the batch dims, to the parts in order along the dim (``a`` earlier),
inside the compiled program. ``index_results`` lists the results that hold
indices into the dim: each part's global offset is added to them first, so
the kernel returns part-local indices.

A combiner is identified by what it computes: when a call is lowered, the
merge is lowered on one element's shapes and the digest of that text names
it (``merge_<digest>`` in the derived name), so the partition cache and
jax's persistent cache see a changed merge as a new call. The per-device
module looks the merge up by that digest (``registered``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from collections.abc import Callable, Sequence

import jax
import numpy as np

from batchpart import _compat as compat

OP_PREFIX = "merge_"
OP_NAME = re.compile(r"^merge_[0-9a-f]{16}$")


class Combiner:
  """How the parts of a call's results over a reduced dim merge.

  Args:
    merge: ``merge(a, b) -> c``, each a tuple of one batch element's
      combining results (the results without the reduced dim, in order):
      associative, in ``jax.numpy``; ``a`` comes from the earlier part.
    index_results: positions (among the combining results) of results that
      hold indices into the reduced dim, local to the part the call saw;
      each part's global offset is added before merging.
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


_lock = threading.Lock()
_registry: dict[str, Registered] = {}
# Each call lowered describes its combiner again: the name of a combiner
# already lowered on these types (and x64 setting) is looked up, not traced.
_lowered: dict[tuple, str] = {}


def is_user_combiner(op) -> bool:
  return isinstance(op, Combiner) or (isinstance(op, str) and bool(OP_NAME.match(op)))


def check_index_results(where: str, combiner: Combiner, dtypes) -> None:
  """Refuses index results out of range or of a non-integer dtype."""
  for i in combiner.index_results:
    if i >= len(dtypes):
      raise ValueError(f"{where}: index_results names result {i}; the call has "
                       f"{len(dtypes)} combining result(s).")
    if not np.issubdtype(np.dtype(dtypes[i]), np.integer):
      raise TypeError(f"{where}: result {i} is an index result (index_results) but has "
                      f"dtype {np.dtype(dtypes[i]).name}; it must be an integer dtype.")


def check_closure(where: str, combiner: Combiner, element_types) -> None:
  """Refuses a merge that closes over traced values (arrays computed inside
  the function being traced): the per-device module runs the merge apart
  from the program those values live in. A merge that fails to trace is
  left to ``lowered_name``, which says why."""
  types = tuple(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in element_types)
  try:
    jaxpr = jax.make_jaxpr(combiner.merge)(types, types)
  except Exception:
    return
  traced = [c for c in jaxpr.consts if isinstance(c, compat.Tracer)]
  if traced:
    raise ValueError(
        f"{where}: the Combiner's merge closes over {len(traced)} traced value(s) "
        f"{_fmt(tuple(c.aval for c in traced))}, computed inside the function being "
        "traced; the merge runs in the per-device module, apart from them. Close over "
        "constants instead (Python numbers, NumPy arrays), or return the values as "
        "results of the call.")


def lowered_name(where: str, combiner: Combiner, element_types) -> str:
  """The op name ``merge_<digest>`` of ``combiner`` on one element's
  combining results ``element_types`` (ShapeDtypeStructs), registered for
  the per-device module.

  Raises:
    ValueError / TypeError: naming ``where`` and the result, if the merge
      fails to trace or returns another tree, shape or dtype.
  """
  types = tuple(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in element_types)
  x64 = bool(jax.config.read("jax_enable_x64"))
  key = (combiner, tuple((t.shape, np.dtype(t.dtype).str) for t in types), x64)
  with _lock:
    if key in _lowered:
      return _lowered[key]
  try:
    out = jax.eval_shape(combiner.merge, types, types)
  except Exception as e:
    raise ValueError(f"{where}: the Combiner's merge fails on two tuples of one batch "
                     f"element's combining results {_fmt(types)}: {e}") from e
  if not isinstance(out, (tuple, list)) or len(out) != len(types):
    raise ValueError(f"{where}: the Combiner's merge returns {_fmt(out)}; it must return a "
                     f"tuple like its inputs, {_fmt(types)}.")
  for i, (o, t) in enumerate(zip(out, types)):
    if not hasattr(o, "shape") or tuple(o.shape) != t.shape or np.dtype(o.dtype) != t.dtype:
      raise ValueError(f"{where}: the Combiner's merge returns result {i} as {_fmt(o)}; it "
                       f"must keep the input's {_fmt(t)}.")
  def merge(a, b):   # one name for every merge: the module's name is no part of it
    return combiner.merge(a, b)

  text = jax.jit(merge).lower(types, types).as_text()
  name = OP_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]
  with _lock:
    _registry.setdefault(name, Registered(combiner, types, x64))
    _lowered[key] = name
  return name


def registered(name: str, target: str) -> Registered:
  """The combiner lowered under ``name``.

  Raises:
    ValueError: naming ``target``, where this process never lowered it (a
      module exported elsewhere: call the function with the Combiner here
      first).
  """
  with _lock:
    found = _registry.get(name)
  if found is None:
    raise ValueError(f"batchpart: the call to '{target}' merges its parts with the Combiner "
                     f"'{name}', which this process has not declared; call the function "
                     "that declares it here first (its merge is traced in this process).")
  return found


def _fmt(value) -> str:
  if isinstance(value, (tuple, list)):
    return "(" + ", ".join(_fmt(v) for v in value) + ")"
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return f"{np.dtype(value.dtype).name}{list(value.shape)}"
  return type(value).__name__
