"""``jax.numpy`` functions a call's description names by digest: a
``bp.Combiner``'s merge (``dims/user_combiner``), a parallel ``bp.Scan``'s
merge and apply (``dims/scan``).

The per-device module runs them, apart from the program they were declared
in. So when a call is lowered they are traced on one batch element's types,
refused where they close over values traced in that program (those do not
exist where they run), and named ``<prefix><digest of the lowered text>``:
the derived name carries that name, jax's caches see a changed function as
a new call, and the per-device module looks the function up by name
(``Registry.get``).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax
import numpy as np

from batchpart import _compat as compat

T = TypeVar("T")


class Registry(Generic[T]):
  """The functions of one kind lowered in this process: ``<prefix><digest>``
  -> what the per-device module needs of them (``T``)."""

  def __init__(self, prefix: str, uses: str):
    """``uses``: how a call uses one, for messages ("merges its parts with
    the Combiner")."""
    self.prefix, self._uses = prefix, uses
    self._pattern = re.compile(rf"^{re.escape(prefix)}[0-9a-f]{{16}}$")
    self._lock = threading.Lock()
    self._by_name: dict[str, T] = {}
    # A call lowered again describes its function again: the name of one
    # already lowered on these types is looked up, not traced.
    self._by_key: dict[Any, str] = {}

  def is_name(self, op) -> bool:
    return isinstance(op, str) and bool(self._pattern.match(op))

  def name(self, key, lower: Callable[[], tuple[str, T]]) -> str:
    """The name of the function ``key`` stands for; ``lower()`` (called once
    per key) checks and lowers it, returning its lowered text and entry."""
    with self._lock:
      if key in self._by_key:
        return self._by_key[key]
    text, entry = lower()
    name = self.prefix + hashlib.sha256(text.encode()).hexdigest()[:16]
    with self._lock:
      self._by_name.setdefault(name, entry)
      self._by_key[key] = name
    return name

  def get(self, name: str, target: str) -> T:
    """The entry lowered under ``name``.

    Raises:
      ValueError: naming ``target``, where this process never lowered it (a
        module exported elsewhere: call the function that declares it here
        first).
    """
    with self._lock:
      found = self._by_name.get(name)
    if found is None:
      raise ValueError(f"batchpart: the call to '{target}' {self._uses} '{name}', which "
                       "this process has not declared; call the function that declares it "
                       "here first (its functions are traced in this process).")
    return found


def lowered_text(fn: Callable, *types) -> str:
  """``fn`` lowered on ``types``, under one name whatever ``fn``'s is."""
  def function(*args):
    return fn(*args)
  return jax.jit(function).lower(*types).as_text()


def check_closure(where: str, what: str, fn: Callable, *types) -> None:
  """Refuses ``fn`` (``what``: "the Combiner's merge") where it closes over
  values traced in the program being lowered. A function that fails to trace
  is left to the caller's own checks, which say why."""
  try:
    jaxpr = jax.make_jaxpr(fn)(*types)
  except Exception:
    return
  traced = [c for c in jaxpr.consts if isinstance(c, compat.Tracer)]
  if traced:
    raise ValueError(
        f"{where}: {what} closes over {len(traced)} traced value(s) "
        f"{fmt(tuple(c.aval for c in traced))}, computed inside the function being traced; "
        "it runs in the per-device module, apart from them. Close over constants instead "
        "(Python numbers, NumPy arrays), or return the values as results of the call.")


def check_same(where: str, what: str, out, types) -> None:
  """Refuses ``out`` (what ``what`` returned) unless it is a tuple of
  ``types``' shapes and dtypes."""
  if not isinstance(out, (tuple, list)) or len(out) != len(types):
    raise ValueError(f"{where}: {what} returns {fmt(out)}; it must return a tuple like its "
                     f"inputs, {fmt(types)}.")
  for i, (o, t) in enumerate(zip(out, types)):
    if not hasattr(o, "shape") or tuple(o.shape) != tuple(t.shape) or np.dtype(
        o.dtype) != np.dtype(t.dtype):
      raise ValueError(f"{where}: {what} returns result {i} as {fmt(o)}; it must keep the "
                       f"input's {fmt(t)}.")


def fmt(value) -> str:
  """Types (or a tree of them) as ``float32[4, 2]``."""
  if isinstance(value, (tuple, list)):
    return "(" + ", ".join(fmt(v) for v in value) + ")"
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return f"{np.dtype(value.dtype).name}{list(value.shape)}"
  return type(value).__name__
