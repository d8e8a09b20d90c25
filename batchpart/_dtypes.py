"""Element type names: NumPy's (``float32``), HLO's (``f32``) and MLIR's
(``f32``, ``ui8``, ``complex<f32>``) spellings of one type.

Every reader and printer in batchpart converts through here. Names these
rules do not cover (e.g. the float8 variants) pass through unchanged.
"""

from __future__ import annotations

import re

import numpy as np

# Types whose names do not follow "kind letter + bit width".
_NUMPY_TO_HLO = {"bool": "pred", "bfloat16": "bf16"}
_HLO_TO_NUMPY = {hlo: numpy for numpy, hlo in _NUMPY_TO_HLO.items()}

# HLO's kind letters and NumPy's kind words, as in s32 <-> int32.
_HLO_KINDS = {"s": "int", "u": "uint", "f": "float", "c": "complex"}
_NUMPY_KINDS = {numpy: hlo for hlo, numpy in _HLO_KINDS.items()}

_HLO_NAME = re.compile(r"([sufc])(\d+)")
_NUMPY_NAME = re.compile(r"(int|uint|float|complex)(\d+)")
_MLIR_INT = re.compile(r"(u?)i(\d+)")
_MLIR_FLOAT = re.compile(r"f(\d+)")
_MLIR_COMPLEX = re.compile(r"complex<f(\d+)>")


def from_hlo(name: str) -> str:
  """The NumPy name of an HLO element type: ``s32`` -> ``int32``."""
  if name in _HLO_TO_NUMPY:
    return _HLO_TO_NUMPY[name]
  m = _HLO_NAME.fullmatch(name)
  return f"{_HLO_KINDS[m.group(1)]}{m.group(2)}" if m else name


def to_hlo(name: str) -> str:
  """The HLO name of a NumPy element type: ``int32`` -> ``s32``."""
  if name in _NUMPY_TO_HLO:
    return _NUMPY_TO_HLO[name]
  m = _NUMPY_NAME.fullmatch(name)
  return f"{_NUMPY_KINDS[m.group(1)]}{m.group(2)}" if m else name


def from_mlir(name: str) -> str:
  """The NumPy name of an MLIR element type (its text): ``i1`` -> ``bool``,
  ``ui8`` -> ``uint8``, ``complex<f32>`` -> ``complex64``."""
  if name == "i1":
    return "bool"
  if name == "bf16":
    return "bfloat16"
  m = _MLIR_INT.fullmatch(name)
  if m:
    return f"{'uint' if m.group(1) else 'int'}{m.group(2)}"
  m = _MLIR_COMPLEX.fullmatch(name)
  if m:
    return f"complex{2 * int(m.group(1))}"
  m = _MLIR_FLOAT.fullmatch(name)
  return f"float{m.group(1)}" if m else name


def itemsize(hlo_name: str) -> int:
  """Bytes per element of an HLO element type; 1 for a type NumPy does not
  know by name."""
  try:
    return np.dtype(from_hlo(hlo_name)).itemsize
  except TypeError:
    return 1
