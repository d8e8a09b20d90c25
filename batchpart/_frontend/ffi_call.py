"""``batchpart.ffi_call``: ``jax.ffi.ffi_call`` with declared batch dims."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from batchpart import _compat as compat, _primitive
from batchpart._frontend.signature import (
  check_vmap_method,
  declared_spec,
  parse_declaration,
)
from batchpart._primitive.lowering import declaration_text
from batchpart._vocab.batch_spec import BatchSpec, checked_operand_avals
from batchpart._vocab.dims.arguments import HaloSpec, ReduceSpec, ScanSpec
from batchpart._vocab.dims.reduced import check_results
from batchpart._vocab.dims.scan import check_scan_arrays


def ffi_call(
    target_name: str,
    result_shape_dtypes: Any,
    *,
    num_batch_dims: int | None = None,
    signature: str | None = None,
    reduce: ReduceSpec | None = None,
    halo: HaloSpec | None = None,
    scan: ScanSpec | None = None,
    has_side_effect: bool = False,
    input_layouts: Sequence[Sequence[int] | None] | None = None,
    output_layouts: Sequence[int] | Sequence[Sequence[int] | None] | None = None,
    input_output_aliases: dict[int, int] | None = None,
    vmap_method: str | None = None,
    custom_call_api_version: int = 4,
    legacy_backend_config: str | None = None,
) -> Callable[..., Any]:
  """Calls an XLA FFI target whose leading dims are independent problems.

  Same calling convention as :func:`jax.ffi.ffi_call`. Under ``jax.jit`` with
  sharded inputs, a target marked batch partitionable (see
  :func:`batchpart.register_ffi_target`) runs on each device's own slice of the
  batch: no all-gather in front of it and no work done twice.

  Args:
    target_name: the name of a registered XLA FFI target.
    result_shape_dtypes: an object with ``shape`` and ``dtype`` (e.g.
      ``jax.ShapeDtypeStruct``), or a sequence of them, giving the results'
      global shapes.
    num_batch_dims: the first ``num_batch_dims`` dims of every operand and
      result are batch dims and must be equal across them.
    signature: a gufunc signature such as ``"(m,n),(n)->(m)"`` naming each
      operand's and result's core dims; every operand's leading dims are batch
      dims, broadcast NumPy-style across operands (a size-1 or missing batch
      dim is broadcast without being materialised, so the kernel must accept
      it); results get the broadcast batch shape. A ``...`` in a group puts
      that array's batch dims there instead, NumPy-einsum style:
      ``"(a,f,...,r),(a,f,...,r)->(p,f,...)"`` has batch dims after two core
      dims in each operand and after two in the result. Exactly one of
      ``num_batch_dims`` and ``signature`` is required.
    reduce: ``{core dim name: op}`` with op ``"sum"``, ``"max"`` or ``"min"``
      (one op for all): core dims of the signature's operands, in no result,
      that every result combines over. The contract: each result equals the
      op, over any split of that dim into parts, of the results the kernel
      computes on the parts. Where the dim is sharded, each device runs the
      kernel on its own part and one all-reduce over the devices holding the
      parts combines the results (docs/reductions.md). Or a combiner that
      reads the results together: ``"argmax"`` / ``"argmin"`` (results
      ``(value, index)``, the index local to the part), ``"max_k"`` /
      ``"min_k"`` (results ``(values, indices)``, the k best of the part
      along a core dim no operand has), ``"logsumexp"`` (results
      ``(m_1, ..., m_j, lse)``), or your own ``batchpart.Combiner(merge,
      index_results=())``; see docs/reductions.md.
    halo: ``{core dim name: w}`` or ``{name: batchpart.Halo(lo, hi,
      periodic=False, ends=None, cval=0.0)}``: core dims that the operands and every result have
      with one size, along which the call is local: result element ``i``
      depends only on operand elements ``i - lo .. i + hi`` and on where
      ``i`` lies relative to the array's two ends. Where the dim is split,
      each device calls the kernel on a window of ``lo + part + hi``
      elements, taken from its neighbours by collective-permutes, and keeps
      its part of the results (docs/halos.md).
    scan: ``{core dim name: batchpart.Scan(state=(k, j), merge=None,
      apply=None, reverse=False)}``: a core dim along which the call carries
      a state, from operand ``k`` (without the dim) to result ``j`` (one
      shape and dtype). Where the dim is split, each device runs its part
      from the state its part starts in: by two passes and one all-gather
      of the parts' summaries with a ``merge``, handed from part to part
      without one (docs/scans.md).
    has_side_effect: keep the call even when its results are unused.
    input_layouts: per operand, ``None`` (row-major) or a major-to-minor dim
      order, as in :func:`jax.ffi.ffi_call`.
    output_layouts: the same for the results.
    input_output_aliases: ``{operand index: result index}`` pairs whose
      buffers the kernel may share.
    vmap_method: accepted for compatibility with :func:`jax.ffi.ffi_call` and
      validated, but not needed: the declared batch dims define vmap. A
      vmapped call is one call with one more leading batch dim; an unmapped
      operand is broadcast (``num_batch_dims``) or passed with a missing
      leading dim (``signature``), as for any batch dim.
    custom_call_api_version: must be 4 (the typed FFI). batchpart re-registers
      the target's typed-FFI handler under a derived name per call
      description, which a legacy custom call (versions 0-3) does not allow;
      call those with :func:`jax.ffi.ffi_call`.
    legacy_backend_config: must be None (legacy custom calls only).

  Returns:
    A function taking the operands as positional arrays and the FFI
    attributes as keyword arguments, returning one array or a sequence of
    arrays like ``result_shape_dtypes``.

  Raises:
    ValueError: if both or neither of ``num_batch_dims`` and ``signature`` are
      given, if ``reduce`` names a dim that is not an operand core dim of the
      signature, is in a result, or has an unknown op, or (when called) if the
      operands and results do not fit them. The message names the target and
      the offending argument.
  """
  if not isinstance(target_name, str) or not target_name:
    raise TypeError(f"batchpart.ffi_call: target_name must be a non-empty str, got "
                    f"{target_name!r}.")
  owner = _primitive.ffi_call_owner(target_name)
  _check_jax_options(target_name, vmap_method, custom_call_api_version,
                     legacy_backend_config)
  parsed, reductions, halos, scans = parse_declaration(owner, num_batch_dims, signature,
                                                       reduce, halo=halo, scan=scan)
  multiple_results = isinstance(result_shape_dtypes, Sequence)
  results = list(result_shape_dtypes) if multiple_results else [result_shape_dtypes]
  result_avals: list[Any] = list(compat.result_avals_from_shape_dtypes(results))
  if any(r is compat.abstract_token for r in result_avals):
    raise ValueError(f"{owner}: token results are not "
                     "supported; use jax.ffi.ffi_call for ordered effects.")
  if parsed is not None:
    check_results(owner, reductions, [r.shape for r in result_avals],
                  [r.dtype for r in result_avals], parsed.result_layouts())
  out_layouts = output_layouts if multiple_results else (output_layouts,)
  if output_layouts is None:
    out_layouts = None

  def call(*args: Any, **attributes: Any) -> Any:
    in_avals = checked_operand_avals(owner, args, result_avals,
                                     " Pass attributes as keyword arguments.")
    operand_shapes = [tuple(a.shape) for a in in_avals]
    result_shapes = [tuple(r.shape) for r in result_avals]
    if not args:
      # Nothing to shard the results like: XLA's default treatment.
      spec = BatchSpec((), tuple(len(s) for s in result_shapes))
    else:
      spec = declared_spec(owner, parsed, num_batch_dims, operand_shapes, result_shapes,
                           reductions, halos, scans)
      check_scan_arrays(owner, scans, operand_shapes, [a.dtype for a in in_avals],
                        result_shapes, [r.dtype for r in result_avals])
    static_in = _static_layouts(target_name, "input", input_layouts, in_avals)
    static_out = _static_layouts(target_name, "output", out_layouts, result_avals)
    aliases = _static_aliases(target_name, input_output_aliases, in_avals,
                              result_avals, static_in, static_out)
    args = compat.auto_insert_reshard(*args)
    outs = _primitive.bind(
        *args,
        target_name=target_name,
        result_avals=tuple(result_avals),
        operand_core_ranks=spec.operand_core_ranks,
        result_core_ranks=spec.result_core_ranks,
        **spec.extra_params(),
        has_side_effect=bool(has_side_effect),
        input_layouts=static_in,
        output_layouts=static_out,
        input_output_aliases=aliases,
        attributes=_primitive.typed_attributes(compat.wrap_kwargs_hashable(attributes)),
        broadcast_batch=parsed is not None,
        declaration=declaration_text(num_batch_dims, signature, reduce, halo, scan),
    )
    if multiple_results:
      return tuple(outs) if isinstance(result_shape_dtypes, tuple) else list(outs)
    return outs[0]

  return call


def _static_layouts(target_name: str, what: str, layouts: Any, avals: Sequence[Any]) -> Any:
  if layouts is None:
    return tuple(compat.convert_layout_for_lowering(a) for a in avals)
  if len(layouts) != len(avals):
    raise ValueError(
        f"batchpart.ffi_call('{target_name}'): {len(layouts)} {what} layouts for "
        f"{len(avals)} {what}s.")
  for i, (layout, aval) in enumerate(zip(layouts, avals)):
    if layout is not None and not hasattr(layout, "major_to_minor"):
      if sorted(int(d) for d in layout) != list(range(len(aval.shape))):
        raise ValueError(
            f"batchpart.ffi_call('{target_name}'): {what} layout {i} {tuple(layout)} "
            f"is not a permutation of the dims of shape {tuple(aval.shape)}.")
  return tuple(tuple(l) for l in compat.convert_layouts_for_ffi_call(avals, layouts))


def _static_aliases(target_name: str, aliases: dict[int, int] | None, in_avals: Sequence[Any],
                    result_avals: Sequence[Any], static_in: Any, static_out: Any
                    ) -> tuple[tuple[int, int], ...]:
  out = []
  for i, o in sorted((aliases or {}).items()):
    i, o = int(i), int(o)
    if not 0 <= i < len(in_avals) or not 0 <= o < len(result_avals):
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): input_output_aliases maps operand "
          f"{i} to result {o}, outside {len(in_avals)} operands and "
          f"{len(result_avals)} results.")
    if not compat.check_compatible_avals(in_avals[i], result_avals[o]):
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): input_output_aliases maps operand "
          f"{i} ({in_avals[i].str_short()}) to result {o} "
          f"({result_avals[o].str_short()}); aliased buffers need one shape and dtype.")
    if static_in[i] != static_out[o]:
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): input_output_aliases maps operand "
          f"{i} to result {o} but their layouts differ ({static_in[i]} vs "
          f"{static_out[o]}).")
    out.append((i, o))
  return tuple(out)


def _check_jax_options(target_name: str, vmap_method: str | None, api_version: int,
                       legacy_backend_config: str | None) -> None:
  check_vmap_method(_primitive.ffi_call_owner(target_name), vmap_method, "jax.ffi.ffi_call")
  if api_version != 4 or legacy_backend_config is not None:
    raise ValueError(
        f"batchpart.ffi_call('{target_name}'): only typed-FFI calls "
        f"(custom_call_api_version=4, no legacy_backend_config) can be partitioned; got "
        f"custom_call_api_version={api_version!r}, legacy_backend_config="
        f"{legacy_backend_config!r}. Call legacy custom calls with jax.ffi.ffi_call.")
