"""``bp.partition_callback``: a package's own ``jax.pure_callback``,
``jax.experimental.io_callback`` and ``buffer_callback`` calls, per batch
shard, with the package unchanged.

jax binds one primitive per callback API, with the user's function in its
``callback`` parameter. On the first declaration, those primitives' lowering
rules get a dispatcher: a call whose function is declared in the snapshot in
force is lowered as the matching batchpart call (``bp.pure_callback``,
``bp.io_callback``, ``bp.buffer_callback``) through ``lower_fun``; every other
call goes to jax's rule untouched, so it compiles exactly as before.

vmap: jax's vectorised vmap methods (``expand_dims``, ``broadcast_all``,
``legacy_vectorized``) bind the primitive again on operands with more
leading dims; for a declared function, the batching dispatcher records how
many each operand and result gained (``Vmapped``), so a ``num_batch_dims``
declaration still names the function's own leading dims. The sequential
methods keep jax's loop, each iteration's call partitioned as declared.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import warnings
from collections.abc import Callable
from typing import Any

import jax

from batchpart import _compat as compat
from batchpart._callback.errors import callback_name
from batchpart._callback.host import check_arrays
from batchpart._frontend import declarations
from batchpart._frontend.signature import (
  batch_rank,
  declared_spec,
  parse_declaration,
)
from batchpart._primitive.primitive import explicit_result_types
from batchpart._vocab.batch_spec import check_spec
from batchpart._vocab.dims.arguments import HaloSpec, ReduceOp, ReduceSpec, ScanSpec
from batchpart._vocab.dims.halo import Halo
from batchpart._vocab.dims.scan import Scan, refuse_parallel

# jax's vmap methods after which the callback gets every vmapped dim at once.
_VECTORISED = ("expand_dims", "broadcast_all", "legacy_vectorized")


@dataclasses.dataclass(frozen=True)
class CallbackDeclaration:
  """What ``partition_callback`` was told about a function."""
  owner: str
  num_batch_dims: int | None
  signature: str | None
  reduce: tuple[tuple[str, ReduceOp], ...] | None
  leads: bool   # a signature's '...' stands after a core dim somewhere
  arrays: str = "jax"   # what a pure/io callback's function gets
  halo: tuple[tuple[str, int | Halo], ...] | None = None
  scan: tuple[tuple[str, Scan], ...] | None = None

  def options(self) -> dict:
    return {"num_batch_dims": self.num_batch_dims, "signature": self.signature,
            "reduce": dict(self.reduce) if self.reduce is not None else None,
            "halo": dict(self.halo) if self.halo is not None else None,
            "scan": dict(self.scan) if self.scan is not None else None}


@dataclasses.dataclass(frozen=True)
class Vmapped:
  """A callback parameter after jax's vectorised vmap: the leading dims each
  operand and each result gained (equal for equal inner callbacks, as jax's
  caches need)."""
  inner: Any
  operand_dims: tuple[int, ...]
  result_dims: int

  def __call__(self, *args, **kwargs):
    return self.inner(*args, **kwargs)


def _candidates(fn):
  """The objects a declaration of ``fn`` may have named: ``fn`` itself, the
  function under a ``functools.partial``, a bound method's function, a
  callable object's class ``__call__``."""
  seen = 0
  while fn is not None and seen < 16:
    seen += 1
    yield fn
    if isinstance(fn, functools.partial):
      fn = fn.func
    elif inspect.ismethod(fn):
      fn = fn.__func__
    elif not (inspect.isfunction(fn) or inspect.isbuiltin(fn)) and callable(fn):
      fn = type(fn).__call__
    else:
      fn = None


def _declared(fn) -> CallbackDeclaration | None:
  """The declaration in force for a jax callback's function, if any."""
  table = declarations.in_force().callbacks
  if not table:
    return None
  for candidate in _candidates(fn):
    try:
      found = table.get(candidate)
    except TypeError:   # unhashable objects are never declared
      continue
    if isinstance(found, CallbackDeclaration):
      return found
  return None


def _unwrap(callback_param) -> tuple[Any, Vmapped | None]:
  if isinstance(callback_param, Vmapped):
    return callback_param.inner, callback_param
  return callback_param, None


class _Leaves:
  """The user's function returning its results' leaves, as jax's flat
  callback does (jax never checks the structure against
  ``result_shape_dtypes``); equal for the same function."""

  __slots__ = ("fn", "__qualname__")

  def __init__(self, fn):
    self.fn = fn
    self.__qualname__ = callback_name(fn)

  def __eq__(self, other):
    return isinstance(other, _Leaves) and self.fn == other.fn

  def __hash__(self):
    return hash((_Leaves, self.fn))

  def __call__(self, *args, **kwargs):
    return list(jax.tree_util.tree_leaves(self.fn(*args, **kwargs)))


def _call_declaration(declaration: CallbackDeclaration, vmapped: Vmapped | None,
                      operand_ranks, result_ranks) -> dict | None:
  """The ``num_batch_dims`` / ``signature`` / ``reduce`` of the batchpart call
  one jax call becomes; None where a vmapped call cannot keep the declared
  layout (then jax's own lowering runs)."""
  options = declaration.options()
  if vmapped is None:
    return options
  if declaration.signature is not None:
    # vmap puts its dims in front, where a '...' after a core dim is not.
    return None if declaration.leads else options
  k = declaration.num_batch_dims
  names = (f"c{i}" for i in itertools.count())   # one fresh name per core dim
  def group(rank, added):
    core = rank - k - added
    if core < 0:
      raise ValueError(f"{declaration.owner}: num_batch_dims={k} exceeds the rank "
                       f"({rank - added}) of an operand or result of the call.")
    return "(" + ",".join(next(names) for _ in range(core)) + ")"
  ins = ",".join(group(r, a) for r, a in zip(operand_ranks, vmapped.operand_dims))
  outs = ",".join(group(r, vmapped.result_dims) for r in result_ranks)
  # A signature (its batch dims broadcast) takes the size-1 dim expand_dims
  # gives an operand vmap does not batch, and the dim legacy_vectorized omits.
  return {"num_batch_dims": None, "signature": f"{ins}->{outs}", "reduce": None,
          "halo": None, "scan": None}


def _batching(stock_rule):
  """jax's batching rule, recording the dims a vectorised vmap adds to a
  declared function's call."""
  def rule(axis_data, args, dims, *, callback, vmap_method=None, **params):
    inner, vmapped = _unwrap(callback)
    fn, _ = compat.jax_callback_function(inner)
    if vmap_method in _VECTORISED and _declared(fn) is not None:
      gains = [int(d is not None or vmap_method != "legacy_vectorized") for d in dims]
      before = vmapped.operand_dims if vmapped else (0,) * len(dims)
      callback = Vmapped(inner, tuple(b + g for b, g in zip(before, gains)),
                         (vmapped.result_dims if vmapped else 0) + 1)
    return stock_rule(axis_data, args, dims, callback=callback, vmap_method=vmap_method,
                      **params)
  return rule


def _lowering(kind: str):
  """A dispatcher around jax's lowering rule of ``kind``'s primitive."""
  def wrap(stock_rule):
    def rule(ctx, *args, callback, **params):
      inner, vmapped = _unwrap(callback)
      fn, in_tree = compat.jax_callback_function(inner)
      in_tree = params.get("in_tree", in_tree)   # buffer_callback's own parameter
      declaration = _declared(fn)
      if declaration is None:
        return stock_rule(ctx, *args, callback=callback, **params)
      if params.get("ordered"):
        warnings.warn(
            f"{declaration.owner}: an ordered jax.experimental.io_callback runs once, on "
            "one device, in program order; it is left to jax.", stacklevel=2)
        return stock_rule(ctx, *args, callback=callback, **params)
      options = _call_declaration(declaration, vmapped,
                                  [len(a.shape) for a in ctx.avals_in],
                                  [len(a.shape) for a in ctx.avals_out])
      if options is None:
        warnings.warn(
            f"{declaration.owner}: under jax.vmap the signature's '...' no longer "
            "stands where it was declared; this call is left to jax (one call on one "
            "device).", stacklevel=2)
        return stock_rule(ctx, *args, callback=callback, **params)
      for option in ("reduce", "halo"):
        if options[option] is not None and kind != "pure_callback":
          raise ValueError(
              f"{declaration.owner}: {option}= applies to jax.pure_callback calls only; "
              f"this is a jax {kind}, whose side effects would happen once per part of "
              "the dim (and again in each window it overlaps).")
      _check_scan_kind(declaration.owner, kind, options["scan"])
      body = _BODIES[kind](declaration, fn, in_tree, ctx.avals_out, options, params)
      try:
        return compat.lower_fun(body, multiple_results=True)(ctx, *args)
      except ValueError as e:
        if str(e).startswith(declaration.owner):
          raise
        raise ValueError(f"{declaration.owner}: a jax {kind} of {callback_name(fn)} "
                         f"does not fit the declaration: {e}") from e
    return rule
  return wrap


def _check_scan_kind(owner: str, kind: str, scan) -> None:
  """A jax io_callback takes a sequential scan only (two passes would repeat
  its side effects), a buffer_callback none (it writes its results in
  place, whole)."""
  if scan is None or kind == "pure_callback":
    return
  names = ", ".join(map(repr, scan))
  if kind == "buffer_callback":
    raise ValueError(f"{owner}: scan= over the dim(s) {names} applies to jax.pure_callback "
                     "and io_callback calls; this is a jax buffer_callback, which takes "
                     "no scan.")
  refuse_parallel(owner, scan, "this is a jax io_callback")


def _explicit_retype(avals_in, avals_out, params):
  """Result types in Explicit mode: those the batchpart call a declared
  callback becomes gives its results (their batch sharding); jax's
  otherwise."""
  inner, vmapped = _unwrap(params.get("callback"))
  declaration = _declared(compat.jax_callback_function(inner)[0])
  if declaration is None or params.get("ordered"):
    return avals_out
  in_shapes = [tuple(a.shape) for a in avals_in]
  out_shapes = [tuple(a.shape) for a in avals_out]
  try:
    options = _call_declaration(declaration, vmapped, [len(s) for s in in_shapes],
                                [len(s) for s in out_shapes])
    if options is None:
      return avals_out
    parsed, reductions, halos, scans = parse_declaration(
        declaration.owner, options["num_batch_dims"], options["signature"],
        options["reduce"], halo=options["halo"], scan=options["scan"])
    spec = declared_spec(declaration.owner, parsed, options["num_batch_dims"], in_shapes,
                         out_shapes, reductions, halos, scans)
    batch = check_spec(declaration.owner, spec, in_shapes, out_shapes)
  except ValueError:   # the lowering raises for a call that does not fit
    return avals_out
  typed = explicit_result_types(avals_in, avals_out, spec, batch)
  return avals_out if typed is None else list(typed)


def _results(avals):
  return [jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in avals]


def _host_body(kind: str):
  def body(declaration, fn, in_tree, avals_out, options, params):
    from batchpart._callback import api

    def call(*flat):
      args, kwargs = jax.tree_util.tree_unflatten(in_tree, flat)
      # Named after the declaration in messages, the explain report and the
      # error a raising function gives.
      return list(api._call("partition_callback", _Leaves(fn), _results(avals_out), args,
                            kwargs, with_index=False, io=kind == "io_callback",
                            arrays=declaration.arrays, **options))
    return call
  return body


def _buffer_body(declaration, fn, in_tree, avals_out, options, params):
  """jax's ``buffer_callback`` call as ``bp.buffer_callback``'s: the same
  function, result tree, side effect and aliases."""
  from batchpart._callback.buffer import buffer_callback

  results = jax.tree_util.tree_unflatten(params["out_tree"], _results(avals_out))
  call = buffer_callback(fn, results, has_side_effect=params["has_side_effect"],
                         input_output_aliases=dict(params["input_output_aliases"]) or None,
                         num_batch_dims=options["num_batch_dims"],
                         signature=options["signature"])

  def body(*flat):
    args, kwargs = jax.tree_util.tree_unflatten(in_tree, flat)
    return jax.tree_util.tree_leaves(call(*args, **kwargs))
  return body


_BODIES: dict[str, Callable] = {
    "pure_callback": _host_body("pure_callback"),
    "io_callback": _host_body("io_callback"),
    "buffer_callback": _buffer_body,
}


def _install() -> None:
  """Puts the dispatchers on jax's callback primitives (once; each runs
  jax's rule untouched for a function not declared)."""
  for primitive, kind in compat.jax_callback_primitives().items():
    compat.wrap_lowering_rules(primitive, _lowering(kind))
    compat.wrap_abstract_eval(primitive, _explicit_retype)
    if kind != "io_callback":   # io_callback's vmap is jax's loop
      compat.wrap_batching_rule(primitive, _batching)


_installed = False


def _hook() -> None:
  global _installed
  if not _installed:
    _install()
    _installed = True


def partition_callback(callback: Callable, *, num_batch_dims: int | None = None,
                       signature: str | None = None,
                       reduce: ReduceSpec | None = None,
                       arrays: str = "jax", halo: HaloSpec | None = None,
                       scan: ScanSpec | None = None) -> Callable:
  """Makes every jax host callback whose function is ``callback`` run per
  batch shard.

  From now on every ``jax.pure_callback``, unordered
  ``jax.experimental.io_callback`` and ``jax.experimental.buffer_callback``
  whose function is ``callback`` — called by any package, under ``jit``,
  ``vmap``, ``custom_vjp`` — is lowered as the batchpart call with this
  declaration (:func:`batchpart.pure_callback`, :func:`batchpart.io_callback`):
  each device calls it on its own block of the batch, no all-gather.
  Callbacks with other functions compile exactly as before.

  A call is recognised by its function: ``callback`` itself, or a
  ``functools.partial`` of it, or a method bound to any instance when
  ``callback`` is the class's function (``Model.log_prob``), or an instance
  whose class's ``__call__`` is ``callback``.

  Args:
    callback: the function (or the class's method) the package passes to
      ``jax.pure_callback`` / ``io_callback`` / ``buffer_callback``.
    num_batch_dims, signature, reduce, halo, scan: the batch declaration, as for
      :func:`batchpart.pure_callback`, of the package's call (its flat
      operands and results); ``reduce`` and ``halo`` apply to
      ``jax.pure_callback`` calls only, ``scan`` to ``jax.pure_callback``
      calls and (without a merge) ``io_callback`` ones.
    arrays: what the function gets from a ``pure_callback`` / ``io_callback``
      call: ``"jax"`` (the default: ``jax.Array`` objects, as jax hands them, made
      over the block's host memory without a transfer, so code written for
      jax's callbacks, ``.at[]`` and ``jnp`` included, behaves alike) or
      ``"numpy"`` (read-only NumPy arrays: tens of microseconds less per call;
      docs/callbacks.md, "What the callback gets"). A ``buffer_callback``'s
      function gets buffers either way.

  Returns:
    ``callback`` itself. The same declaration again does nothing; another
    raises ``ValueError`` (``batchpart.unpartition(callback)`` first). A
    ``jax.jit`` function compiled before traces and compiles again on its
    next call; ``batchpart.unpartition(callback)`` gives it its stock program
    back. An ordered ``io_callback`` stays jax's (with a warning).

  Raises:
    ValueError: for a bad declaration; and, when a call is lowered, if it
      does not fit the declaration (naming the function and the operand).
  """
  if not callable(callback):
    raise TypeError(f"batchpart.partition_callback: callback must be callable, got "
                    f"{type(callback).__name__}.")
  owner = f"batchpart.partition_callback({callback_name(callback)})"
  parsed, *_ = parse_declaration(owner, num_batch_dims, signature, reduce, halo=halo,
                                 scan=scan)
  check_arrays(owner, arrays)
  if num_batch_dims is not None:
    num_batch_dims = batch_rank(owner, num_batch_dims)
  declaration = CallbackDeclaration(
      owner=owner, num_batch_dims=num_batch_dims, signature=signature,
      reduce=None if reduce is None else tuple(sorted(reduce.items())),
      halo=None if halo is None else tuple(sorted(halo.items())),
      scan=None if scan is None else tuple(sorted(scan.items())),
      leads=parsed is not None and any(parsed.spec().operand_leads +
                                       parsed.spec().result_leads),
      arrays=arrays)
  try:
    hash(callback)
  except TypeError as e:
    raise TypeError(f"{owner}: callback must be hashable (a function, method or "
                    "callable object).") from e
  declarations.declare_callback(callback, declaration, lambda a, b: a == b, _hook)
  return callback
