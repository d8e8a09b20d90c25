"""Evaluating a jaxpr again, equation by equation (the decorator's rewrite):
binding an equation's primitive, the jaxprs inside call-like and
custom-derivative equations, and binding those with rewritten bodies.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``): the names of
jax's call primitives and the parameters of ``custom_vjp_call`` /
``custom_jvp_call`` (``call_jaxpr``, ``fwd_jaxpr_thunk``, ``bwd``,
``jvp_jaxpr_fun``) and ``custom_vmap_call`` (``call``, ``rule``) are
internal to jax.
"""

from __future__ import annotations

from collections.abc import Callable

from jax._src import core, linear_util as lu, source_info_util

from batchpart._compat.primitives import ClosedJaxpr


def eqn_context(eqn):
  """A context in which what is bound again carries ``eqn``'s own source
  location and name stack, as jax's ``eval_jaxpr`` binds: ops then point at
  the user's line inside the function traced, not at the re-evaluation."""
  name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
  return source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)


def bind_eqn(eqn, invals):
  """Binds an equation's primitive again, as ``core.eval_jaxpr`` does."""
  return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))


def inlinable_jaxpr(eqn):
  """The closed jaxpr of a call-like eqn that can be inlined (jit, closed_call)."""
  if eqn.primitive.name not in ("pjit", "jit", "closed_call", "core_call"):
    return None
  for key in ("jaxpr", "call_jaxpr"):
    inner = eqn.params.get(key)
    if inner is not None:
      return inner if isinstance(inner, ClosedJaxpr) else ClosedJaxpr(inner, ())
  return None


def jaxprs_in_eqn(eqn) -> list:
  """The jaxprs (open) in an eqn's params: the bodies of scan, while, cond, ...."""
  return list(core.jaxprs_in_params(eqn.params))


def is_custom_derivative_call(eqn) -> bool:
  """Whether the eqn is a ``jax.custom_vjp`` / ``jax.custom_jvp`` call."""
  return eqn.primitive.name in ("custom_vjp_call", "custom_jvp_call")


def is_custom_vmap_call(eqn) -> bool:
  """Whether the eqn is a ``jax.custom_batching.custom_vmap`` call."""
  return eqn.primitive.name == "custom_vmap_call"


def called_jaxpr(eqn):
  """The closed jaxpr that computes an eqn's results from its operands: the
  body of a jit or closed_call, the primal of a custom-derivative or
  custom_vmap call; None for any other eqn."""
  inner = inlinable_jaxpr(eqn)
  if inner is not None:
    return inner
  if is_custom_derivative_call(eqn):
    return eqn.params["call_jaxpr"]
  if is_custom_vmap_call(eqn):
    return eqn.params["call"]
  return None


def _types(vars_) -> list:
  """The shapes and dtypes of jaxpr variables (None for tokens)."""
  return [(getattr(v.aval, "shape", None), getattr(v.aval, "dtype", None)) for v in vars_]


def bind_custom_derivative_call(eqn, invals, call_jaxpr, in_info, out_info,
                                rewrite_closed: Callable, rewrite_function: Callable):
  """Binds a ``custom_vjp_call`` / ``custom_jvp_call`` eqn with ``call_jaxpr``
  (its primal, already rewritten), its forward/JVP jaxprs rewritten by
  ``rewrite_closed(closed, in_info, out_info)`` and its backward function by
  ``rewrite_function``. ``in_info`` has one entry per eqn operand and
  ``out_info`` one per result; each jaxpr gets the entries of its own inputs
  and outputs (a tangent gets its primal's, a residual None)."""
  params = dict(eqn.params)
  num_consts = params["num_consts"]
  primal_info = list(in_info[num_consts:])   # fwd and JVP jaxprs take no consts
  params["call_jaxpr"] = call_jaxpr
  if "fwd_jaxpr_thunk" in params:
    fwd = params["fwd_jaxpr_thunk"]

    def fwd_thunk(*zeros):
      jaxpr, consts = fwd.call_wrapped(*zeros)
      # Its outputs: the residuals, then the primal outputs. Where the tail
      # does not type as the primal outputs, nothing is said of any output.
      residuals = len(jaxpr.outvars) - len(out_info)
      outs = [None] * len(jaxpr.outvars)
      if residuals >= 0 and _types(jaxpr.outvars[residuals:]) == _types(eqn.outvars):
        outs[residuals:] = out_info
      closed = rewrite_closed(ClosedJaxpr(jaxpr, consts), primal_info, outs)
      return closed.jaxpr, closed.consts

    params["fwd_jaxpr_thunk"] = lu.wrap_init(fwd_thunk, debug_info=fwd.debug_info)
    bwd = params["bwd"]
    params["bwd"] = lu.wrap_init(rewrite_function(bwd.call_wrapped),
                                 debug_info=bwd.debug_info)
  if "jvp_jaxpr_fun" in params:
    jvp = params["jvp_jaxpr_fun"]

    def jvp_fun(*zeros):
      jaxpr, consts, out_zeros = jvp.call_wrapped(*zeros)
      # Its inputs: the primals, then the tangents that are not symbolic
      # zeros; its outputs likewise.
      info = primal_info + [i for i, z in zip(primal_info, zeros) if not z]
      outs = list(out_info) + [o for o, z in zip(out_info, out_zeros) if not z]
      closed = rewrite_closed(ClosedJaxpr(jaxpr, consts), info, outs)
      return closed.jaxpr, closed.consts, out_zeros

    params["jvp_jaxpr_fun"] = lu.wrap_init(jvp_fun, debug_info=jvp.debug_info)
  return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))


def bind_custom_vmap_call(eqn, invals, call_jaxpr, wrap_rule: Callable):
  """Binds a ``custom_vmap_call`` eqn with ``call_jaxpr`` (what runs outside
  vmap, and what it lowers to, already rewritten) and its vmap rule replaced
  by ``wrap_rule(rule)``."""
  params = dict(eqn.params)
  params["call"] = call_jaxpr
  params["rule"] = wrap_rule(params["rule"])
  return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))
