"""Every jax and jaxlib internal batchpart uses, in one place.

Checked against jax/jaxlib 0.10.2 (Python 3.11) and the newest jax on
Python 3.12 (0.12.x). The rest of batchpart imports these names from here,
never from ``jax._src``; ``check_versions`` warns where jax is older than the
oldest version checked.

What is used, and why:
- ``jax._src.core``: Primitive machinery (abstract eval, effects, the vma
  rule, Explicit-mode shardings of avals) for the ``batchpart_ffi_call``
  primitive.
- ``jax._src.ffi``: the attribute, layout and result helpers of
  ``jax.ffi.ffi_call``, so ``bp.ffi_call`` accepts exactly what it accepts,
  and ``ffi_call_p`` so the decorator can find plain calls in a jaxpr.
- ``jax._src.interpreters.mlir``: ``register_lowering`` and ``custom_call``
  (the same emitter ``jax.ffi.ffi_lowering`` uses), MLIR contexts.
- ``jax._src.custom_partitioning_sharding_rule``: the Shardy rule builder
  jax's own linalg lowering uses.
- ``jax._src.lib.xla_client``: ``register_custom_call_partitioner``,
  ``custom_call_targets`` (whether a target has a typed-FFI handler) and
  ``HloSharding``.
- ``jax._src.xla_bridge.register_plugin_callbacks``: partitioners on PJRT
  plugins (CUDA).
- ``jax._src.callback`` and ``mlir.ModuleContext.add_host_callback``: jax's
  IO effect, its result dtype check and its host-callback custom-call
  targets, for ``bp.pure_callback`` / ``bp.io_callback``.
- ``jax.make_user_context``: the declarations snapshot as part of jax's jit
  and trace-cache keys (public, but set globally with ``set_global``).
- ``jax._src.export._export``: ``call_exported_p``'s lowering (the calls an
  artifact brings are made partitionable in the caller), ``_check_module``
  and the stable target list, so ``DisabledSafetyCheck.custom_call(name)``
  and jax's stable targets cover their derived names.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

import jax
import jax.extend.core as jax_extend_core
from jax._src import (
  config as jax_config,
  core,
  dispatch,
  ffi as jax_ffi,
  linear_util as lu,
  xla_bridge,
)
from jax._src.custom_partitioning_sharding_rule import (
  ArrayMapping,
  SdyShardingRule,
  sdy_sharding_rule_to_mlir,
)
from jax._src.interpreters import ad, batching, mlir
from jax._src.lib import xla_client
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import func as func_dialect, hlo

JAX_VERSION_CHECKED = "0.10.2"

# Primitive machinery.
Primitive = jax_extend_core.Primitive
ClosedJaxpr = jax_extend_core.ClosedJaxpr
Literal = jax_extend_core.Literal
ShapedArray = core.ShapedArray
abstract_token = core.abstract_token
typeof = core.typeof
no_effects = core.no_effects
standard_vma_rule = core.standard_vma_rule
get_cur_mesh_sharding = core.get_cur_mesh_sharding
auto_insert_reshard = core.auto_insert_reshard
is_constant_shape = core.is_constant_shape
simple_impl = dispatch.simple_impl
moveaxis = batching.moveaxis
primitive_batchers = batching.primitive_batchers
primitive_jvps = ad.primitive_jvps
primitive_transposes = ad.primitive_transposes


# ---------------------------------------------------------------------------
# Re-evaluating jaxprs (the decorator)
# ---------------------------------------------------------------------------

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


# jax.ffi.ffi_call's own helpers.
jax_ffi_call_p = jax_ffi.ffi_call_p
ffi_effect = jax_ffi._FfiEffect
wrap_kwargs_hashable = jax_ffi._wrap_kwargs_hashable
unwrap_kwargs_hashable = jax_ffi._unwrap_kwargs_hashable
convert_layout_for_lowering = jax_ffi._convert_layout_for_lowering
convert_layouts_for_ffi_call = jax_ffi._convert_layouts_for_ffi_call
check_compatible_avals = jax_ffi._check_compatible_avals
result_avals_from_shape_dtypes = jax_ffi._result_avals

# Lowering.
ir = ir
hlo = hlo
func_dialect = func_dialect
register_lowering = mlir.register_lowering
custom_call = mlir.custom_call
ir_attribute = mlir.ir_attribute
aval_to_ir_type = mlir.aval_to_ir_type
dtype_to_ir_type = mlir.dtype_to_ir_type
make_ir_context = mlir.make_ir_context
module_to_bytecode = mlir.module_to_bytecode
module_to_string = mlir.module_to_string
# The channel a collective inside an SPMD program carries (jax's psum uses
# the same), with global device ids in its replica groups.
COLLECTIVE_CHANNEL_ID = mlir.COLLECTIVE_CHANNEL_ID
DEVICE_TO_DEVICE_TYPE = mlir.DEVICE_TO_DEVICE_TYPE

# Partitioning.
HloSharding = xla_client.HloSharding
OpShardingType = xla_client.OpSharding.Type


def use_shardy() -> bool:
  return bool(jax_config.use_shardy_partitioner.value)


def lowering_platforms(ctx) -> tuple[str, ...]:
  """The platforms a lowering emits code for (``cpu``, ``cuda``, ...)."""
  return tuple(ctx.module_context.platforms)


def is_manual_lowering(ctx) -> bool:
  """Whether the op is lowered inside a fully manual region (shard_map)."""
  axis_context = ctx.module_context.axis_context
  manual = getattr(axis_context, "manual_axes", frozenset())
  mesh = getattr(axis_context, "mesh", None)
  return bool(mesh is not None and manual and
              frozenset(mesh.axis_names) <= frozenset(manual))


def xla_partitions(ctx) -> bool:
  """Whether XLA's SPMD partitioner will partition the ops being lowered:
  more than one device, outside a fully manual region. Elsewhere (one
  device, inside ``shard_map`` over every mesh axis) an op runs as lowered."""
  axis_context = ctx.module_context.axis_context
  mesh = getattr(axis_context, "mesh", None)
  if mesh is not None:   # SPMDAxisContext: inside shard_map
    return mesh.size > 1 and not is_manual_lowering(ctx)
  return getattr(axis_context, "num_devices", 1) > 1


def sdy_sharding_rule(operand_factors, result_factors, operand_types, result_types,
                      need_replication_factors: tuple[str, ...],
                      reduction_factors: tuple[str, ...] = ()) -> ir.Attribute:
  """jax's Shardy rule attribute from one factor name per dim of each operand
  and result (built from mappings, not text: zero results and scalars too)."""
  rule = SdyShardingRule(
      tuple(ArrayMapping(*names) for names in operand_factors),
      tuple(ArrayMapping(*names) for names in result_factors),
      need_replication_factors=tuple(need_replication_factors),
      reduction_factors=tuple(reduction_factors))
  return sdy_sharding_rule_to_mlir(rule, list(operand_types), list(result_types))


# ---------------------------------------------------------------------------
# FFI handlers and partitioners, per target name
# ---------------------------------------------------------------------------

def xla_platform_name(platform: str) -> str:
  """jax's platform name (``cpu``, ``cuda``) as XLA's handler registry keys it."""
  return {"cpu": "Host", "cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM"}.get(
      platform.lower(), platform)


def handler_api(name: str, platform: str) -> str | None:
  """How ``name`` is registered on ``platform``: ``"ffi"`` (a typed-FFI
  handler), ``"legacy"`` (the legacy custom-call API) or None. Registrations
  jax still queues (its backend not started yet) count too."""
  xla_name = xla_platform_name(platform)
  with xla_client._custom_callback_lock:
    for queued_name, _fn, api_version, _ in xla_client._custom_callback.get(xla_name, ()):
      if queued_name == name:
        return "ffi" if api_version == 1 else "legacy"
  if xla_name not in xla_client._custom_callback_handler:
    return None  # no backend for this platform in this process
  try:
    found = xla_client.custom_call_targets(xla_name).get(name)
  except Exception:  # noqa: BLE001 - a platform without a handler registry
    return None
  # A typed-FFI handler comes back as its bundle (a dict), a legacy target as
  # its bare function capsule.
  return None if found is None else "ffi" if isinstance(found, dict) else "legacy"


def platforms_with_handler(name: str, api: str = "ffi") -> list[str]:
  """The platforms (XLA names) on which ``name`` has a handler of ``api``
  (``"ffi"``: typed FFI, ``"legacy"``)."""
  with xla_client._custom_callback_lock:
    platforms = set(xla_client._custom_callback_handler) | set(xla_client._custom_callback)
  return sorted(p for p in platforms if handler_api(name, p) == api)


def register_partitioner(name: str, *, propagate_user_sharding: Callable,
                         partition: Callable,
                         infer_sharding_from_operands: Callable) -> None:
  """Registers callbacks for ``name`` on the CPU client and every PJRT plugin,
  including plugins discovered later."""
  register = functools.partial(
      xla_client.register_custom_call_partitioner,
      name,
      propagate_user_sharding,
      partition,
      infer_sharding_from_operands,
      True,  # can_side_effecting_have_replicated_sharding
  )
  register()
  xla_bridge.register_plugin_callbacks(lambda c_api: register(c_api=c_api))


# ---------------------------------------------------------------------------
# Other primitives (batchpart.partition_primitive)
# ---------------------------------------------------------------------------

def wrap_lowering_rules(primitive, wrap: Callable) -> bool:
  """Replaces each lowering rule registered for ``primitive`` (the default
  one and every platform's) by ``wrap(rule)``; False if it has none."""
  found = False
  tables = [(None, mlir._lowerings)] + list(mlir._platform_specific_lowerings.items())
  for _platform, table in tables:
    entry = table.get(primitive)
    if entry is None:
      continue
    found = True
    table[primitive] = dataclasses.replace(entry, rule=wrap(entry.rule))
  return found


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


# ---------------------------------------------------------------------------
# The declarations in force as part of jax's cache keys
# ---------------------------------------------------------------------------

# A jax user context, not a config option: jax makes every option an absl
# flag and a JAX_* environment variable, which hold strings, and this value
# is an object. It is part of jax's jit and trace-cache keys.
_declarations_key = jax.make_user_context(default_value=None)


def set_declarations_key(snapshot) -> None:
  """Puts ``snapshot`` (an immutable object, or None) in force as the
  declarations part of jax's cache keys, for every thread."""
  _declarations_key.set_global(snapshot)


def declarations_key():
  """The declarations snapshot in force for this thread (None until set)."""
  # jax's jit reads this value into its key when a call starts (C++, thread
  # override else global) and reads it again for each cache it consults, but
  # never pins it: a global change in between is seen here (jax 0.10.2, 0.12).
  return _declarations_key.value


# ---------------------------------------------------------------------------
# Host callbacks (bp.pure_callback, bp.io_callback)
# ---------------------------------------------------------------------------

def io_effect():
  """jax's unordered IO effect (``jax.experimental.io_callback``'s): keeps
  the call alive and is allowed inside control flow."""
  from jax._src import callback as jax_callback
  return jax_callback._IOEffect


def require_devices_during_lowering(primitive) -> None:
  """Marks ``primitive`` as needing a backend while lowering, as jax marks
  its own callback primitives."""
  dispatch.prim_requires_devices_during_lowering.add(primitive)


def register_uncached_lowering(primitive, rule: Callable) -> None:
  """A lowering rule whose output depends on the module being built (a host
  callback's index into its list of callbacks), so never reused."""
  mlir.register_lowering(primitive, rule, cacheable=False)


def add_host_callback(ctx, callable_) -> int:
  """Adds ``callable_`` to the host callbacks handed to the compiler with
  the module (the executable holds it until it dies); returns its index,
  the ``index`` attribute of jax's callback custom calls."""
  ctx.module_context.add_host_callback(callable_)
  return len(ctx.module_context.host_callbacks) - 1


def host_callback_target(platform: str) -> str:
  """jax's typed-FFI host callback target for a lowering platform: it calls
  ``host_callbacks[index](*numpy arrays)`` and copies the returned tuple of
  arrays into the result buffers."""
  device = "gpu" if platform in ("cuda", "rocm") else "cpu"
  return f"xla_ffi_python_{device}_callback"


def is_partially_manual_lowering(ctx) -> bool:
  """Whether the op is lowered in a ``shard_map`` over some mesh axes only
  (the others automatic)."""
  axis_context = ctx.module_context.axis_context
  manual = getattr(axis_context, "manual_axes", frozenset())
  mesh = getattr(axis_context, "mesh", None)
  return bool(mesh is not None and manual and not is_manual_lowering(ctx))


def num_partitions(ctx) -> int:
  """How many partitions (devices) the program being lowered has."""
  axis_context = ctx.module_context.axis_context
  mesh = getattr(axis_context, "mesh", None)
  if mesh is not None:
    return int(mesh.size)
  return int(getattr(axis_context, "num_devices", 1))


ir_constant = mlir.ir_constant


def canonicalize_value(x):
  """A callback result as jax canonicalizes it (float64 -> float32 where
  x64 is off)."""
  from jax._src import dtypes
  return dtypes.canonicalize_value(x)


def check_result_shape_dtype(shape_dtype) -> None:
  """jax's check that a callback's declared result dtype is canonical."""
  from jax._src import callback as jax_callback
  jax_callback._check_shape_dtype(shape_dtype)


# ---------------------------------------------------------------------------
# jax.export
# ---------------------------------------------------------------------------

def after_exported_call_lowering(callback: Callable) -> None:
  """Calls ``callback(ctx, ops)`` whenever a deserialized ``jax.export``
  artifact has been lowered into a program (jax's ``call_exported``
  primitive), with the top-level ops that lowering added to the caller's
  module (the artifact's inlined functions)."""
  from jax._src.export import _export
  prim = _export.call_exported_p
  entry = mlir._lowerings[prim]
  original = entry.rule
  if getattr(original, "_batchpart_hook", False):
    return

  def lowering(ctx, *args, exported, **params):
    body = ctx.module_context.module.body
    before = {hash(op.operation) for op in body.operations}
    out = original(ctx, *args, exported=exported, **params)
    callback(ctx, [op for op in body.operations if hash(op.operation) not in before])
    return out

  lowering._batchpart_hook = True
  mlir.register_lowering(prim, lowering, inline=entry.inline)


def stable_custom_call_targets() -> set[str]:
  """The custom-call targets jax.export allows without a disabled check."""
  from jax._src.export import _export
  return set(_export._CUSTOM_CALL_TARGETS_GUARANTEED_STABLE)


def extend_export_safety_checks(extra_checks: Callable) -> None:
  """Wraps jax.export's module check so that ``extra_checks(module,
  disabled_checks)`` can add disabled checks (derived target names of the
  targets the user allowed)."""
  from jax._src.export import _export
  original = _export._check_module
  if getattr(original, "_batchpart_hook", False):
    return

  def check_module(mod, *, disabled_checks, **kwargs):
    disabled = list(disabled_checks) + list(extra_checks(mod, disabled_checks))
    return original(mod, disabled_checks=disabled, **kwargs)

  check_module._batchpart_hook = True
  _export._check_module = check_module


def disabled_custom_call_target(check) -> str | None:
  return check.is_custom_call()


def custom_call_check(target: str):
  return jax.export.DisabledSafetyCheck.custom_call(target)


def check_versions() -> None:
  def key(v):
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())
  if key(jax.__version__) < key(JAX_VERSION_CHECKED):
    warnings.warn(f"batchpart was checked against jax >= {JAX_VERSION_CHECKED}; "
                  f"this is jax {jax.__version__}.", RuntimeWarning, stacklevel=2)
