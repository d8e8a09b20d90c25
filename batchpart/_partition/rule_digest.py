"""A content digest of a per-shard attribute rule.

A rule is identified by what it computes, not by a name two users could
share: the digest covers its code (and the code of every function it
defines), its defaults, the values its closure captures and the module
globals it reads, recursively through the functions those are. It goes into
the derived target name, so the partition cache and jax's persistent
compilation cache see a new name whenever a rule changes (a bug fix, two
closures of one factory, a package upgrade).

Values are digested by content: scalars, strings, bytes, NumPy arrays and
dtypes, containers of them, functions, ``functools.partial``, methods,
modules and classes (by name), and plain objects through their ``__dict__``
or dataclass fields. A callable (or captured object) that carries a string
``__batchpart_key__`` is identified by that key instead: the opt-out for
rules whose values cannot be digested, with the promise that two rules with
one key compute the same.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types

import numpy as np

KEY_ATTRIBUTE = "__batchpart_key__"
_SCALARS = (type(None), bool, int, float, complex, str)


class UndigestableRuleError(TypeError):
  pass


def digest(rule, *, owner: str) -> str:
  """A 16-hex-digit digest of what ``rule`` computes.

  Raises:
    UndigestableRuleError: naming ``owner`` and the value, when the rule
      captures a value that has no content digest (give the rule a
      ``__batchpart_key__`` string then).
  """
  h = hashlib.sha256()
  _Feeder(h, owner).feed(rule)
  return h.hexdigest()[:16]


class _Feeder:

  def __init__(self, h, owner: str):
    self.h, self.owner = h, owner
    self.seen: dict[int, int] = {}   # id -> visit order: recursion, shared values
    self.keep: list = []             # keeps visited objects alive (ids stay unique)

  def tag(self, *parts) -> None:
    for p in parts:
      data = p if isinstance(p, bytes) else str(p).encode()
      self.h.update(len(data).to_bytes(8, "little"))
      self.h.update(data)

  def feed(self, v) -> None:
    if isinstance(v, _SCALARS):
      self.tag(type(v).__name__, repr(v))
      return
    if id(v) in self.seen:
      self.tag("seen", self.seen[id(v)])
      return
    self.seen[id(v)] = len(self.seen)
    self.keep.append(v)
    key = getattr(v, KEY_ATTRIBUTE, None) if not isinstance(v, type) else None
    if isinstance(key, str):
      self.tag("key", key)
    elif isinstance(v, bytes):
      self.tag("bytes", v)
    elif isinstance(v, np.ndarray):
      self.tag("ndarray", v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes())
    elif isinstance(v, np.generic):
      self.tag("npscalar", v.dtype.str, v.tobytes())
    elif isinstance(v, np.dtype):
      self.tag("dtype", v.str)
    elif isinstance(v, (tuple, list)):
      self.tag(type(v).__name__, len(v))
      for item in v:
        self.feed(item)
    elif isinstance(v, dict):
      self.tag("dict", len(v))
      for k, item in v.items():
        self.feed(k)
        self.feed(item)
    elif isinstance(v, (set, frozenset)):
      self.tag("set", len(v), *sorted(digest(item, owner=self.owner) for item in v))
    elif isinstance(v, types.FunctionType):
      self.function(v)
    elif isinstance(v, types.CodeType):
      self.code(v)
    elif isinstance(v, functools.partial):
      self.tag("partial")
      self.feed(v.func)
      self.feed(v.args)
      self.feed(v.keywords)
    elif isinstance(v, types.MethodType):
      self.tag("method")
      self.feed(v.__func__)
      self.feed(v.__self__)
    elif isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType, np.ufunc)):
      self.tag(type(v).__name__, getattr(v, "__module__", ""),
               getattr(v, "__qualname__", getattr(v, "__name__", "")))
    elif dataclasses.is_dataclass(v):
      self.tag("dataclass", type(v).__module__, type(v).__qualname__)
      for f in dataclasses.fields(v):
        self.tag(f.name)
        self.feed(getattr(v, f.name))
    elif hasattr(v, "__dict__") and not callable(v):
      self.tag("object", type(v).__module__, type(v).__qualname__)
      self.feed(dict(vars(v)))
    elif callable(v) and hasattr(v, "__dict__"):
      self.tag("callable", type(v).__module__, type(v).__qualname__)
      self.feed(type(v).__call__)
      self.feed(dict(vars(v)))
    else:
      raise UndigestableRuleError(
          f"{self.owner}: the shard_attributes rule captures a value of type "
          f"{type(v).__module__}.{type(v).__qualname__} whose content batchpart cannot "
          "digest, so it could not tell this rule from a changed one. Give the rule "
          f"a string attribute {KEY_ATTRIBUTE} (e.g. a version) that changes whenever "
          "what it computes changes.")

  def function(self, fn: types.FunctionType) -> None:
    self.tag("function", fn.__module__, fn.__qualname__)
    self.code(fn.__code__)
    self.feed(fn.__defaults__)
    self.feed(fn.__kwdefaults__)
    cells = fn.__closure__ or ()
    self.tag("closure", len(cells))
    for name, cell in zip(fn.__code__.co_freevars, cells):
      self.tag(name)
      try:
        self.feed(cell.cell_contents)
      except ValueError:   # a cell not filled yet
        self.tag("empty")
    for name in sorted(_global_names(fn.__code__)):
      if name in fn.__globals__:
        self.tag("global", name)
        self.feed(fn.__globals__[name])

  def code(self, co: types.CodeType) -> None:
    self.tag("code", co.co_code, co.co_names, co.co_varnames, co.co_freevars,
             co.co_cellvars, co.co_argcount, co.co_kwonlyargcount, co.co_flags)
    self.feed(tuple(c for c in co.co_consts))


def _global_names(co: types.CodeType) -> set[str]:
  """Every name the code (and code nested in it) may read as a global."""
  names = set(co.co_names)
  for c in co.co_consts:
    if isinstance(c, types.CodeType):
      names |= _global_names(c)
  return names
