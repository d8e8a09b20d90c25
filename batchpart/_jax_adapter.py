"""Everything batchpart takes from jax and jaxlib internals, in one place.

Checked against jax/jaxlib 0.10.2 (and the test suite run on 0.12.0.1 under
Python 3.12). What this module relies on:
- ``jax._src.core`` (Primitive, ShapedArray, typeof, abstract mesh helpers),
  ``jax._src.interpreters.mlir`` (``register_lowering``, ``custom_call``,
  ``ir_attribute``, ``aval_to_ir_type``, ``module_to_bytecode``,
  ``make_ir_context``), ``jax._src.interpreters.batching`` and ``ad``.
- ``jax._src.lib.xla_client.register_custom_call_partitioner`` and
  ``jax._src.xla_bridge.register_plugin_callbacks`` (per-target partitioner
  registration on the in-process CPU client and on PJRT plugins).
- ``jax._src.lib.xla_client.HloSharding``'s accessors and constructors.
- ``jax._src.custom_partitioning_sharding_rule`` (``str_to_sdy_sharding_rule``,
  ``sdy_sharding_rule_to_mlir``), the same helpers jax's own linalg uses.
- ``jax._src.ffi.ffi_call_p`` (to rewrite plain ``jax.ffi.ffi_call``s inside a
  decorated wrapper).
- ``jax._src.export._export.call_exported_p`` and ``mlir._lowerings``: the
  lowering of a deserialized ``jax.export`` artifact is wrapped so that the
  batchpart calls inside it are recorded before XLA partitions them.
The rest of batchpart imports these names from here, never from ``jax._src``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import numpy as np

import jax.extend.core as jax_extend_core
from jax._src import config as jax_config
from jax._src import core
from jax._src import dispatch
from jax._src import ffi as jax_ffi
from jax._src import xla_bridge
from jax._src.custom_partitioning_sharding_rule import (
    sdy_sharding_rule_to_mlir,
    str_to_sdy_sharding_rule,
)
from jax._src.interpreters import ad, batching, mlir
from jax._src.lib import xla_client
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import func as func_dialect
from jax._src.lib.mlir.dialects import hlo

from batchpart import _core

JAX_VERSION_CHECKED = "0.10.2"

Primitive = jax_extend_core.Primitive
ShapedArray = core.ShapedArray
abstract_token = core.abstract_token
typeof = core.typeof
jax_ffi_call_p = jax_ffi.ffi_call_p
wrap_kwargs_hashable = jax_ffi._wrap_kwargs_hashable
unwrap_kwargs_hashable = jax_ffi._unwrap_kwargs_hashable
ffi_effect = jax_ffi._FfiEffect
no_effects = core.no_effects
standard_vma_rule = core.standard_vma_rule
get_cur_mesh_sharding = core.get_cur_mesh_sharding
convert_layout_for_lowering = jax_ffi._convert_layout_for_lowering
convert_layouts_for_ffi_call = jax_ffi._convert_layouts_for_ffi_call
check_compatible_avals = jax_ffi._check_compatible_avals
result_avals_from_shape_dtypes = jax_ffi._result_avals
auto_insert_reshard = core.auto_insert_reshard
moveaxis = batching.moveaxis
register_lowering = mlir.register_lowering
primitive_batchers = batching.primitive_batchers
primitive_jvps = ad.primitive_jvps
primitive_transposes = ad.primitive_transposes
simple_impl = dispatch.simple_impl


def use_shardy() -> bool:
  return bool(jax_config.use_shardy_partitioner.value)


def is_manual_lowering(ctx) -> bool:
  """Whether the op is lowered inside a fully manual region (shard_map)."""
  axis_context = ctx.module_context.axis_context
  manual = getattr(axis_context, "manual_axes", frozenset())
  mesh = getattr(axis_context, "mesh", None)
  return bool(mesh is not None and manual and
              frozenset(mesh.axis_names) <= frozenset(manual))


# ---------------------------------------------------------------------------
# Lowering
# ---------------------------------------------------------------------------

def ir_types(ctx, avals) -> list[ir.Type]:
  return [mlir.aval_to_ir_type(ctx.module_context, a) for a in avals]


def sdy_sharding_rule(rule: str, operand_types, result_types,
                      need_replication_factors: tuple[str, ...]) -> ir.Attribute:
  return sdy_sharding_rule_to_mlir(
      str_to_sdy_sharding_rule(
          rule, need_replication_factors=need_replication_factors),
      list(operand_types), list(result_types))


def emit_custom_call(target_name: str, operands, *, result_types,
                     backend_config, api_version: int, has_side_effect: bool,
                     operand_layouts, result_layouts, aliases,
                     extra_attributes=None):
  return mlir.custom_call(
      target_name,
      result_types=list(result_types),
      operands=list(operands),
      backend_config=backend_config,
      api_version=api_version,
      has_side_effect=has_side_effect,
      operand_layouts=[list(l) for l in operand_layouts],
      result_layouts=[list(l) for l in result_layouts],
      operand_output_aliases=dict(aliases) or None,
      extra_attributes=extra_attributes,
  ).results


def attribute_dict(attributes: dict) -> dict[str, ir.Attribute]:
  return {k: mlir.ir_attribute(v) for k, v in attributes.items()}


def frontend_attributes(values: dict[str, str]) -> ir.Attribute:
  return mlir.ir_attribute(values)


def build_shard_module(target_name: str, *, operand_shapes, operand_dtypes,
                       result_shapes, result_dtypes, backend_config: bytes,
                       api_version: int, has_side_effect: bool,
                       operand_layouts, result_layouts, aliases) -> bytes:
  """The per-device module that replaces the call: the same custom call on
  local shapes, restating every attribute (anything left out is lost)."""
  with mlir.make_ir_context() as context, ir.Location.unknown(context):
    module = ir.Module.create()
    arg_types = [_tensor_type(s, d) for s, d in zip(operand_shapes, operand_dtypes)]
    res_types = [_tensor_type(s, d) for s, d in zip(result_shapes, result_dtypes)]
    with ir.InsertionPoint(module.body):
      main = func_dialect.FuncOp(
          "main", ir.FunctionType.get(arg_types, res_types))
      main.attributes["sym_visibility"] = ir.StringAttr.get("public")
      block = main.add_entry_block()
      with ir.InsertionPoint(block):
        results = emit_custom_call(
            target_name, block.arguments, result_types=res_types,
            backend_config=_parse_backend_config(backend_config, api_version),
            api_version=api_version, has_side_effect=has_side_effect,
            operand_layouts=operand_layouts, result_layouts=result_layouts,
            aliases=aliases)
        func_dialect.ReturnOp(results)
    return mlir.module_to_bytecode(module)


def _tensor_type(shape, dtype) -> ir.Type:
  return ir.RankedTensorType.get(list(shape), mlir.dtype_to_ir_type(np.dtype(dtype)))


def canonical_backend_config(config) -> str:
  """The backend config as MLIR prints it, so that the attributes a lowering
  emits and the bytes XLA hands a partitioner callback compare equal."""
  return _canonical_backend_config(
      (config.decode() if isinstance(config, bytes) else str(config)).strip())


@functools.lru_cache(maxsize=4096)
def _canonical_backend_config(text: str) -> str:
  # Parsing needs an MLIR context, which is slow to make: every call site
  # of a program repeats the same few configs.
  if not text:
    return "{}"
  if not text.startswith("{"):
    return text  # a legacy (api_version < 4) opaque string
  with mlir.make_ir_context():
    return str(ir.Attribute.parse(text))


def backend_config_text(backend_config) -> str:
  """What XLA will print for a lowering's backend config (call it while
  lowering: the attributes live in the lowering's MLIR context)."""
  if isinstance(backend_config, dict):
    return canonical_backend_config(str(ir.DictAttr.get(backend_config)))
  return canonical_backend_config(backend_config)


def _parse_backend_config(config: bytes, api_version: int):
  text = config.decode() if isinstance(config, bytes) else str(config)
  if api_version < 4:
    return text
  if not text.strip():
    return {}
  parsed = ir.DictAttr(ir.Attribute.parse(text))
  return {named.name: named.attr for named in parsed}


# ---------------------------------------------------------------------------
# Reading batchpart calls back from a StableHLO module (jax.export)
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModuleCall:
  target: str
  operand_types: tuple  # ((shape, dtype name), ...)
  result_types: tuple
  backend_config: str
  batch_ranks: str
  operand_layouts: tuple
  result_layouts: tuple
  aliases: tuple
  has_side_effect: bool
  api_version: int


_MLIR_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
                "i1": "bool", "complex<f32>": "complex64", "complex<f64>": "complex128"}


def _mlir_type(t: ir.Type) -> tuple:
  tensor = ir.RankedTensorType(t)
  element = str(tensor.element_type)
  if element in _MLIR_DTYPES:
    name = _MLIR_DTYPES[element]
  elif element.startswith("ui"):
    name = f"uint{element[2:]}"
  elif element.startswith("i"):
    name = f"int{element[1:]}"
  else:
    name = element
  return tuple(tensor.shape), name


def _layouts(op, name: str, types) -> tuple:
  if name not in op.attributes:
    return tuple(tuple(reversed(range(len(s)))) for s, _ in types)
  return tuple(tuple(int(d) for d in ir.DenseIntElementsAttr(a))
               for a in ir.ArrayAttr(op.attributes[name]))


def _aliases(op) -> tuple:
  if "output_operand_aliases" not in op.attributes:
    return ()
  out = []
  for a in ir.ArrayAttr(op.attributes["output_operand_aliases"]):
    alias = hlo.OutputOperandAlias(a)
    result = alias.output_tuple_indices[0] if len(alias.output_tuple_indices) else 0
    out.append((int(alias.operand_index), int(result)))
  return tuple(sorted(out))


def _walk(operation):
  for region in operation.regions:
    for block in region.blocks:
      for op in block.operations:
        yield op
        yield from _walk(op.operation)


def batchpart_calls_in_module(module, attribute: str) -> list[ModuleCall]:
  """The custom calls of `module` that carry the frontend attribute
  `attribute` (batchpart's batch ranks)."""
  calls = []
  with mlir.make_ir_context() as context:
    if isinstance(module, bytes):
      module = module.decode()
    if isinstance(module, str):
      module = ir.Module.parse(module, context)
    else:
      module = ir.Module.parse(mlir.module_to_string(module), context)
    for op in _walk(module.operation):
      if op.operation.name != "stablehlo.custom_call":
        continue
      attrs = op.attributes
      frontend = (ir.DictAttr(attrs["mhlo.frontend_attributes"])
                  if "mhlo.frontend_attributes" in attrs else None)
      if frontend is None or attribute not in frontend:
        continue
      operand_types = tuple(_mlir_type(v.type) for v in op.operands)
      result_types = tuple(_mlir_type(r.type) for r in op.results)
      api_version = int(ir.IntegerAttr(attrs["api_version"]).value) \
          if "api_version" in attrs else 4
      config = (str(attrs["mhlo.backend_config"]) if "mhlo.backend_config" in attrs
                else ir.StringAttr(attrs["backend_config"]).value
                if "backend_config" in attrs else "")
      calls.append(ModuleCall(
          target=ir.StringAttr(attrs["call_target_name"]).value,
          operand_types=operand_types,
          result_types=result_types,
          backend_config=canonical_backend_config(config),
          batch_ranks=ir.StringAttr(frontend[attribute]).value,
          operand_layouts=_layouts(op, "operand_layouts", operand_types),
          result_layouts=_layouts(op, "result_layouts", result_types),
          aliases=_aliases(op),
          has_side_effect=bool(ir.BoolAttr(attrs["has_side_effect"]).value)
          if "has_side_effect" in attrs else False,
          api_version=api_version,
      ))
  return calls


def on_exported_call_lowering(callback: Callable) -> None:
  """Calls `callback(module_text)` whenever a deserialized jax.export
  artifact is lowered into a program (jax's ``call_exported`` primitive),
  before the original lowering runs."""
  from jax._src.export import _export
  prim = _export.call_exported_p
  entry = mlir._lowerings[prim]
  original = entry.rule
  if getattr(original, "_batchpart_hook", False):
    return

  def lowering(ctx, *args, exported, **params):
    callback(exported.mlir_module())
    return original(ctx, *args, exported=exported, **params)

  lowering._batchpart_hook = True
  mlir.register_lowering(prim, lowering, inline=entry.inline)


# ---------------------------------------------------------------------------
# Shardings: jaxlib HloSharding <-> planner types
# ---------------------------------------------------------------------------

HloSharding = xla_client.HloSharding
_Kind = _core.Sharding.Kind
_Subgroup = _core.Sharding.Subgroup
_OpType = xla_client.OpSharding.Type


def to_planner_sharding(sharding, rank: int) -> _core.Sharding:
  out = _core.Sharding()
  if sharding is None or sharding.is_replicated():
    return out
  if sharding.is_manual():
    out.kind = _Kind.MANUAL
    return out
  if sharding.is_maximal():
    out.kind = _Kind.MAXIMAL
    out.devices = list(sharding.tile_assignment_devices())[:1]
    return out
  if not sharding.is_tiled():
    raise ValueError(f"unsupported sharding {sharding}")
  dims = list(sharding.tile_assignment_dimensions())
  if sharding.replicate_on_last_tile_dim():
    kinds = [_Subgroup.REPLICATED]
  else:
    kinds = [_Subgroup.MANUAL if t == _OpType.MANUAL else _Subgroup.REPLICATED
             for t in sharding.subgroup_types()]
  if len(dims) - len(kinds) != rank:
    raise ValueError(f"sharding {sharding} does not fit an array of rank {rank}")
  out.kind = _Kind.TILED
  out.tile_dims = dims[:rank]
  out.subgroup_dims = dims[rank:]
  out.subgroup_kinds = kinds
  out.devices = list(sharding.tile_assignment_devices())
  return out


def from_planner_sharding(sharding: _core.Sharding):
  if sharding.kind == _Kind.REPLICATED:
    return HloSharding.replicate()
  if sharding.kind == _Kind.MANUAL:
    return HloSharding.manual()
  if sharding.kind == _Kind.MAXIMAL:
    raise ValueError("the planner never plans a maximal sharding")
  types = [_OpType.MANUAL if k == _Subgroup.MANUAL else _OpType.REPLICATED
           for k in sharding.subgroup_kinds]
  devices = np.asarray(sharding.devices, dtype=np.int64).reshape(
      list(sharding.tile_dims) + list(sharding.subgroup_dims))
  return HloSharding.subgroup_with_device_ordering(devices, subgroup_types=types)


def element_shardings(sharding, shape) -> list:
  """Per-array shardings of a possibly-tuple result."""
  if shape.is_tuple():
    n = len(shape.tuple_shapes())
    if sharding is None:
      return [None] * n
    elements = sharding.tuple_elements()
    return list(elements) if elements else [sharding] * n
  return [sharding]


def pack_result_sharding(shape, shardings):
  if shape.is_tuple():
    return HloSharding.tuple_sharding(shape, list(shardings))
  return shardings[0]


def array_shapes(shape) -> list:
  return list(shape.tuple_shapes()) if shape.is_tuple() else [shape]


# ---------------------------------------------------------------------------
# Partitioner registration
# ---------------------------------------------------------------------------

def register_partitioner(name: str, *, propagate_user_sharding: Callable,
                         partition: Callable,
                         infer_sharding_from_operands: Callable) -> None:
  """Registers callbacks for ``name`` on the CPU client now and on every PJRT
  plugin, including plugins discovered later."""
  register = functools.partial(
      xla_client.register_custom_call_partitioner,
      name,
      propagate_user_sharding,
      partition,
      infer_sharding_from_operands,
      True,  # can_side_effecting_have_replicated_sharding
  )
  register()
  xla_bridge.register_plugin_callbacks(
      lambda c_api: register(c_api=c_api))


# Public since jax 0.4.36; jax 0.12 moved ClosedJaxpr out of jax._src.core.
ClosedJaxpr = jax_extend_core.ClosedJaxpr
Literal = jax_extend_core.Literal
