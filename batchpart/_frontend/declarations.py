"""The declarations in force: which primitives (``partition_primitive``),
which FFI targets (``partition_ffi_target``) and which host callbacks
(``partition_callback``) batchpart partitions now.

A primitive's lowering rules, and jax's ``ffi_call`` lowering, are hooked
once, by a dispatcher that reads the declaration in force and otherwise runs
the stock rule untouched: so ``unpartition`` restores the stock lowering
exactly, and a declaration can be made again after it.

jax caches traces, lowerings and executables, and a declaration changes no
jaxpr. Rather than clearing jax's caches, the declarations in force are one
immutable ``Snapshot``, which is itself part of jax's jit and trace-cache
keys (``compat.set_declarations_key``); the dispatchers and the Explicit-mode
result types read the declarations from the snapshot in force, never from a
table of their own. Every change puts a new snapshot in force, and snapshots
compare by identity, because jax reads its key when a call starts and lowers
later without pinning the value in between: a change made by another thread
in that window reaches the lowering, and the program it gives is cached under
a snapshot that no later call finds, rather than under a set of declarations
that may come back. So a ``jax.jit`` function traces and compiles again after
every change, even one back to an earlier set; compiled objects
(``jax.jit(f).lower(...).compile()``) never change.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from types import MappingProxyType

from batchpart import _compat as compat
from batchpart._primitive import foreign
from batchpart._primitive.primitive import explicit_result_types
from batchpart._vocab.batch_spec import check_spec


@dataclasses.dataclass(frozen=True, eq=False)
class Snapshot:
  """The declarations in force from one change to the next, by primitive and
  by FFI target name; equal only to itself (see the module docstring)."""
  primitives: Mapping[object, foreign.BatchDeclaration] = dataclasses.field(
      default_factory=lambda: MappingProxyType({}))
  targets: Mapping[str, foreign.BatchDeclaration] = dataclasses.field(
      default_factory=lambda: MappingProxyType({}))
  # By the function (or method) ``partition_callback`` was given.
  callbacks: Mapping[object, object] = dataclasses.field(
      default_factory=lambda: MappingProxyType({}))


_EMPTY = Snapshot()
_lock = threading.Lock()     # serialises changes
_latest = _EMPTY             # the snapshot the last change put in force
_hooked: set[object] = set()   # primitives whose rules have the dispatcher


def in_force() -> Snapshot:
  """The snapshot in force for what this thread traces or lowers now: the
  value jax puts in its cache keys."""
  return compat.declarations_key() or _EMPTY


def _primitive_declaration(primitive):
  return in_force().primitives.get(primitive)


def _target_declaration(target_name):
  return in_force().targets.get(target_name)


def _explicit_retype(declaration_for):
  """Result types in Explicit mode: those ``bp.ffi_call`` gives the declared
  call (its batch sharding); jax's types elsewhere."""
  def retype(avals_in, avals_out, params):
    declaration = declaration_for(params)
    if declaration is None:
      return avals_out
    target = params.get("target_name", declaration.owner)
    in_shapes, out_shapes = [a.shape for a in avals_in], [a.shape for a in avals_out]
    try:
      spec = declaration.spec(target, in_shapes, out_shapes)
      batch_shape = check_spec(declaration.owner, spec, in_shapes, out_shapes)
    except Exception:  # noqa: BLE001 - the lowering raises for a call that does not fit
      return avals_out
    typed = explicit_result_types(avals_in, avals_out, spec, batch_shape)
    return avals_out if typed is None else list(typed)
  return retype


def _hook(primitive, declaration_for, owner: str) -> None:
  """Installs the dispatcher on ``primitive`` once (lowering rules and
  Explicit-mode result types)."""
  if primitive in _hooked:
    return
  if not compat.wrap_lowering_rules(
      primitive, lambda rule: foreign.wrap_rule(rule, declaration_for)):
    raise ValueError(f"{owner}: the primitive has no lowering rule to wrap.")
  compat.wrap_abstract_eval(primitive, _explicit_retype(declaration_for))
  _hooked.add(primitive)


def _put_in_force(kind: str, table: dict) -> None:
  """Puts a new snapshot in force: the latest with ``kind`` (``primitives``
  or ``targets``) replaced by ``table``. Holds _lock."""
  global _latest
  _latest = dataclasses.replace(_latest, **{kind: MappingProxyType(table)})
  compat.set_declarations_key(_latest)


def _declare(kind: str, key, declaration: foreign.BatchDeclaration, same, hook,
             undo_hint: str) -> bool:
  """Puts ``declaration`` in force for ``key`` among ``kind`` (installing
  ``hook`` first); False if an equal one (``same(old, new)``) already is.
  Raises naming the owner if another is."""
  with _lock:
    table = dict(getattr(_latest, kind))
    old = table.get(key)
    if old is not None:
      if same(old, declaration):
        return False
      raise ValueError(
          f"{declaration.owner}: already partitioned by batchpart with another declaration "
          f"(batch dims or shard_attributes rule). Call {undo_hint} first to declare it "
          "again.")
    hook()
    table[key] = declaration
    _put_in_force(kind, table)
  return True


def declare_primitive(primitive, declaration: foreign.BatchDeclaration, same) -> bool:
  """Puts ``declaration`` in force for ``primitive``'s lowering rules."""
  return _declare(
      "primitives", primitive, declaration, same,
      lambda: _hook(primitive, lambda params: _primitive_declaration(primitive),
                    declaration.owner),
      "batchpart.unpartition on the primitive")


def declare_target(target_name: str, declaration: foreign.BatchDeclaration, same) -> bool:
  """Puts ``declaration`` in force for every ``jax.ffi.ffi_call`` to
  ``target_name``."""
  return _declare(
      "targets", target_name, declaration, same,
      lambda: _hook(compat.jax_ffi_call_p,
                    lambda params: _target_declaration(params.get("target_name")),
                    declaration.owner),
      f"batchpart.unpartition('{target_name}')")


def declare_callback(function, declaration, same, hook) -> bool:
  """Puts ``declaration`` in force for every jax callback whose function is
  ``function`` (installing ``hook``, the callback primitives' dispatchers,
  first)."""
  return _declare("callbacks", function, declaration, same, hook,
                  "batchpart.unpartition on the callback")


def _kind_of(key) -> str:
  """Which table ``unpartition``'s argument names an entry of."""
  if isinstance(key, str):
    return "targets"
  if isinstance(key, compat.Primitive) or not callable(key):
    return "primitives"
  return "callbacks"


_NOUNS = {"targets": ("FFI target", "batchpart.partition_ffi_target"),
          "primitives": ("primitive", "batchpart.partition_primitive"),
          "callbacks": ("callback", "batchpart.partition_callback")}


def withdraw(key) -> None:
  """Takes the declaration of a primitive, target or callback out of force.

  Raises:
    ValueError: naming it, if none is in force.
  """
  kind = _kind_of(key)
  with _lock:
    table = dict(getattr(_latest, kind))
    try:
      found = key in table
    except TypeError:   # unhashable: never declared
      found = False
    if not found:
      what = getattr(key, "name", None) or getattr(key, "__qualname__", None) or key
      noun, entry = _NOUNS[kind]
      raise ValueError(
          f"batchpart.unpartition: the {noun} {what!r} is not partitioned by batchpart "
          f"(declare it with {entry}).")
    del table[key]
    _put_in_force(kind, table)
