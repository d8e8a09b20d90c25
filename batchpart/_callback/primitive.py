"""The ``batchpart_callback`` primitive: a host callback with declared batch
dims (``bp.pure_callback`` and ``bp.io_callback``).

Parameters: ``callback`` (a ``host.FlatCallback``), ``result_avals``,
``operand_core_ranks``, ``result_core_ranks`` (everything before the core
dims is batch), optionally ``reductions`` (reduced core dims, as trailing
core axes; absent: none), ``broadcast_batch`` (operands' batch dims broadcast, as under
a signature) and ``io`` (``io_callback``: jax's unordered IO effect, so the
call is kept and never deduplicated), optionally ``declaration`` (the
declaration as written, for ``batchpart.explain``); ``bp.buffer_callback``
adds ``buffer=True`` (in place, ``buffer_host``) and
``input_output_aliases`` (flat operand -> result pairs).

vmap adds one leading batch dim: one call, no loop. There is no JVP or
transpose, as for jax's callbacks: wrap the function in ``jax.custom_jvp`` /
``jax.custom_vjp``.
"""

from __future__ import annotations

from batchpart import _compat as compat
from batchpart._primitive.batching import align_operands
from batchpart._primitive.primitive import batch_primitive

batchpart_callback_p = batch_primitive(
    "batchpart_callback", lambda callback, **_: callback.owner,
    lambda io, **_: {compat.io_effect()} if io else compat.no_effects)
compat.require_devices_during_lowering(batchpart_callback_p)


def _batching_rule(args, dims, *, result_avals, operand_core_ranks, broadcast_batch,
                   **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  # num_batch_dims: every operand has the full batch shape. signature: a
  # missing leading dim broadcasts, except on an operand its result aliases
  # (buffer callbacks), which must keep the result's shape.
  must_broadcast = ({i for i, _ in params.get("input_output_aliases", ())}
                    if broadcast_batch else range(len(args)))
  out, _ = align_operands(args, dims, operand_core_ranks, (0,) * len(args), size,
                          must_broadcast)
  result_avals = tuple(r.update(shape=(size, *r.shape)) for r in result_avals)
  outs = batchpart_callback_p.bind(
      *out, result_avals=result_avals, operand_core_ranks=operand_core_ranks,
      broadcast_batch=broadcast_batch, **params)
  return outs, [0] * len(outs)


compat.primitive_batchers[batchpart_callback_p] = _batching_rule


def bind(*args, **params):
  return batchpart_callback_p.bind(*args, **params)
