"""jax's primitive machinery, for batchpart's own primitives and the ones it
adopts (``partition_primitive``).

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax.extend.core`` / ``jax._src.core``: primitives, avals, effects and
  the vma rule of the ``batchpart_ffi_call`` and ``batchpart_callback``
  primitives' abstract evaluation.
- ``jax._src.dispatch``, ``jax._src.interpreters.ad`` / ``batching``: their
  eager implementation, derivative and vmap rule tables.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.extend.core as jax_extend_core
from jax._src import core, dispatch
from jax._src.interpreters import ad, batching

Primitive = jax_extend_core.Primitive
ClosedJaxpr = jax_extend_core.ClosedJaxpr
Literal = jax_extend_core.Literal
ShapedArray = core.ShapedArray
Tracer = core.Tracer
abstract_token = core.abstract_token
typeof = core.typeof
no_effects = core.no_effects
standard_vma_rule = core.standard_vma_rule
simple_impl = dispatch.simple_impl
moveaxis = batching.moveaxis
primitive_batchers = batching.primitive_batchers
primitive_jvps = ad.primitive_jvps
primitive_transposes = ad.primitive_transposes


def wrap_abstract_eval(primitive, retype: Callable) -> None:
  """Passes ``primitive``'s output avals through ``retype(avals_in,
  avals_out, params) -> avals_out``."""
  original = primitive.abstract_eval

  def abstract_eval(*avals, **params):
    out, effects = original(*avals, **params)
    if primitive.multiple_results:
      return type(out)(retype(avals, list(out), params)), effects
    return retype(avals, [out], params)[0], effects

  primitive.abstract_eval = abstract_eval


def wrap_batching_rule(primitive, wrap: Callable) -> None:
  """Replaces ``primitive``'s vmap rule ``rule(axis_data, args, dims,
  **params)`` by ``wrap(rule)``. jax keeps the rules in
  ``batching.fancy_primitive_batchers`` (``primitive_batchers`` is a
  write-only proxy onto it)."""
  table = batching.fancy_primitive_batchers
  table[primitive] = wrap(table[primitive])
