"""The ``batchpart_callback`` primitive: a host callback with declared batch
dims (``bp.pure_callback`` and ``bp.io_callback``).

Parameters: ``callback`` (a ``host.FlatCallback``), ``result_avals``,
``operand_core_ranks``, ``result_core_ranks`` (everything before the core
dims is batch), optionally ``reductions`` (reduced core dims, as trailing
core axes; absent: none), ``broadcast_batch`` (operands' batch dims broadcast, as under
a signature) and ``io`` (``io_callback``: jax's unordered IO effect, so the
call is kept and never deduplicated).

vmap adds one leading batch dim: one call, no loop. There is no JVP or
transpose, as for jax's callbacks: wrap the function in ``jax.custom_jvp`` /
``jax.custom_vjp``.
"""

from __future__ import annotations

from batchpart import _compat as compat
from batchpart._primitive.batch_spec import BatchSpec, check_spec, require_static_shapes
from batchpart._primitive.batching import align_operands
from batchpart._primitive.primitive import result_types

batchpart_callback_p = compat.Primitive("batchpart_callback")
batchpart_callback_p.multiple_results = True
compat.simple_impl(batchpart_callback_p)
compat.require_devices_during_lowering(batchpart_callback_p)


def _abstract_eval(*avals_in, callback, result_avals, operand_core_ranks,
                   result_core_ranks, io, reductions=(), **_):
  owner = callback.owner
  require_static_shapes(owner, [a.shape for a in avals_in],
                        [a.shape for a in result_avals])
  spec = BatchSpec(operand_core_ranks, result_core_ranks, reductions=reductions)
  batch_shape = check_spec(owner, spec, [a.shape for a in avals_in],
                           [a.shape for a in result_avals])
  compat.standard_vma_rule("batchpart_callback", *avals_in)
  effects = {compat.io_effect()} if io else compat.no_effects
  return result_types(avals_in, result_avals, spec, batch_shape), effects


batchpart_callback_p.def_effectful_abstract_eval(_abstract_eval)


def _not_differentiable(*args, callback, **_):
  del args
  raise ValueError(
      f"{callback.owner} cannot be differentiated, like jax's callbacks. Wrap the "
      "function that calls it in jax.custom_jvp or jax.custom_vjp to give it a "
      "derivative.")


compat.primitive_jvps[batchpart_callback_p] = _not_differentiable
compat.primitive_transposes[batchpart_callback_p] = _not_differentiable


def _batching_rule(args, dims, *, result_avals, operand_core_ranks, broadcast_batch,
                   **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  # num_batch_dims: every operand has the full batch shape. signature: a
  # missing leading dim broadcasts.
  out, _ = align_operands(args, dims, operand_core_ranks, (0,) * len(args), size,
                          () if broadcast_batch else range(len(args)))
  result_avals = tuple(r.update(shape=(size, *r.shape)) for r in result_avals)
  outs = batchpart_callback_p.bind(
      *out, result_avals=result_avals, operand_core_ranks=operand_core_ranks,
      broadcast_batch=broadcast_batch, **params)
  return outs, [0] * len(outs)


compat.primitive_batchers[batchpart_callback_p] = _batching_rule


def bind(*args, **params):
  return batchpart_callback_p.bind(*args, **params)
