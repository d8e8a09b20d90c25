"""Batch specifications: which leading dims of each operand and result are
batch dims, from ``num_batch_dims=k`` or a gufunc ``signature``.

Everything here is checked before anything is traced, so bad input fails
with a message naming the FFI target and the offending argument.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

_DIM = r"\s*(?:\w+)\s*"
_CORE = rf"\(\s*(?:{_DIM}(?:,{_DIM})*)?,?\s*\)"
_CORES = rf"{_CORE}(?:\s*,\s*{_CORE})*"
_SIGNATURE = re.compile(rf"^\s*(?P<ins>(?:{_CORES})?)\s*->\s*(?P<outs>{_CORES})\s*$")


@dataclasses.dataclass(frozen=True)
class Signature:
  """A parsed gufunc signature: core dim names (or sizes) per argument."""
  inputs: tuple[tuple[str, ...], ...]
  outputs: tuple[tuple[str, ...], ...]

  def __str__(self):
    fmt = lambda cores: ",".join("(" + ",".join(c) + ")" for c in cores)
    return f"{fmt(self.inputs)}->{fmt(self.outputs)}"


def parse_signature(signature: str, *, target_name: str) -> Signature:
  if not isinstance(signature, str) or not _SIGNATURE.match(signature):
    raise ValueError(
        f"batchpart.ffi_call('{target_name}'): signature={signature!r} is not a "
        "gufunc signature like '(m,n),(n)->(m)' (one parenthesised, "
        "comma-separated group of core dims per operand and per result).")
  ins, outs = signature.split("->")

  def groups(text: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(d.strip() for d in g.split(",") if d.strip())
                 for g in re.findall(r"\(([^)]*)\)", text))

  return Signature(groups(ins), groups(outs))


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """How many trailing dims of each operand and result are core dims."""
  operand_core_ranks: tuple[int, ...]
  result_core_ranks: tuple[int, ...]


def require_static_shapes(target_name: str, operand_shapes, result_shapes) -> None:
  """batchpart plans on concrete shapes; a symbolic (shape-polymorphic) dim
  is refused by name rather than failing deep inside jax."""
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if not all(isinstance(d, (int, np.integer)) for d in shape):
        raise NotImplementedError(
            f"batchpart.ffi_call('{target_name}'): {what} {i} has the symbolic shape "
            f"({', '.join(map(str, shape))}); shape-polymorphic export of batchpart "
            "calls is not supported. Export with concrete shapes.")


def _fmt(shape) -> str:
  return str(tuple(int(d) for d in shape))


def broadcast_batch_shapes(target_name: str, batch_shapes: Sequence[tuple[int, ...]]
                           ) -> tuple[int, ...]:
  rank = max((len(s) for s in batch_shapes), default=0)
  out = [1] * rank
  for k, shape in enumerate(batch_shapes):
    for m, size in enumerate(shape):
      i = rank - len(shape) + m
      if size == out[i] or size == 1:
        continue
      if out[i] == 1:
        out[i] = size
        continue
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): the batch shape {_fmt(shape)} of "
          f"operand {k} does not broadcast with the other operands' batch shapes "
          f"(size {size} against {out[i]}). Batch dims broadcast NumPy-style: "
          "equal sizes, size 1, or missing leading dims.")
  return tuple(out)


def spec_from_num_batch_dims(target_name: str, num_batch_dims, operand_shapes,
                             result_shapes) -> BatchSpec:
  if (isinstance(num_batch_dims, bool) or not isinstance(num_batch_dims, int)
      or num_batch_dims < 0):
    raise ValueError(
        f"batchpart.ffi_call('{target_name}'): num_batch_dims must be a "
        f"non-negative int, got {num_batch_dims!r}.")
  k = num_batch_dims
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if len(shape) < k:
        raise ValueError(
            f"batchpart.ffi_call('{target_name}'): num_batch_dims={k} exceeds the "
            f"rank of {what} {i} with shape {_fmt(shape)}.")
  batch = tuple(operand_shapes[0][:k]) if operand_shapes else None
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if batch is not None and tuple(shape[:k]) != batch:
        raise ValueError(
            f"batchpart.ffi_call('{target_name}'): with num_batch_dims={k} every "
            f"operand and result must have the same leading {k} dims; {what} {i} "
            f"has shape {_fmt(shape)}, operand 0 has batch shape {_fmt(batch)}. "
            "Use signature=... for operands whose batch dims broadcast.")
  return BatchSpec(tuple(len(s) - k for s in operand_shapes),
                   tuple(len(s) - k for s in result_shapes))


def spec_from_signature(target_name: str, signature: Signature, operand_shapes,
                        result_shapes) -> BatchSpec:
  if len(signature.inputs) != len(operand_shapes):
    raise ValueError(
        f"batchpart.ffi_call('{target_name}'): signature '{signature}' names "
        f"{len(signature.inputs)} operands but the call got {len(operand_shapes)}.")
  if len(signature.outputs) != len(result_shapes):
    raise ValueError(
        f"batchpart.ffi_call('{target_name}'): signature '{signature}' names "
        f"{len(signature.outputs)} results but result_shape_dtypes has "
        f"{len(result_shapes)}.")
  sizes: dict[str, tuple[int, str]] = {}

  def bind(what: str, i: int, shape, cores) -> tuple[int, ...]:
    if len(shape) < len(cores):
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): {what} {i} has shape {_fmt(shape)}, "
          f"rank {len(shape)}, below the {len(cores)} core dims "
          f"({','.join(cores)}) of signature '{signature}'.")
    core_shape = shape[len(shape) - len(cores):]
    for name, size in zip(cores, core_shape):
      expected = int(name) if name.isdigit() else sizes.get(name, (size, ""))[0]
      if size != expected:
        where = sizes.get(name, (None, "the signature"))[1]
        raise ValueError(
            f"batchpart.ffi_call('{target_name}'): core dim '{name}' of {what} {i} "
            f"(shape {_fmt(shape)}) has size {size}, but {where} fixes it at "
            f"{expected} (signature '{signature}').")
      if not name.isdigit():
        sizes.setdefault(name, (size, f"{what} {i} (shape {_fmt(shape)})"))
    return tuple(shape[:len(shape) - len(cores)])

  batch_shapes = [bind("operand", i, s, c)
                  for i, (s, c) in enumerate(zip(operand_shapes, signature.inputs))]
  batch = broadcast_batch_shapes(target_name, batch_shapes)
  for i, (shape, cores) in enumerate(zip(result_shapes, signature.outputs)):
    result_batch = bind("result", i, shape, cores)
    if result_batch != batch:
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): result {i} has shape {_fmt(shape)}; "
          f"its batch dims {_fmt(result_batch)} must equal the operands' broadcast "
          f"batch shape {_fmt(batch)} (signature '{signature}').")
  return BatchSpec(tuple(len(c) for c in signature.inputs),
                   tuple(len(c) for c in signature.outputs))


def check_spec(target_name: str, spec: BatchSpec, operand_shapes, result_shapes
               ) -> tuple[int, ...]:
  """Re-checks a spec against (possibly vmapped) shapes; returns the batch shape."""
  batch_shapes = []
  for i, (shape, c) in enumerate(zip(operand_shapes, spec.operand_core_ranks)):
    if len(shape) < c:
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): operand {i} with shape {_fmt(shape)} "
          f"has fewer dims than its {c} core dims.")
    batch_shapes.append(tuple(shape[:len(shape) - c]))
  batch = broadcast_batch_shapes(target_name, batch_shapes)
  for i, (shape, c) in enumerate(zip(result_shapes, spec.result_core_ranks)):
    if tuple(shape[:len(shape) - c]) != batch:
      raise ValueError(
          f"batchpart.ffi_call('{target_name}'): result {i} with shape {_fmt(shape)} "
          f"does not have the batch shape {_fmt(batch)}.")
  return batch
