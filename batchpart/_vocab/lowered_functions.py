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

A program exported with ``jax.export`` carries each such function, so that
another process runs it sharded without the Python code that declared it:
the call's op holds, by name, the function vmapped over one leading batch
dim of any size and exported by jax (``export_batched``: StableHLO in jax's
portable serialization, the same trust as the rest of the artifact), which
the process that loads the artifact registers (``Registry.adopt``) and
calls on one element as it would the Python function (``restore_batched``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from batchpart import _compat as compat

T = TypeVar("T")


class Registry(Generic[T]):
  """The functions of one kind lowered in this process: ``<prefix><digest>``
  -> what the per-device module needs of them (``T``)."""

  def __init__(self, prefix: str, uses: str, carry: Callable[[T, str], dict],
               restore: Callable[[dict], T]):
    """``uses``: how a call uses one, for messages ("merges its parts with
    the Combiner"); ``carry(entry, platform)``: the entry as JSON-able data
    for an exported program (its functions through ``export_batched``);
    ``restore``: the entry back from that data."""
    self.prefix, self._uses = prefix, uses
    self._carry, self._restore = carry, restore
    self._pattern = re.compile(rf"^{re.escape(prefix)}[0-9a-f]{{16}}$")
    self._lock = threading.Lock()
    self._by_name: dict[str, T] = {}
    # A call lowered again describes its function again: the name of one
    # already lowered on these types is looked up, not traced.
    self._by_key: dict[Any, str] = {}
    # What an exported program carries, exported once per name and platform;
    # an adopted entry keeps the text it came in (platform ""), which a
    # program that calls the artifact and is exported again carries on.
    self._carried: dict[tuple[str, str], str] = {}
    self._adopted: set[str] = set()

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
      if name in self._adopted:
        # What this process declares itself wins over what an artifact
        # brought under the same name: the name is not checked against it.
        self._adopted.discard(name)
        self._by_name.pop(name)
        self._carried.pop((name, ""), None)
      self._by_name.setdefault(name, entry)
      self._by_key[key] = name
    return name

  def get(self, name: str, target: str) -> T:
    """The entry lowered (or adopted) under ``name``.

    Raises:
      ValueError: naming ``target``, where this process never lowered it and
        no artifact brought it (one exported by a batchpart that did not
        carry its functions).
    """
    with self._lock:
      found = self._by_name.get(name)
    if found is None:
      raise ValueError(f"batchpart: the call to '{target}' {self._uses} '{name}', which "
                       "this process has not declared and the program does not carry (a "
                       "jax.export artifact from a batchpart that did not carry it); export "
                       "it again with this batchpart, or call the function that declares it "
                       "here first (its functions are traced in this process).")
    return found

  def carried(self, name: str, platform: str) -> str:
    """The JSON text an exported call carries for ``name``, its functions
    exported for ``platform`` (and callable on any)."""
    with self._lock:
      text = self._carried.get((name, platform)) or self._carried.get((name, ""))
    if text is not None:
      return text
    entry = self.get(name, name)
    text = json.dumps({"version": CARRIED_VERSION, **self._carry(entry, platform)},
                      sort_keys=True)
    with self._lock:
      return self._carried.setdefault((name, platform), text)

  def adopt(self, name: str, text: str, target: str) -> None:
    """Registers the entry ``text`` (what an artifact's call to ``target``
    carries) under ``name``, where this process has none.

    Raises:
      ValueError: naming ``target``, where ``name`` is not of this kind or
        ``text`` is not what ``carried`` writes.
    """
    with self._lock:
      if name in self._by_name:
        return
    try:
      if not self.is_name(name):
        raise ValueError(f"not a name of the form {self.prefix}<digest>")
      data = json.loads(text)
      if data.get("version") != CARRIED_VERSION:
        raise ValueError(f"format {data.get('version')!r}, this batchpart reads "
                         f"{CARRIED_VERSION}")
      entry = self._restore(data)
    except Exception as e:
      raise ValueError(f"batchpart: the exported call to '{target}' carries '{name}', "
                       f"which this batchpart cannot read: {e}") from e
    with self._lock:
      if name not in self._by_name:
        self._by_name[name] = entry
        self._adopted.add(name)
        self._carried[(name, "")] = text


# The format of what an exported call carries; a change that an older
# batchpart could misread gets a new number.
CARRIED_VERSION = 1


def export_batched(fn: Callable, platform: str, x64: bool, *element_types) -> str:
  """``fn``, a function of one batch element (``element_types``: its
  arguments, pytrees of ShapeDtypeStructs), vmapped over one leading batch
  dim of any size and exported by ``jax.export`` for ``platform``, callable
  on every platform (it is plain ``jax.numpy``); as base64 text."""
  (b,) = jax.export.symbolic_shape("b")
  batched = jax.tree.map(lambda t: jax.ShapeDtypeStruct((b, *t.shape), t.dtype),
                         element_types)
  with jax.enable_x64(x64):
    exported = jax.export.export(
        jax.jit(jax.vmap(fn)), platforms=(platform,),
        disabled_checks=[jax.export.DisabledSafetyCheck.platform()])(*batched)
  return base64.b64encode(exported.serialize()).decode("ascii")


def restore_batched(text: str) -> tuple[Callable, tuple]:
  """The function ``export_batched`` wrote as ``text``: callable on one
  batch element and vmappable, as the function it was exported from; and
  that element's argument types."""
  exported = jax.export.deserialize(bytearray(base64.b64decode(text, validate=True)))
  element = [jax.ShapeDtypeStruct(tuple(a.shape[1:]), a.dtype) for a in exported.in_avals]
  args, _ = jax.tree.unflatten(exported.in_tree, element)
  return _vmappable(exported), tuple(args)


def _vmappable(exported) -> Callable:
  """``exported`` (over one leading batch dim) as a function of arguments
  with any number of leading batch dims, none included; each ``vmap`` of it
  adds one (a ``custom_vmap`` whose rule calls it again)."""
  element_rank = len(exported.in_avals[0].shape) - 1

  @jax.custom_batching.custom_vmap
  def call(*args):
    leaves, tree = jax.tree.flatten(args)
    lead = tuple(leaves[0].shape[:leaves[0].ndim - element_rank])
    n = math.prod(lead)
    if n == 0:   # the artifact takes a batch of one or more
      outs = [jnp.zeros((*lead, *a.shape[1:]), a.dtype) for a in exported.out_avals]
    else:
      flat = [jnp.reshape(x, (n, *x.shape[len(lead):])) for x in leaves]
      outs = jax.tree.leaves(exported.call(*jax.tree.unflatten(tree, flat)))
      outs = [jnp.reshape(o, (*lead, *o.shape[1:])) for o in outs]
    return jax.tree.unflatten(exported.out_tree, outs)

  @call.def_vmap
  def rule(axis_size, in_batched, *args):
    args = jax.tree.map(lambda x, batched: x if batched else jnp.broadcast_to(
        x, (axis_size, *x.shape)), args, tuple(in_batched))
    out = call(*args)
    return out, jax.tree.map(lambda _: True, out)

  return call


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
