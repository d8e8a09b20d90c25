"""The StableHLO reader on modules jax lowers and on hand-written text."""

import jax
import numpy as np
import pytest

from batchpart import _compat, _stablehlo, testing as kernels

from stablehlo_sample import GSPMD_MANUAL, SHARDY_MANUAL, TEXT

X = np.ones((4, 3), np.float32)


def _custom_calls(module):
  return [(_stablehlo.string_attribute(c.op.attributes, "call_target_name"), c)
          for c in _stablehlo.entry_custom_calls(module)]


def test_hand_written_module():
  with _compat.make_ir_context() as context:
    module = _compat.ir.Module.parse(TEXT, context)
    calls = _custom_calls(module)
    assert [name for name, _ in calls] == ["legacy", "typed", "in_callee"]
    assert [_stablehlo.is_ffi_call(c.op) for _, c in calls] == [False, True, True]
    assert [_stablehlo.frontend_attribute(c.op, "num_batch_dims") for _, c in calls] == [
        None, None, "1"]
    typed = calls[1][1].op
    assert _stablehlo.array_type(typed.operands[0]) == ("float32", (4,))
    assert _stablehlo.array_type(typed.results[0]) == ("uint8", (4,))
    # a non-string attribute reads as absent
    assert _stablehlo.string_attribute(typed.attributes, "api_version") is None
    assert [op.operation.name for op in _stablehlo.walk(module.operation)].count(
        "stablehlo.custom_call") == 3


@pytest.mark.parametrize("form", ["text", "bytes", "module"])
def test_custom_call_targets(form):
  lowered = jax.jit(kernels.softmax).lower(X).compiler_ir()
  module = {"text": str(lowered), "bytes": str(lowered).encode(), "module": lowered}[form]
  (name,) = _stablehlo.custom_call_targets(module)
  assert name == "batchpart_test_softmax"   # one device: the user's target
  assert _stablehlo.custom_call_targets(TEXT) == ["legacy", "typed", "in_callee"]


def test_lowered_ffi_call_and_its_location():
  module = jax.jit(kernels.softmax).lower(X).compiler_ir()
  ((_, call),) = _custom_calls(module)
  assert _stablehlo.is_ffi_call(call.op) and not call.in_manual_region
  assert _stablehlo.frontend_attribute(call.op, "num_batch_dims") == "1"
  assert [_stablehlo.array_type(v) for v in call.op.results] == [
      ("float32", (4, 3)), ("float32", (4,))]
  frames = _stablehlo.location_frames(call.op.location)
  assert all(isinstance(line, int) for _, _, line, _ in frames)
  assert any(file.endswith("test_stablehlo.py") for _, file, _, _ in frames)


def test_calls_in_functions_count_once_per_call_site():
  inner = jax.jit(lambda x: kernels.softmax(x)[0])
  module = jax.jit(lambda x: inner(inner(x))).lower(X).compiler_ir()
  assert len(_custom_calls(module)) == 2


@pytest.mark.parametrize("text", [SHARDY_MANUAL, GSPMD_MANUAL], ids=["shardy", "gspmd"])
def test_shard_map_bodies_are_manual_regions(text):
  with _compat.make_ir_context() as context:
    module = _compat.ir.Module.parse(text, context)
    calls = [c for _, c in _custom_calls(module) if _stablehlo.is_ffi_call(c.op)]
    manual = [(c.in_manual_region, _stablehlo.array_type(c.op.operands[0])[1]) for c in calls]
    assert manual == [(True, (4,)), (False, (8,))]


def test_custom_call_layouts_and_aliases():
  text = '''
  func.func public @main(%a: tensor<2x3x3xf32>) -> tensor<2x3x3xf32> {
    %0 = stablehlo.custom_call @k(%a) {mhlo.backend_config = {},
        operand_layouts = [dense<[1, 2, 0]> : tensor<3xindex>],
        result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>],
        output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [],
                                  operand_index = 0, operand_tuple_indices = []>]}
        : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
    return %0 : tensor<2x3x3xf32>
  }'''
  with _compat.make_ir_context() as context:
    module = _compat.ir.Module.parse(text, context)
    (op,) = [o for o in _stablehlo.walk(module.operation)
             if o.operation.name == "stablehlo.custom_call"]
    assert _stablehlo.layouts(op, "operand_layouts", [(2, 3, 3)]) == ((1, 2, 0),)
    assert _stablehlo.layouts(op, "result_layouts", [(2, 3, 3)]) == ((2, 1, 0),)
    assert _stablehlo.layouts(op, "missing", [(2, 3)]) == ((1, 0),)
    assert _stablehlo.aliases(op) == ((0, 0),)
