"""Element type names between NumPy, HLO and MLIR."""

import numpy as np
import pytest

from batchpart import _dtypes

PAIRS = [("bool", "pred", "i1"), ("int8", "s8", "i8"), ("int32", "s32", "i32"),
         ("uint8", "u8", "ui8"), ("uint64", "u64", "ui64"), ("float16", "f16", "f16"),
         ("bfloat16", "bf16", "bf16"), ("float32", "f32", "f32"), ("float64", "f64", "f64"),
         ("complex64", "c64", "complex<f32>"), ("complex128", "c128", "complex<f64>")]


@pytest.mark.parametrize("numpy_name, hlo, mlir", PAIRS)
def test_names(numpy_name, hlo, mlir):
  assert _dtypes.from_hlo(hlo) == numpy_name
  assert _dtypes.to_hlo(numpy_name) == hlo
  assert _dtypes.from_mlir(mlir) == numpy_name


@pytest.mark.parametrize("numpy_name, hlo, mlir", PAIRS)
def test_itemsize(numpy_name, hlo, mlir):
  expected = 2 if numpy_name == "bfloat16" else np.dtype(numpy_name).itemsize
  assert _dtypes.itemsize(hlo) == expected


def test_other_names_pass_through():
  for name in ("f8e4m3fn", "token", "tuple"):
    assert _dtypes.from_hlo(name) == _dtypes.to_hlo(name) == name
  assert _dtypes.from_mlir("f8E4M3FN") == "f8E4M3FN"
  assert _dtypes.from_mlir("complex<bf16>") == "complex<bf16>"
  assert _dtypes.itemsize("f8e4m3fn") == 1
