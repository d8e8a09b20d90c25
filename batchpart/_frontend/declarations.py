"""The declarations in force: which primitives (``partition_primitive``) and
which FFI targets (``partition_ffi_target``) batchpart partitions now.

A primitive's lowering rules, and jax's ``ffi_call`` lowering, are hooked
once, by a dispatcher that reads the declaration in force at lowering time
and otherwise runs the stock rule untouched: so ``unpartition`` restores the
stock lowering exactly, and a declaration can be made again after it.

jax caches traces, lowerings and executables, and a declaration changes no
jaxpr. Rather than clearing jax's caches, the set of declarations in force is
part of jax's jit and trace-cache keys (``compat.set_declarations_key``):
a ``jax.jit`` function called after the set changes is traced and compiled
again for the new set, and one called when an earlier set is back in force
finds the executables compiled under it. Compiled objects
(``jax.jit(f).lower(...).compile()``) never change.
"""

from __future__ import annotations

import itertools
import threading

from batchpart import _compat as compat
from batchpart._primitive import foreign

_lock = threading.Lock()
_serials = itertools.count(1)
_primitives: dict[object, tuple[int, foreign.BatchDeclaration]] = {}
_targets: dict[str, tuple[int, foreign.BatchDeclaration]] = {}
_hooked: set[object] = set()   # primitives whose rules have the dispatcher


def _update_key() -> None:
  compat.set_declarations_key(tuple(sorted(
      serial for serial, _ in (*_primitives.values(), *_targets.values()))))


def _primitive_declaration(primitive):
  entry = _primitives.get(primitive)
  return None if entry is None else entry[1]


def _target_declaration(target_name):
  entry = _targets.get(target_name)
  return None if entry is None else entry[1]


def _explicit_retype(declaration_for):
  """Result types in Explicit mode: the first operand's leading batch
  sharding on each result's leading dims, for a declared call (under
  ``num_batch_dims``; a signature's batch dims broadcast, and results keep
  jax's types)."""
  def retype(avals_in, avals_out, params):
    declaration = declaration_for(params)
    if declaration is None or declaration.core_ranks is not None or not avals_in:
      return avals_out
    k = declaration.num_batch_dims
    if callable(k):
      try:
        k = k([tuple(a.shape) for a in avals_in], [tuple(a.shape) for a in avals_out])
      except Exception:  # noqa: BLE001 - a rule for the emitted call's shapes only
        return avals_out
    spec = compat.explicit_spec(avals_in[0])
    if spec is None or not k or all(e is None for e in spec[:k]):
      return avals_out
    return [compat.with_leading_spec(a, spec[:k]) if len(a.shape) >= k and
            tuple(a.shape[:k]) == tuple(avals_in[0].shape[:k]) else a
            for a in avals_out]
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


def _declare(table: dict, key, declaration: foreign.BatchDeclaration, same, hook,
             undo_hint: str) -> bool:
  """Puts ``declaration`` in force for ``key`` in ``table`` (installing
  ``hook`` first); False if an equal one (``same(old, new)``) already is.
  Raises naming the owner if another is."""
  with _lock:
    entry = table.get(key)
    if entry is not None:
      if same(entry[1], declaration):
        return False
      raise ValueError(
          f"{declaration.owner}: already partitioned by batchpart with another declaration "
          f"(batch dims or shard_attributes rule). Call {undo_hint} first to declare it "
          "again.")
    hook()
    table[key] = (next(_serials), declaration)
    _update_key()
  return True


def declare_primitive(primitive, declaration: foreign.BatchDeclaration, same) -> bool:
  """Puts ``declaration`` in force for ``primitive``'s lowering rules."""
  return _declare(
      _primitives, primitive, declaration, same,
      lambda: _hook(primitive, lambda params: _primitive_declaration(primitive),
                    declaration.owner),
      "batchpart.unpartition on the primitive")


def declare_target(target_name: str, declaration: foreign.BatchDeclaration, same) -> bool:
  """Puts ``declaration`` in force for every ``jax.ffi.ffi_call`` to
  ``target_name``."""
  return _declare(
      _targets, target_name, declaration, same,
      lambda: _hook(compat.jax_ffi_call_p,
                    lambda params: _target_declaration(params.get("target_name")),
                    declaration.owner),
      f"batchpart.unpartition('{target_name}')")


def withdraw(primitive_or_target_name) -> None:
  """Takes the declaration of a primitive or target out of force.

  Raises:
    ValueError: naming it, if none is in force.
  """
  with _lock:
    table = _targets if isinstance(primitive_or_target_name, str) else _primitives
    if primitive_or_target_name not in table:
      what = getattr(primitive_or_target_name, "name", primitive_or_target_name)
      kind = "FFI target" if table is _targets else "primitive"
      raise ValueError(
          f"batchpart.unpartition: the {kind} {what!r} is not partitioned by batchpart "
          "(declare it with batchpart.partition_ffi_target or "
          "batchpart.partition_primitive).")
    del table[primitive_or_target_name]
    _update_key()
