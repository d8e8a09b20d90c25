"""The FFI calls of a lowered program: target, global types, batch dims,
whether they run in ``shard_map``, and their Python stack."""

from __future__ import annotations

import dataclasses

from batchpart import _hlo, _stablehlo
from batchpart._partition import derived_names


@dataclasses.dataclass(frozen=True)
class LoweredCall:
  target: str
  operands: tuple[tuple[str, tuple[int, ...]], ...]   # (dtype, global shape)
  results: tuple[tuple[str, tuple[int, ...]], ...]
  num_batch_dims: int | None
  in_shard_map: bool
  #: innermost first; XLA keeps the same frames in the compiled module
  frames: tuple[_hlo.Frame, ...]


def _num_batch_dims(op) -> int | None:
  value = _stablehlo.frontend_attribute(op, "num_batch_dims")
  try:
    return None if value is None else int(value)
  except ValueError:
    return None


def lowered_calls(module) -> list[LoweredCall]:
  """The FFI calls of a lowered module (``lowered.compiler_ir()``) in
  program order, calls inside functions once per call site."""
  out = []
  for call in _stablehlo.entry_custom_calls(module):
    op = call.op
    if not _stablehlo.is_ffi_call(op):
      continue
    target = _stablehlo.string_attribute(op.attributes, "call_target_name") or ""
    out.append(LoweredCall(
        target=derived_names.user_target(target),
        operands=tuple(_stablehlo.array_type(v) for v in op.operands),
        results=tuple(_stablehlo.array_type(v) for v in op.results),
        num_batch_dims=_num_batch_dims(op), in_shard_map=call.in_manual_region,
        frames=tuple(_hlo.Frame(*f) for f in _stablehlo.location_frames(op.location))))
  return out
