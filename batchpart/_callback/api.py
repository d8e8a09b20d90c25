"""``bp.pure_callback`` and ``bp.io_callback``: host callbacks that run per
batch shard.

Same calling convention as ``jax.pure_callback`` /
``jax.experimental.io_callback`` (pytrees of arrays in and out, ``**kwargs``
passed to the callback), plus one batch declaration as in ``bp.ffi_call``.
The declaration applies to the flattened operands (the leaves of ``args``,
then of ``kwargs``) and the flattened results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from batchpart import _compat as compat
from batchpart._callback import lowering as _lowering  # noqa: F401  (registers it)
from batchpart._callback.errors import callback_name
from batchpart._callback.host import (
  DEFAULT_ARRAYS,
  FlatCallback,
  Layouts as _Layouts,
  check_arrays,
)
from batchpart._callback.primitive import bind
from batchpart._frontend.signature import (
  check_vmap_method,
  declared_spec,
  parse_declaration,
)
from batchpart._primitive.lowering import declaration_text
from batchpart._vocab.batch_spec import BatchSpec, checked_operand_avals
from batchpart._vocab.dims.arguments import HaloSpec, ReduceSpec, ScanSpec
from batchpart._vocab.dims.batch import batch_first, inverse
from batchpart._vocab.dims.reduced import check_results
from batchpart._vocab.dims.scan import check_scan_arrays, refuse_parallel


def pure_callback(callback: Callable[..., Any], result_shape_dtypes: Any, *args: Any,
                  num_batch_dims: int | None = None, signature: str | None = None,
                  reduce: ReduceSpec | None = None,
                  halo: HaloSpec | None = None,
                  vmap_method: str | None = None, with_index: bool = False,
                  arrays: str = DEFAULT_ARRAYS, scan: ScanSpec | None = None,
                  **kwargs: Any) -> Any:
  """Calls a pure Python function on blocks of the batch, where they are.

  Like :func:`jax.pure_callback`, but the leading dims of every operand and
  result are declared batch dims, and ``callback`` is called with arrays
  (NumPy by default, ``arrays="jax"`` for jax's type) holding a contiguous
  block of batch elements and must return the
  results for exactly those elements. Under ``jax.jit`` with batch-sharded
  inputs each device calls it on its own block: no all-gather, no
  collective, the results keep the batch sharding. How many calls and which
  blocks is unspecified (one call on one device; one per device shard when
  sharded); padding of uneven shards is never passed, and a batch that would
  be replicated over devices is split across them instead.

  Args:
    callback: the host function, called as ``callback(*args, **kwargs)``
      with NumPy arrays or ``jax.Array`` objects (``arrays``), plus ``index=`` if
      ``with_index``.
    result_shape_dtypes: a pytree of objects with ``shape`` and ``dtype``
      (e.g. ``jax.ShapeDtypeStruct``): the results' global shapes.
    *args: the operands, a pytree of arrays.
    num_batch_dims: the first ``num_batch_dims`` dims of every operand and
      result are batch dims and must be equal across them.
    signature: a gufunc signature (``"(n,n)->(n)"``), one core-dim group
      per flattened operand and result; operands' batch dims broadcast
      NumPy-style (a size-1 or missing batch dim is passed whole to every
      call). Exactly one of ``num_batch_dims`` and ``signature``.
    reduce: ``{core dim name: op}`` (op ``"sum"``, ``"max"`` or ``"min"``,
      one for all, or a combiner ``"argmax"``, ``"argmin"``, ``"max_k"``,
      ``"min_k"``, ``"logsumexp"`` or a ``batchpart.Combiner``, as for
      :func:`batchpart.ffi_call`), with a signature:
      core dims of the operands, in no result, that the results combine
      over. ``callback`` may then be called
      on a part of each such dim and must return the results of that part;
      where the dim is sharded, each device calls it on its own part and one
      all-reduce combines the results (docs/reductions.md). ``with_index``
      locates the block in the batch only.
    scan: ``{core dim name: batchpart.Scan(state=(k, j), ...)}``, as for
      :func:`batchpart.ffi_call`: ``callback`` carries a state along the dim
      from operand ``k`` to result ``j``. Where the dim is sharded, each
      device calls it on its own part of the dim and the state that part
      starts in: with a merge, twice (from a zero state, then from the true
      one after one all-gather of the parts' summaries); without, one part
      after the other, the state handed on by collective-permutes
      (docs/scans.md). ``with_index`` then adds one slice: where the part
      lies in the dim.
    vmap_method: accepted for compatibility with :func:`jax.pure_callback`
      and validated; not needed: a vmapped call is one call with one more
      leading batch dim (no loop), whatever the value.
    with_index: also pass ``index=``, a tuple of ``slice`` objects (one per batch
      dim) locating the block in the global batch shape.
    arrays: what ``callback`` gets: ``"numpy"`` (read-only NumPy arrays) or
      ``"jax"`` (``jax.Array`` objects on the first CPU device, as
      :func:`jax.pure_callback` passes them, made over the same host memory,
      never by a transfer; about 20 us more per call). Take ``"jax"`` for
      code that uses jax on its arguments (``.at[]``, ``jnp``): ``jnp`` on a
      NumPy operand transfers it, which can stall a program whose devices
      meet in a collective after the callback.
    **kwargs: more operands (arrays), passed to ``callback`` by keyword.

  Returns:
    A pytree of arrays like ``result_shape_dtypes``.

  Raises:
    ValueError: if the batch declaration does not fit the operands and
      results (naming the callback and the argument).
  """
  check_vmap_method(f"batchpart.pure_callback({callback_name(callback)})", vmap_method,
                    "jax.pure_callback")
  return _call("pure_callback", callback, result_shape_dtypes, args, kwargs,
               num_batch_dims=num_batch_dims, signature=signature, with_index=with_index,
               io=False, reduce=reduce, halo=halo, arrays=arrays, scan=scan)


def io_callback(callback: Callable[..., Any], result_shape_dtypes: Any, *args: Any,
                num_batch_dims: int | None = None, signature: str | None = None,
                ordered: bool = False, with_index: bool = False,
                reduce: ReduceSpec | None = None, arrays: str = DEFAULT_ARRAYS,
                halo: HaloSpec | None = None, scan: ScanSpec | None = None,
                **kwargs: Any) -> Any:
  """Calls an impure Python function on blocks of the batch, where they are.

  Like :func:`jax.experimental.io_callback` (the call is kept even when its
  results are unused), with the batch contract of
  :func:`batchpart.pure_callback`: each batch element is passed exactly once
  per execution, also when the batch is replicated over part of the mesh,
  and padding is never passed. Calls on different devices run concurrently,
  in no particular order.

  Args:
    callback: the host function, called as ``callback(*args, **kwargs)``, as
      for :func:`batchpart.pure_callback`.
    result_shape_dtypes: a pytree of objects with ``shape`` and ``dtype``:
      the results' global shapes.
    *args: the operands, a pytree of arrays.
    num_batch_dims: as for :func:`batchpart.pure_callback`.
    signature: as for :func:`batchpart.pure_callback`.
    ordered: must be False. Per-shard calls run on several devices at once
      and cannot be ordered across them; for an ordered callback use
      ``jax.experimental.io_callback(..., ordered=True)``, which runs once,
      on one device, on the whole batch.
    with_index: also pass ``index=``, a tuple of ``slice`` objects locating
      the block in the global batch shape: it tells the callback where its
      rows go, e.g. to write them to the right place.
    reduce: must be None: a callback with side effects would have them once
      per part, and a part's calls cannot be told from the whole's.
    halo: must be None: overlapping windows would repeat the side effects.
    scan: as for :func:`batchpart.pure_callback`, without a merge: two
      passes would repeat the side effects.
    arrays: ``"numpy"`` or ``"jax"``, as for :func:`batchpart.pure_callback`.
    **kwargs: more operands (arrays), passed to ``callback`` by keyword.

  Returns:
    A pytree of arrays like ``result_shape_dtypes``.

  Raises:
    ValueError: for ``ordered=True``, ``reduce=...``, or a batch declaration
      that does not fit.
  """
  if reduce is not None:
    raise ValueError(
        f"batchpart.io_callback({callback_name(callback)}): reduce= is not supported: its "
        "side effects would happen once per part of the reduced dim. Use "
        "batchpart.pure_callback(..., reduce=...) for a pure function, or reduce the "
        "io_callback's per-row results with jnp.sum.")
  if halo is not None:
    raise ValueError(
        f"batchpart.io_callback({callback_name(callback)}): halo={halo!r} is not supported: "
        "the windows of neighbouring parts overlap, so its side effects would happen "
        "more than once for the halo elements. Use batchpart.pure_callback(..., halo=...) "
        "for a pure function.")
  refuse_parallel(f"batchpart.io_callback({callback_name(callback)})", scan,
                  "an io_callback has side effects",
                  ", or use batchpart.pure_callback(..., scan=...) for a pure function")
  if ordered:
    raise ValueError(
        f"batchpart.io_callback({callback_name(callback)}): ordered=True is not "
        "supported: per-shard calls run on every device at once and cannot be "
        "ordered across devices. Use jax.experimental.io_callback(..., ordered=True) "
        "for an ordered callback (it runs once, on one device, on the whole batch).")
  return _call("io_callback", callback, result_shape_dtypes, args, kwargs,
               num_batch_dims=num_batch_dims, signature=signature, with_index=with_index,
               io=True, arrays=arrays, scan=scan)


def _call(kind, callback, result_shape_dtypes, args, kwargs, *, num_batch_dims,
          signature, with_index, io, reduce=None, halo=None, arrays=DEFAULT_ARRAYS,
          scan=None):
  owner = f"batchpart.{kind}({callback_name(callback)})"
  if not callable(callback):
    raise TypeError(f"batchpart.{kind}: callback must be callable, got "
                    f"{type(callback).__name__}.")
  check_arrays(owner, arrays)
  parsed, reductions, halos, scans = parse_declaration(owner, num_batch_dims, signature,
                                                       reduce, halo=halo, scan=scan)
  flat_args, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  flat_results, out_tree = jax.tree_util.tree_flatten(result_shape_dtypes)
  result_avals = [result_aval(owner, i, r) for i, r in enumerate(flat_results)]
  if parsed is not None:
    check_results(owner, reductions, [a.shape for a in result_avals],
                  [a.dtype for a in result_avals], parsed.result_layouts())
  in_avals, spec = spec_for(owner, parsed, num_batch_dims, flat_args, result_avals,
                            reductions, halos, scans)
  check_scan_arrays(owner, scans, [a.shape for a in in_avals], [a.dtype for a in in_avals],
                    [a.shape for a in result_avals], [a.dtype for a in result_avals])
  outs = bind_batch_first(
      flat_args, result_avals, spec,
      lambda layouts: FlatCallback(callback, in_tree, out_tree, with_index=with_index,
                                   kind=kind, arrays=arrays, layouts=layouts),
      broadcast_batch=parsed is not None, io=io,
      declaration=declaration_text(num_batch_dims, signature, reduce, halo, scan),
      **_reduction_params(spec))
  return jax.tree_util.tree_unflatten(out_tree, list(outs))


def result_aval(owner: str, i: int, r):
  """A result leaf's aval, once it has a canonical shape and dtype."""
  if not (hasattr(r, "shape") and hasattr(r, "dtype")):
    raise TypeError(f"{owner}: result_shape_dtypes leaf {i} must have shape and "
                    f"dtype, got {type(r).__name__}.")
  compat.check_result_shape_dtype(r)
  return compat.ShapedArray(tuple(r.shape), r.dtype)


def spec_for(owner: str, parsed, num_batch_dims, flat_args, result_avals,
             reductions=(), halos=(), scans=()) -> tuple[list, BatchSpec]:
  """The operands' checked avals and the batch spec a callback's declaration
  gives its flat operands and results."""
  in_avals = checked_operand_avals(owner, flat_args, result_avals)
  if not flat_args and parsed is None and num_batch_dims:
    raise ValueError(f"{owner}: num_batch_dims={num_batch_dims!r} with no operands: "
                     "the batch comes from the operands.")
  spec = declared_spec(owner, parsed, num_batch_dims, [tuple(a.shape) for a in in_avals],
                       [tuple(a.shape) for a in result_avals], reductions, halos, scans)
  return in_avals, spec


def bind_batch_first(flat_args, result_avals, spec: BatchSpec, make_callback, **params
                     ) -> list:
  """Binds the callback primitive with every batch dim in front and returns
  its results in the user's layout. Core dims before a signature's '...' are
  moved behind the batch dims by transposes XLA runs on each device's block;
  the host side (``make_callback(layouts)``) moves them back for the user's
  function, which gets and returns its own layout."""
  op_leads, res_leads = spec.operand_leads, spec.result_leads
  moved = [_batch_first(x, lead, core)
           for x, lead, core in zip(flat_args, op_leads, spec.operand_core_ranks)]
  avals = [a.update(shape=_batch_first_shape(a.shape, lead, core))
           for a, lead, core in zip(result_avals, res_leads, spec.result_core_ranks)]
  args = compat.auto_insert_reshard(*moved) if moved else ()
  layouts = (_Layouts(op_leads, spec.operand_core_ranks, res_leads, spec.result_core_ranks)
             if any(op_leads + res_leads) else None)
  outs = bind(*args, callback=make_callback(layouts), result_avals=tuple(avals),
              operand_core_ranks=tuple(lead + core for lead, core in
                                       zip(op_leads, spec.operand_core_ranks)),
              result_core_ranks=tuple(lead + core for lead, core in
                                      zip(res_leads, spec.result_core_ranks)),
              **params)
  return [_batch_back(y, lead, core)
          for y, lead, core in zip(outs, res_leads, spec.result_core_ranks)]


def _reduction_params(spec: BatchSpec) -> dict:
  """The primitive's ``reductions``, ``halos`` and ``scans``: with batch
  dims moved in front, every core dim trails, so each reduced, halo or
  scanned dim is named by its trailing core axis."""
  cores = [lead + core for lead, core in zip(spec.operand_leads, spec.operand_core_ranks)]
  res_cores = [lead + core for lead, core in zip(spec.result_leads, spec.result_core_ranks)]
  trailing = lambda dims, ranks: tuple((k, a - ranks[k] if a >= 0 else a) for k, a in dims)
  params: dict[str, Any] = {}
  if spec.reductions:
    params["reductions"] = tuple(
        dataclasses.replace(r, dims=trailing(r.dims, cores),
                            results=trailing(r.results, res_cores),
                            k_dims=trailing(r.k_dims, res_cores))
        for r in spec.reductions)
  if spec.halos:
    params["halos"] = tuple(
        dataclasses.replace(h, operand_dims=trailing(h.operand_dims, cores),
                            result_dims=trailing(h.result_dims, res_cores))
        for h in spec.halos)
  if spec.scans:
    params["scans"] = tuple(
        dataclasses.replace(t, operand_dims=trailing(t.operand_dims, cores),
                            result_dims=trailing(t.result_dims, res_cores))
        for t in spec.scans)
  return params


def _batch_first_order(rank: int, lead: int, core: int) -> list[int]:
  """The dim order that puts an array's batch dims (between ``lead`` leading
  and ``core`` trailing core dims) in front."""
  return batch_first(rank, lead, rank - lead - core)


def _batch_first_shape(shape, lead: int, core: int) -> tuple[int, ...]:
  return tuple(shape[i] for i in _batch_first_order(len(shape), lead, core))


def _batch_first(x, lead: int, core: int):
  if not lead:
    return x
  return jax.numpy.transpose(x, _batch_first_order(len(jax.numpy.shape(x)), lead, core))


def _batch_back(y, lead: int, core: int):
  if not lead:
    return y
  return jax.numpy.transpose(y, inverse(_batch_first_order(y.ndim, lead, core)))
