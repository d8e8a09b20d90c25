"""The per-device module that replaces a partitioned call."""

from __future__ import annotations

import numpy as np

from batchpart import _compat as compat
from batchpart._partition import attributes, combine, emit, halo, scan
from batchpart._vocab.description import CallDescription, without_unit_batch

ir = compat.ir


def _tensor_type(shape, dtype) -> ir.Type:
  return ir.RankedTensorType.get(list(shape), compat.dtype_to_ir_type(np.dtype(dtype)))


def _first_batch_dims(d: CallDescription):
  """Each operand's and each result's first batch dim (None where it has
  none)."""
  first = lambda leads, ranks: [lead if rank else None for lead, rank in zip(leads, ranks)]
  return (first(d.operand_leads, d.operand_batch_ranks),
          first(d.result_leads, d.result_batch_ranks))


def _user_call(d: CallDescription, operands, result_types, config) -> list:
  """The user's custom call on these operands; a ``unit_batch`` callback's
  on its arrays without the unit batch dim, which only XLA's partitioner
  needed (the target sees the user's shapes), added back to its results."""
  if not d.unit_batch:
    return list(emit.custom_call(d.target, d, operands, result_types, config))
  shape = lambda t: ir.RankedTensorType(t).shape
  inner = [ir.RankedTensorType.get(shape(t)[1:], ir.RankedTensorType(t).element_type)
           for t in result_types]
  results = emit.custom_call(
      d.target, without_unit_batch(d),
      [operands[0], *(emit.reshaped(v, shape(v.type)[1:]) for v in operands[1:])],
      inner, config)
  return [emit.reshaped(r, shape(t)) for r, t in zip(results, result_types)]


def build(d: CallDescription, *, operand_shapes, operand_dtypes, result_shapes,
          result_dtypes, backend_config: bytes, batch_shape, rule=None,
          block_table=None, reduce_groups=(), core_sizes=None, part_offsets=None,
          exchanges=(), carry=None) -> bytes:
  """The same custom call on local shapes, under the user's target name (it
  needs no partitioner), restating everything the description holds, its FFI
  attributes rewritten by the per-shard attribute ``rule`` if any (given
  ``core_sizes``, the local size of each named core dim, where it takes
  them). With a ``block_table`` (host callbacks), operand 0 is replaced by
  the table's row for this device's ``partition_id``. With
  ``reduce_groups``, the results are combined over those device groups by the
  description's reduction op (``combine``; an argmax or argmin reads each
  device's global start of its part in ``part_offsets``). With halo
  ``exchanges``, the call runs on each device's windows and its results are
  cut back to the device's parts (``halo``). With a scanned dim's
  ``carry``, the call runs on each device's part from the state the part
  starts in (``scan``)."""
  with compat.make_ir_context() as context, ir.Location.unknown(context):
    module = ir.Module.create()
    arg_types = [_tensor_type(s, t) for s, t in zip(operand_shapes, operand_dtypes)]
    res_types = [_tensor_type(s, t) for s, t in zip(result_shapes, result_dtypes)]
    config = attributes.parse(backend_config)
    if rule is not None:
      values = {k: attributes.to_python(v) for k, v in config.items()}
      new = rule.call(values, tuple(int(b) for b in batch_shape), core_sizes or {})
      config.update({k: compat.ir_attribute(v) for k, v in (new or {}).items()})
    with ir.InsertionPoint(module.body):
      main = compat.func_dialect.FuncOp("main", ir.FunctionType.get(arg_types, res_types))
      main.attributes["sym_visibility"] = ir.StringAttr.get("public")
      block = main.add_entry_block()  # type: ignore[attr-defined]  # jaxlib's MLIR stubs omit it
      with ir.InsertionPoint(block):
        operands = list(block.arguments)
        if block_table is not None:
          operands[0] = emit.table_row(block_table)
        call_types = res_types
        if exchanges:
          operands = [halo.windowed(v, halo.array_dims(exchanges, "o", k, len(s)), exchanges)
                      for k, (v, s) in enumerate(zip(operands, operand_shapes))]
          dims = [halo.array_dims(exchanges, "r", k, len(s))
                  for k, s in enumerate(result_shapes)]
          call_types = [_tensor_type(halo.window_size(s, dim, exchanges), t)
                        for s, t, dim in zip(result_shapes, result_dtypes, dims)]
        call = lambda ops, types: _user_call(d, ops, types, config)
        if carry is not None:
          results = scan.scanned(
              carry, call, operands, call_types, d.target,
              None if block_table is not None or rule is not None else _first_batch_dims(d))
        else:
          results = call(operands, call_types)
        if exchanges:
          results = [halo.kept(r, dim, exchanges) for r, dim in zip(results, dims)]
        if len(reduce_groups):
          results = combine.combine(d, results, reduce_groups, part_offsets)
        compat.func_dialect.ReturnOp(results)
    return compat.module_to_bytecode(module)
