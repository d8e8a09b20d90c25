"""jax's own host callbacks in a compiled program: the entry point that made
each, and the conditional on partition-id that runs one on one device.

The module (``callback_hlo_sample``) is a trimmed copy of a compiled
program; ``multidevice_tests/test_explain.py`` compiles the real ones under
both partitioners."""

import pytest
from callback_hlo_sample import HLO

from batchpart import _hlo
from batchpart._explain import callbacks
from batchpart._explain.collectives import collectives


def test_a_call_in_a_conditional_on_partition_id_runs_on_that_device():
  m = _hlo.parse_module(HLO)
  cond, device = callbacks.single_device(m, m.by_name["pure_callback.0"])
  assert (cond.name, device) == ("conditional", 0)
  # its collectives are those around the conditional: the gather in front,
  # the select + all-reduce that broadcasts device 0's results behind
  assert [c.name for c in collectives(m, cond, forward=False)] == ["all-gather"]
  assert [c.name for c in collectives(m, cond, forward=True)] == ["all-reduce"]
  # walked from the call itself, the branch's parameter ends the walk
  assert collectives(m, m.by_name["pure_callback.0"], forward=False) == ()


@pytest.mark.parametrize("change", [
    ("direction=EQ\n}\n\n%other", "direction=NE\n}\n\n%other"),   # a != test
    ("calls=%wrapped_compare_computation", "calls=%other_compare_computation"),
    ("%wrapped_compare = pred[] fusion(%partition-id,",
     "%wrapped_compare = pred[] fusion(%param.2,"),   # not partition-id
    ("true_computation=%true_computation, false_computation=%false_computation",
     "true_computation=%false_computation, false_computation=%true_computation"),
])
def test_other_conditionals_run_on_every_device(change):
  text = HLO.replace(*change)
  if "%param.2," in text:
    text = text.replace("%constant.1 = u32[] constant(0)",
                        "%constant.1 = u32[] constant(0)\n  %param.2 = u32[] parameter(1)")
  assert text != HLO
  m = _hlo.parse_module(text)
  assert callbacks.single_device(m, m.by_name["pure_callback.0"]) is None


def test_a_call_outside_any_conditional_runs_on_every_device():
  m = _hlo.parse_module(HLO)
  assert callbacks.single_device(m, m.by_name["all-reduce"]) is None


@pytest.mark.parametrize("target,op_name,ordered,expected", [
    ("xla_ffi_python_cpu_callback", "jit(f)/pure_callback", False, "jax.pure_callback"),
    ("xla_ffi_python_gpu_callback", "jit(f)/jit(g)/io_callback", False,
     "jax.experimental.io_callback"),
    ("xla_ffi_python_cpu_callback", "jit(f)/io_callback", True,
     "jax.experimental.io_callback (ordered)"),
    ("xla_ffi_python_cpu_callback", "jit(f)/debug_callback", False, "jax.debug.callback"),
    ("xla_buffer_python_cpu_callback", "jit(f)/buffer_callback", False,
     "jax.experimental.buffer_callback"),
    ("xla_ffi_python_cpu_callback", "", False,
     "jax host callback (xla_ffi_python_cpu_callback)"),
])
def test_entry_point(target, op_name, ordered, expected):
  assert callbacks.is_stock_target(target)
  assert callbacks.entry_point(target, op_name, ordered=ordered) == expected


def test_other_targets_are_not_stock_callbacks():
  for target in ("batchpart_test_softmax", "lapack_sgetrf_ffi", None,
                 "xla_ffi_python_cpu_callback$bp1$o1$r1"):
    assert not callbacks.is_stock_target(target)
