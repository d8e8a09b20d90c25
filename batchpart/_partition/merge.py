"""A ``bp.Combiner``'s merge in the per-device module.

Each device gathers every part's combining results (one all-gather), then
folds them in part order with the user's merge, vmapped over the batch
dims. The fold is a ``jax.numpy`` function: it is lowered by jax on these
local shapes, as ``custom_partitioning`` lowers its partition functions,
and its functions are moved into the module being built under private
names, where one ``func.call`` runs it.
"""

from __future__ import annotations

import jax
import numpy as np

from batchpart import _compat as compat
from batchpart._partition import emit
from batchpart._vocab.dims.user_combiner import Registered

ir = compat.ir
_PREFIX = "batchpart_merge_"


def part_order(groups, part_offsets) -> list[int]:
  """The gathered slots in part order: the same for every group, since the
  plan's groups all run over the same mesh axes."""
  orders = {tuple(int(i) for i in np.argsort([part_offsets[d] for d in g], kind="stable"))
            for g in groups}
  if len(orders) != 1:
    raise AssertionError(f"reduce groups {groups} disagree on the order of their parts")
  return list(orders.pop())


def fold(reg: Registered, results, groups, order) -> list:
  """``results`` (this device's combining results, index results already
  global) merged over each device group, parts in ``order``."""
  shapes = [list(ir.RankedTensorType(r.type).shape) for r in results]
  lifted = [emit.reshaped(r, [1, *s]) for r, s in zip(results, shapes)]
  gathered = emit.all_gather(lifted, 0, groups)
  batch_rank = len(shapes[0]) - len(reg.element_types[0].shape)

  def merge_parts(*parts):
    merge = reg.combiner.merge
    for _ in range(batch_rank):
      merge = jax.vmap(merge)
    acc = tuple(p[order[0]] for p in parts)
    for j in order[1:]:
      acc = tuple(merge(acc, tuple(p[j] for p in parts)))
    return acc

  types = [jax.ShapeDtypeStruct((len(order), *s), t.dtype)
           for s, t in zip(shapes, reg.element_types)]
  with jax.enable_x64(reg.x64):
    lowered = jax.jit(merge_parts).lower(*types).compiler_ir("stablehlo")
  entry = _import_functions(str(lowered))
  result_types = [r.type for r in results]
  call = compat.func_dialect.CallOp(result_types, ir.FlatSymbolRefAttr.get(entry), gathered)
  return list(call.results)


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
