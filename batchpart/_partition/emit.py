"""Emitting a described custom call into the MLIR module being built."""

from __future__ import annotations

import jax
import numpy as np

from batchpart import _compat as compat
from batchpart._vocab.description import CallDescription

ir, hlo = compat.ir, compat.hlo
_COMBINERS = {"sum": hlo.add, "max": hlo.maximum, "min": hlo.minimum}


def custom_call(name: str, d: CallDescription, operands, result_types, backend_config,
                extra_attributes=None):
  """``stablehlo.custom_call @name`` with the description's layouts, aliases
  and side effect; returns its results. ``backend_config`` is the dict of
  FFI attributes (name -> MLIR attribute)."""
  return compat.custom_call(
      name,
      result_types=list(result_types),
      operands=list(operands),
      backend_config=backend_config,
      api_version=4,
      has_side_effect=d.has_side_effect,
      operand_layouts=[list(l) for l in d.operand_layouts],
      result_layouts=[list(l) for l in d.result_layouts],
      operand_output_aliases=dict(d.aliases) or None,
      extra_attributes=extra_attributes,
  ).results


def all_reduce(value, op: str, groups) -> ir.Value:
  """``value`` combined with ``op`` ("sum", "max", "min") over each group of
  devices (logical ids, as in the call's shardings): the form jax's own psum
  takes in an SPMD program (a channel and global device ids; without them
  XLA reads the groups as replica ids and fails at run time)."""
  op_ = hlo.AllReduceOp(
      [value.type], [value],
      replica_groups=ir.DenseIntElementsAttr.get(  # type: ignore[call-overload]  # stubs: arrays
          np.asarray(groups, dtype=np.int64)),
      channel_handle=hlo.ChannelHandle.get(compat.COLLECTIVE_CHANNEL_ID,
                                           compat.DEVICE_TO_DEVICE_TYPE),
      use_global_device_ids=ir.BoolAttr.get(True))  # type: ignore[arg-type]  # stubs: a bool
  scalar = ir.RankedTensorType.get([], ir.RankedTensorType(value.type).element_type)
  block = op_.regions[0].blocks.append(scalar, scalar)
  with ir.InsertionPoint(block):
    hlo.return_([_COMBINERS[op](*block.arguments)])
  return op_.result


def all_gather(values, dim: int, groups) -> list:
  """``values`` (of one shape) each concatenated along ``dim`` over each
  group of devices, in the group's order, in one collective (the form of
  ``all_reduce``)."""
  n = len(groups[0])
  types = []
  for v in values:
    t = ir.RankedTensorType(v.type)
    shape = list(t.shape)
    shape[dim] *= n
    types.append(ir.RankedTensorType.get(shape, t.element_type))
  op_ = hlo.AllGatherOp(
      types, values, dim,
      ir.DenseIntElementsAttr.get(np.asarray(groups, dtype=np.int64)),  # type: ignore[call-overload]  # stubs: arrays
      channel_handle=hlo.ChannelHandle.get(compat.COLLECTIVE_CHANNEL_ID,
                                           compat.DEVICE_TO_DEVICE_TYPE),
      use_global_device_ids=True)
  return list(op_.results)


def reshaped(value, shape) -> ir.Value:
  """``value`` reshaped to ``shape``."""
  kind = ir.RankedTensorType(value.type).element_type
  return hlo.reshape(ir.RankedTensorType.get(list(shape), kind), value)


def table_row(table) -> ir.Value:
  """``table[partition_id]`` for an int64 table of shape (partitions, n)."""
  table = np.ascontiguousarray(table, dtype=np.int64)
  n = table.shape[1]
  i64 = ir.IntegerType.get_signless(64)
  constant = hlo.constant(ir.DenseElementsAttr.get(table))
  pid = hlo.convert(ir.RankedTensorType.get([], i64), hlo.partition_id())
  zero = hlo.constant(ir.DenseElementsAttr.get(np.zeros((), np.int64)))  # type: ignore[call-overload]  # stubs: arrays
  row = hlo.dynamic_slice(constant, [pid, zero], [1, n])
  return hlo.reshape(ir.RankedTensorType.get([n], i64), row)


def partition_scalar(values) -> ir.Value:
  """``values[partition_id]`` as an int64 scalar, for an int64 vector
  indexed by partition id."""
  row = table_row(np.asarray(values).reshape(-1, 1))
  return hlo.reshape(ir.RankedTensorType.get([], ir.IntegerType.get_signless(64)), row)


def partition_index(values) -> ir.Value:
  """``values[partition_id]`` as an int32 scalar: a ``stablehlo.case``
  branch index, for an int vector indexed by partition id."""
  return hlo.convert(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)),
                     partition_scalar(np.asarray(values, np.int64)))


def int64(value: int) -> ir.Value:
  """The int64 scalar constant ``value``."""
  return hlo.constant(ir.DenseElementsAttr.get(np.asarray(value, np.int64)))  # type: ignore[call-overload]  # stubs: arrays


def slice_along(value, dim: int, start, size: int) -> ir.Value:
  """``value``'s ``size`` elements from the int64 scalar ``start`` along
  ``dim``."""
  shape = list(ir.RankedTensorType(value.type).shape)
  starts = [start if a == dim else int64(0) for a in range(len(shape))]
  shape[dim] = size
  return hlo.dynamic_slice(value, starts, ir.DenseI64ArrayAttr.get(shape))


def static_slice_along(value, dim: int, start: int, stop: int) -> ir.Value:
  """``value``'s elements ``start .. stop`` along ``dim``."""
  shape = list(ir.RankedTensorType(value.type).shape)
  begin, end = [0] * len(shape), list(shape)
  begin[dim], end[dim] = start, stop
  return hlo.slice(value, ir.DenseI64ArrayAttr.get(begin), ir.DenseI64ArrayAttr.get(end),
                   ir.DenseI64ArrayAttr.get([1] * len(shape)))


def resized_type(value, dim: int, size: int) -> ir.Type:
  """``value``'s type with ``size`` elements along ``dim``."""
  t = ir.RankedTensorType(value.type)
  shape = list(t.shape)
  shape[dim] = size
  return ir.RankedTensorType.get(shape, t.element_type)


def update_along(value, update, dim: int, start) -> ir.Value:
  """``value`` with ``update`` written from the int64 scalar ``start`` along
  ``dim``."""
  rank = len(ir.RankedTensorType(value.type).shape)
  return hlo.dynamic_update_slice(value, update,
                                  [start if a == dim else int64(0) for a in range(rank)])


def collective_permute(value, pairs: np.ndarray) -> ir.Value:
  """``value`` sent along the (source, target) device ``pairs`` (zeros where
  nothing arrives)."""
  return hlo.CollectivePermuteOp(
      value, ir.DenseIntElementsAttr.get(np.ascontiguousarray(pairs, np.int64)),  # type: ignore[call-overload]  # stubs: arrays
      channel_handle=hlo.ChannelHandle.get(compat.COLLECTIVE_CHANNEL_ID,
                                           compat.DEVICE_TO_DEVICE_TYPE)).result


def compare(a, b, direction: str) -> ir.Value:
  return hlo.compare(a, b, hlo.ComparisonDirectionAttr.get(direction))


def splat(value, to: ir.Type) -> ir.Value:
  """``value`` in every element of an array of type ``to``. Floats go
  through float64 so that every width (bfloat16 included) gets them."""
  kind = ir.RankedTensorType(to).element_type
  if isinstance(kind, ir.IntegerType):
    integer = ir.IntegerType(kind)
    dtype = np.dtype(f"{'u' if integer.is_unsigned else 'i'}{max(1, integer.width // 8)}")
    constant = hlo.constant(ir.DenseElementsAttr.get(np.asarray(value, dtype),  # type: ignore[call-overload]  # stubs: arrays
                                                     type=kind))
  else:
    wide = hlo.constant(ir.DenseElementsAttr.get(np.asarray(value, np.float64)))  # type: ignore[call-overload]  # stubs: arrays
    constant = hlo.convert(ir.RankedTensorType.get([], kind), wide)
  return hlo.broadcast_in_dim(to, constant, ir.DenseI64ArrayAttr.get([]))


def jax_function(fn, arg_types, operands, result_types, *, x64: bool) -> list:
  """``fn`` (a ``jax.numpy`` function of ``arg_types``, ShapeDtypeStructs,
  returning ``result_types``) lowered by jax with 64-bit types as ``x64``
  says, its functions moved into the module being built under private
  names, and called on ``operands``: as ``custom_partitioning`` lowers its
  partition functions into the per-device module. ``fn`` may call a
  shape-polymorphic ``jax.export`` artifact (a function an exported program
  carried): its shapes are made static first, since XLA takes no others."""
  with jax.enable_x64(x64), compat.without_mesh():
    lowered = jax.jit(fn).lower(*arg_types).compiler_ir("stablehlo")
  entry = _import_functions(compat.refined_module_text(lowered))
  call = compat.func_dialect.CallOp(list(result_types), ir.FlatSymbolRefAttr.get(entry),
                                    list(operands))
  return list(call.results)


_PREFIX = "batchpart_jax_"


def _import_functions(text: str) -> str:
  """Moves the functions of the module ``text`` into the module being built
  (the one around the current insertion point), renamed and private, with
  no argument or result attributes; returns the entry function's name."""
  body = ir.InsertionPoint.current.block.owner.parent.regions[0].blocks[0]
  parsed = ir.Module.parse(text)
  taken = {ir.StringAttr(op.attributes["sym_name"]).value for op in body.operations
           if "sym_name" in op.attributes}
  funcs = [op for op in parsed.body.operations if op.operation.name == "func.func"]
  renames = {}
  for op in funcs:
    old = ir.StringAttr(op.attributes["sym_name"]).value
    new, i = _PREFIX + old, 0
    while new in taken:
      i += 1
      new = f"{_PREFIX}{i}_{old}"
    taken.add(new)
    renames[old] = new
  for old, new in renames.items():
    ir.SymbolTable.replace_all_symbol_uses(old, new, parsed.operation)
  for op in funcs:
    old = ir.StringAttr(op.attributes["sym_name"]).value
    op.attributes["sym_name"] = ir.StringAttr.get(renames[old])
    op.attributes["sym_visibility"] = ir.StringAttr.get("private")
    for attr in ("arg_attrs", "res_attrs"):
      if attr in op.attributes:
        del op.attributes[attr]
    body.append(op.operation)
  return renames["main"]
