"""The FFI calls of a lowered program: target, global types, batch dims,
whether they run in ``shard_map``, and their Python stack."""

from __future__ import annotations

import dataclasses
import re

from batchpart import _hlo, _stablehlo
from batchpart._callback.lowering import FRONTEND_CALLBACK
from batchpart._primitive.lowering import FRONTEND_DECLARATION
from batchpart._vocab import derived_names

# MLIR prints a string's backslash as two and every other byte outside
# printable ASCII, and the quote, as a backslash and two hex digits.
_MLIR_ESCAPE = re.compile(r"\\(?:\\|([0-9A-Fa-f]{2}))")


@dataclasses.dataclass(frozen=True)
class LoweredCall:
  target: str
  operands: tuple[tuple[str, tuple[int, ...]], ...]   # (dtype, global shape)
  results: tuple[tuple[str, tuple[int, ...]], ...]
  num_batch_dims: int | None
  in_shard_map: bool
  #: innermost first; XLA keeps the same frames in the compiled module
  frames: tuple[_hlo.Frame, ...]
  #: a batchpart call's derived target name (its target where XLA
  #: partitions it, else its frontend attribute); None for a plain call
  derived_name: str | None = None
  #: a batchpart host callback's entry point (``batchpart.pure_callback(fn)``),
  #: whose block vector (custom-call operand 0) is left out of ``operands``
  callback: str | None = None
  #: the batch declaration as the user wrote it, where the call carries it
  declaration: str | None = None
  #: the call threads jax's ordering token (left out of operands and results)
  ordered: bool = False


def _description(derived_name: str | None):
  """The description a derived name carries; None for no name or one this
  version did not write."""
  if derived_name is None:
    return None
  try:
    return derived_names.decode(derived_name)
  except ValueError:
    return None


def batch_dims(num_batch_dims: str | None, derived_name: str | None) -> int | None:
  """A call's batch dims: its ``num_batch_dims`` frontend attribute, else
  the most batch dims an array has in its derived name's description; None
  for a plain call (neither)."""
  try:
    if num_batch_dims is not None:
      return int(num_batch_dims)
  except ValueError:
    pass
  d = _description(derived_name)
  return None if d is None else max(d.operand_batch_ranks + d.result_batch_ranks,
                                    default=0) - d.unit_batch


def unit_batch(derived_name: str | None) -> bool:
  """Whether a derived name is a host callback's without batch dims of its
  own, which batchpart gave a unit one: one device makes the call, the
  others get padding."""
  d = _description(derived_name)
  return d is not None and d.unit_batch


def leading_core_dims(derived_name: str | None, hidden: int = 0
                      ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """The operands' and results' core dims before their batch dims (a
  signature's ``...`` not in front), from a derived name, the first
  ``hidden`` operands (a callback's block vector) left out; None where every
  array's batch dims lead, or for a plain call."""
  d = _description(derived_name)
  if d is None or not (d.operand_lead_ranks or d.result_lead_ranks):
    return None
  return d.operand_leads[hidden:], d.result_leads


def reductions(derived_name: str | None, hidden: int = 0) -> tuple:
  """The reduced core dims a derived name declares (``_vocab/dims/reduced``
  ``Reduction``s), operands numbered without the first ``hidden``; () for
  none or a plain call."""
  d = _description(derived_name)
  if d is None:
    return ()
  return tuple(dataclasses.replace(r, dims=tuple((k - hidden, a) for k, a in r.dims
                                                 if k >= hidden))
               for r in d.reductions)


def halos(derived_name: str | None, hidden: int = 0) -> tuple:
  """The halo dims a derived name declares (``_vocab/dims/halo``
  ``HaloDim``s), operands numbered without the first ``hidden``; () for none
  or a plain call."""
  d = _description(derived_name)
  if d is None:
    return ()
  return tuple(dataclasses.replace(h, operand_dims=tuple(
      (k - hidden, a) for k, a in h.operand_dims if k >= hidden)) for h in d.halos)


def scans(derived_name: str | None, hidden: int = 0) -> tuple:
  """The scanned dims a derived name declares (``_vocab/dims/scan``
  ``ScanDim``s), operands numbered without the first ``hidden``."""
  d = _description(derived_name)
  if d is None:
    return ()
  return tuple(dataclasses.replace(t, operand_dims=tuple(
      (k - hidden, a) for k, a in t.operand_dims if k >= hidden)) for t in d.scans)


def _mlir_unescape(text: str) -> str:
  if "\\" not in text:
    return text
  out, last = bytearray(), 0
  for m in _MLIR_ESCAPE.finditer(text):
    out += text[last:m.start()].encode()
    out += b"\\" if m.group(1) is None else bytes([int(m.group(1), 16)])
    last = m.end()
  out += text[last:].encode()
  return out.decode("utf-8", errors="replace")


def _frames(location) -> tuple[_hlo.Frame, ...]:
  return tuple(_hlo.Frame(_mlir_unescape(function), _mlir_unescape(file), line, column)
               for function, file, line, column in _stablehlo.location_frames(location))


def _arrays(values) -> tuple[tuple[str, tuple[int, ...]], ...]:
  """(dtype, shape) of each array among ``values``, tokens left out (a
  dialect type such as ``!stablehlo.token`` prints with a leading ``!``)."""
  types = (_stablehlo.array_type(v) for v in values)
  return tuple(t for t in types if not t[0].startswith("!"))


def lowered_calls(module) -> list[LoweredCall]:
  """The FFI calls of a lowered module (``lowered.compiler_ir()``) in
  program order, calls inside functions once per call site."""
  out = []
  for call in _stablehlo.entry_custom_calls(module):
    op = call.op
    if not _stablehlo.is_ffi_call(op):
      continue
    target = _stablehlo.string_attribute(op.attributes, "call_target_name") or ""
    derived = _stablehlo.derived_name(op)
    callback = _stablehlo.frontend_attribute(op, FRONTEND_CALLBACK)
    operands = _arrays(op.operands)
    user_operands = operands[1:] if callback is not None else operands
    results = _arrays(op.results)
    d = _description(derived)
    if d is not None and d.unit_batch and derived_names.is_derived(target):
      # The unit batch dim is for XLA's partitioner only: the devices' calls
      # are made without it.
      user_operands = tuple((t, s[1:]) for t, s in user_operands)
      results = tuple((t, s[1:]) for t, s in results)
    out.append(LoweredCall(
        target=derived_names.user_target(target),
        operands=user_operands,
        results=results,
        num_batch_dims=batch_dims(_stablehlo.frontend_attribute(op, "num_batch_dims"),
                                  derived),
        in_shard_map=call.in_manual_region, frames=_frames(op.location),
        derived_name=derived, callback=callback,
        declaration=_stablehlo.frontend_attribute(op, FRONTEND_DECLARATION),
        ordered=len(operands) < len(op.operands)))
  return out
