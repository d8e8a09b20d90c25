"""``bp.buffer_callback``: jax's in-place host callback
(``jax.experimental.buffer_callback``), run per batch shard.

Same calling convention as jax's: ``buffer_callback(callback, results,
...)`` returns a function of arrays; ``callback(ctx, out, *args, **kwargs)``
gets an execution context and buffers (``out`` a pytree like the results),
writes ``out`` in place and returns None. The batch declaration and the
blocks each call gets are those of ``bp.pure_callback``; the buffers are
views of XLA's own (``buffer_host``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from batchpart._callback import lowering as _lowering  # noqa: F401  (registers it)
from batchpart._callback.api import bind_batch_first, result_aval, spec_for
from batchpart._callback.buffer_host import BufferCallback
from batchpart._callback.errors import callback_name
from batchpart._frontend.signature import check_vmap_method, parse_declaration
from batchpart._primitive.lowering import declaration_text
from batchpart._vocab.batch_spec import fmt


def buffer_callback(callback: Callable[..., None], result_shape_dtypes: Any, *,
                    num_batch_dims: int | None = None, signature: str | None = None,
                    has_side_effect: bool = False, vmap_method: str | None = None,
                    input_output_aliases: dict[int, int] | None = None,
                    with_index: bool = False) -> Callable[..., Any]:
  """Like ``jax.experimental.buffer_callback``, per block of the batch.

  Returns a function of arrays (pytrees, keyword arguments allowed). Each
  call of it runs ``callback(ctx, out, *args, **kwargs)`` on blocks of the
  batch, where they are: ``ctx`` is jax's ``ExecutionContext`` (its
  ``stream`` on GPU), ``out`` a pytree like ``result_shape_dtypes`` of
  writable buffers, ``args``/``kwargs`` read-only buffers, all of them the
  block's part of XLA's own buffers (no copy). ``callback`` writes ``out``
  in place and returns None. Under ``jax.jit`` with batch-sharded inputs
  each device calls it once on its own block: no all-gather, no collective,
  results keep the batch sharding; padding of uneven shards is never
  passed, and a batch that would be replicated over devices is split
  across them instead.

  Buffers offer ``shape``, ``dtype``, ``ndim``, ``writeable``, and
  ``__array__`` / ``__dlpack__`` on CPU, ``__cuda_array_interface__`` on
  GPU (and ``__dlpack__`` where the block is the whole buffer).

  Args:
    callback: the host function, called as above (plus ``index=``, a tuple
      of ``slice`` objects locating the block in the global batch, if
      ``with_index``).
    result_shape_dtypes: a pytree of objects with ``shape`` and ``dtype``:
      the results' global shapes.
    num_batch_dims, signature: the batch declaration over the flat operands
      and results, exactly one of them, as for :func:`batchpart.pure_callback`.
    has_side_effect: keep the call even when its results are unused (jax's
      unordered IO effect); each batch element is passed once per execution.
    vmap_method: accepted for compatibility and validated; a vmapped call is
      one call with one more leading batch dim, whatever the value.
    input_output_aliases: ``{flat operand index: flat result index}``: the
      result is written into the operand's buffer (same shape and dtype).
    with_index: also pass ``index=``.

  Raises:
    ValueError: for a batch declaration or alias that does not fit the
      operands and results (naming the callback and the argument).
  """
  owner = f"batchpart.buffer_callback({callback_name(callback)})"
  if not callable(callback):
    raise TypeError(f"batchpart.buffer_callback: callback must be callable, got "
                    f"{type(callback).__name__}.")
  check_vmap_method(owner, vmap_method, "jax.experimental.buffer_callback")
  parsed, *_ = parse_declaration(owner, num_batch_dims, signature)
  flat_results, out_tree = jax.tree_util.tree_flatten(result_shape_dtypes)
  result_avals = [result_aval(owner, i, r) for i, r in enumerate(flat_results)]
  aliases = _alias_pairs(owner, input_output_aliases, len(result_avals))

  def wrapped(*args: Any, **kwargs: Any) -> Any:
    flat_args, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    in_avals, spec = spec_for(owner, parsed, num_batch_dims, flat_args, result_avals)
    _check_aliases(owner, aliases, in_avals, result_avals)
    for i, o in aliases:
      # Same shape is not enough: the buffer must hold the same elements in
      # the same place in the user's layout and in the primitive's.
      if ((spec.operand_leads[i], spec.operand_core_ranks[i]) !=
          (spec.result_leads[o], spec.result_core_ranks[o])):
        raise ValueError(
            f"{owner}: input_output_aliases {i}:{o}: the declaration places the batch "
            "dims of the operand and the result differently, so they cannot share a "
            "buffer. Give them the same core-dim group.")
    outs = bind_batch_first(
        flat_args, result_avals, spec,
        lambda layouts: BufferCallback(callback, in_tree, out_tree, with_index=with_index,
                                       layouts=layouts),
        broadcast_batch=parsed is not None, io=bool(has_side_effect), buffer=True,
        input_output_aliases=aliases, declaration=declaration_text(num_batch_dims, signature))
    return jax.tree_util.tree_unflatten(out_tree, list(outs))

  return wrapped


def _alias_pairs(owner: str, aliases: dict[int, int] | None, n_results: int
                 ) -> tuple[tuple[int, int], ...]:
  """The sorted (operand, result) pairs of ``input_output_aliases``, each
  result aliased at most once and in range."""
  pairs = tuple(sorted((int(i), int(o)) for i, o in (aliases or {}).items()))
  for i, o in pairs:
    if i < 0 or not 0 <= o < n_results:
      raise ValueError(f"{owner}: input_output_aliases {i}:{o} is out of range "
                       f"({n_results} results).")
  results = [o for _, o in pairs]
  if len(set(results)) != len(results):
    raise ValueError(f"{owner}: input_output_aliases {dict(pairs)} aliases a result "
                     "to more than one operand.")
  return pairs


def _check_aliases(owner: str, pairs: tuple[tuple[int, int], ...], in_avals: Any,
                   result_avals: Any) -> None:
  """Every aliased operand exists and has its result's shape and dtype."""
  for i, o in pairs:
    if i >= len(in_avals):
      raise ValueError(f"{owner}: input_output_aliases {i}:{o} names operand {i}, but "
                       f"there are {len(in_avals)} (flat) operands.")
    a, r = in_avals[i], result_avals[o]
    if tuple(a.shape) != tuple(r.shape) or a.dtype != r.dtype:
      raise ValueError(
          f"{owner}: input_output_aliases {i}:{o}: operand {i} is {fmt(a.shape)} "
          f"{a.dtype} but result {o} is {fmt(r.shape)} {r.dtype}; an alias needs the "
          "same shape and dtype.")
