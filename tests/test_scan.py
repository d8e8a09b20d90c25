"""Scanned dims on one device: ``scan={"t": bp.Scan(state=(k, j), ...)}``.

Bad declarations are refused where the call is declared, naming the target
or callback and the dim; the derived name carries the scan and reads back;
the Shardy rule keeps the dim's factor on the operands and per-step results;
on one device nothing is split, so the values are the kernel's own.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
import batchpart.testing as bt
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription
from batchpart._vocab.dims.scan import ScanDim

S = jax.ShapeDtypeStruct
LINEAR = "batchpart_test_linear_scan"
PREFIX = "batchpart_test_prefix_sum"
OWNER = re.escape(f"batchpart.ffi_call('{LINEAR}')")


def linear_ref(a, x, h0, reverse=False):
  """The linear recurrence in NumPy, one step at a time."""
  y = np.zeros_like(x)
  h, p = h0.copy(), np.ones_like(h0)
  steps = range(x.shape[-1])
  for i in (reversed(steps) if reverse else steps):
    h = a[..., i] * h + x[..., i]
    p = p * a[..., i]
    y[..., i] = h
  return y, h, p


def test_scan_is_exported_with_its_fields():
  s = bp.Scan(state=(2, 1), merge=bt.linear_merge, apply=bt.linear_apply, reverse=True)
  assert (s.state, s.merge, s.apply, s.reverse) == ((2, 1), bt.linear_merge,
                                                    bt.linear_apply, True)
  assert bp.Scan((np.int64(1), 0)) == bp.Scan(state=(1, 0), merge=None, apply=None,
                                              reverse=False)
  assert "Scan" in bp.__all__


@pytest.mark.parametrize("kwargs, error", [
    (dict(state=(1,)), TypeError),
    (dict(state=(-1, 0)), TypeError),
    (dict(state=(1, 0), merge=3), TypeError),
    (dict(state=(1, 0), apply=bt.linear_apply), ValueError),
])
def test_bad_scan_objects_are_refused(kwargs, error):
  with pytest.raises(error, match=r"batchpart\.Scan"):
    bp.Scan(**kwargs)


def _linear(signature="(t),(t),()->(t),(),()", scan=None, shapes=((4, 16), (4,), (4,)),
            dtype=np.float32):
  scan = scan if scan is not None else {"t": bp.Scan((2, 1), bt.linear_merge,
                                                     bt.linear_apply)}
  return bp.ffi_call(LINEAR, tuple(S(s, dtype) for s in shapes), signature=signature,
                     scan=scan)


@pytest.mark.parametrize("kwargs, message", [
    (dict(scan={"t": bp.Scan((0, 1), bt.linear_merge, bt.linear_apply)}),
     r"scan names the dim 't', which is a dim of the state operand 0"),
    (dict(scan={"t": bp.Scan((2, 0), bt.linear_merge, bt.linear_apply)}),
     r"scan names the dim 't', which is a dim of the state result 0"),
    (dict(scan={"t": bp.Scan((3, 1), bt.linear_merge, bt.linear_apply)}),
     r"scan names the dim 't', which starts from operand 3"),
    (dict(scan={"t": bp.Scan((2, 5), bt.linear_merge, bt.linear_apply)}),
     r"scan names the dim 't', which ends in result 5"),
    (dict(scan={"u": bp.Scan((2, 1), bt.linear_merge, bt.linear_apply)}),
     r"scan names the dim 'u', which is not a core dim of any operand"),
    (dict(scan={"t": bp.Scan((2, 1))}),
     r"scan names the dim 't', which is missing from result 2; without a merge"),
    (dict(signature="(t,t),(t),()->(t),(),()"),
     r"scan names the dim 't', which appears twice in one array"),
])
def test_bad_scan_declarations_name_the_target_and_the_dim(kwargs, message):
  with pytest.raises(ValueError, match=OWNER + ".*" + message):
    _linear(**kwargs)


def test_scan_needs_a_signature_and_one_dim():
  with pytest.raises(ValueError, match=OWNER + r".*names core dims, which only a signature"):
    bp.ffi_call(LINEAR, S((4,), np.float32), num_batch_dims=1,
                scan={"t": bp.Scan((2, 1))})
  with pytest.raises(ValueError, match=OWNER + r".*declares 2 scanned dims"):
    _linear(scan={"t": bp.Scan((2, 1)), "u": bp.Scan((2, 1))})
  with pytest.raises(TypeError, match=OWNER + r".*scan must be a dict"):
    _linear(scan={"t": (2, 1)})
  with pytest.raises(ValueError, match=OWNER + r".*declared with reduce= or halo="):
    bp.ffi_call(LINEAR, S((4,), np.float32), signature="(t),(t),(n)->(t),(),()",
                reduce={"n": "sum"}, scan={"t": bp.Scan((2, 1))})


def test_state_of_another_shape_or_dtype_is_refused_before_anything_runs():
  a = np.ones((4, 16), np.float32)
  f = _linear(signature="(t),(t),(n)->(t),(m),()", shapes=((4, 16), (4, 3), (4,)))
  with pytest.raises(ValueError, match=OWNER + r".*scanned dim 't' starts from operand 2 "
                                       r"\(float32\[4, 2\]\) and ends in result 1"):
    f(a, a, np.ones((4, 2), np.float32), reverse=np.int64(0))
  f = _linear(shapes=((4, 16), (4,), (4,)))
  with pytest.raises(ValueError, match=OWNER + r".*state operand and result must have one "
                                       r"shape and dtype"):
    f(a, a, np.ones(4, np.int32), reverse=np.int64(0))


def test_merge_that_changes_the_summary_is_refused_naming_the_dim():
  bad = bp.Scan((2, 1), merge=lambda a, b: (a[0] + b[0],), apply=bt.linear_apply)
  a = np.ones((4, 16), np.float32)
  with pytest.raises(ValueError, match=re.escape(f"'{LINEAR}': scan over the dim 't'") +
                     r".*merge returns"):
    jax.jit(lambda a: _linear(scan={"t": bad})(a, a, a[:, 0], reverse=np.int64(0)))(a)
  wide = bp.Scan((2, 1), merge=lambda a, b: (a[0] * 1.0, b[1].astype(jnp.int32)),
                 apply=bt.linear_apply)
  with pytest.raises(ValueError, match=r"scan over the dim 't'.*must keep"):
    jax.jit(lambda a: _linear(scan={"t": wide})(a, a, a[:, 0], reverse=np.int64(0)))(a)
  no_apply = bp.Scan((2, 1), merge=bt.linear_merge)
  with pytest.raises(ValueError, match=r"scan over the dim 't'.*pass apply="):
    jax.jit(lambda a: _linear(scan={"t": no_apply})(a, a, a[:, 0], reverse=np.int64(0)))(a)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_one_device_runs_the_kernel_itself(reverse, dtype):
  rng = np.random.default_rng(0)
  with jax.enable_x64(dtype == np.float64):
    a = rng.integers(-3, 4, (3, 20)).astype(dtype)
    x = rng.integers(-9, 9, (3, 20)).astype(dtype)
    h0 = rng.integers(-9, 9, (3,)).astype(dtype)
    out = jax.jit(lambda a, x, h0: bt.linear_scan((3, 20), dtype, reverse=reverse)(
        a, x, h0, reverse=np.int64(reverse)))(a, x, h0)
    for got, want in zip(out, linear_ref(a, x, h0, reverse)):
      np.testing.assert_array_equal(np.asarray(got), want)


def _description(scans, **kwargs):
  return CallDescription(
      target="k", operand_batch_ranks=(1, 1, 1), result_batch_ranks=(1, 1, 1),
      operand_layouts=((1, 0), (1, 0), (0,)), result_layouts=((1, 0), (0,), (0,)),
      scans=scans, **kwargs)


@pytest.mark.parametrize("scan", [
    ScanDim("t", (2, 1), False, ((0, -1), (1, -1)), ((0, -1),), "scan_0123456789abcdef"),
    ScanDim("t", (2, 1), True, ((0, -1), (1, -1)), ((0, -1),), "scan_0123456789abcdef"),
    ScanDim("t", (2, 1), True, ((0, -1), (1, -1)), ((0, -1),), ""),
    ScanDim("time", (2, 2), False, ((0, -1),), (), ""),
])
def test_the_derived_name_carries_the_scan_and_reads_back(scan):
  d = _description((scan,))
  name = derived_names.encode(d)
  assert "$t:" in name
  assert derived_names.decode(name) == d


@pytest.mark.parametrize("scans", [
    (ScanDim("t", (2, 1), False, ((2, -1),), ((0, -1),), ""),),   # the state has t
    (ScanDim("t", (2, 1), False, ((0, -1),), ((1, -1),), ""),),   # the final state has t
    (ScanDim("t", (2, 1), False, (), ((0, -1),), ""),),           # no operand has t
    (ScanDim("t", (2, 1), False, ((0, -1),), ((0, -1),), ""),
     ScanDim("u", (2, 1), False, ((1, -1),), ((0, -1),), "")),    # two scans
])
def test_descriptions_with_bad_scans_are_refused(scans):
  with pytest.raises(ValueError, match="^k: "):
    _description(scans)


def test_a_mangled_scan_field_is_refused_naming_the_target():
  name = derived_names.encode(_description(
      (ScanDim("t", (2, 1), False, ((0, -1),), ((0, -1),), ""),)))
  with pytest.raises(ValueError, match="derived target name .* of FFI target 'k'"):
    derived_names.decode(name.replace("$t:t=2.1", "$t:t=2"))


def test_the_shardy_rule_keeps_the_scanned_dim_on_operands_and_per_step_results():
  a = np.ones((4, 16), np.float32)
  f = bt.linear_scan((4, 16), np.float32)
  text = jax.jit(lambda a, x, h: f(a, x, h, reverse=np.int64(0))).lower(
      a, a, a[:, 0]).as_text()
  assert "batchpart_test_linear_scan$bp1" in text or "batchpart_test_linear_scan" in text
  if jax.config.jax_use_shardy_partitioner:
    from batchpart._partition import sharding_rule
    from batchpart._vocab.dims.scan import as_halos
    scan = ScanDim("t", (2, 1), False, ((0, -1), (1, -1)), ((0, -1),), "")
    lhs, rhs, replicated, _ = sharding_rule.factors(
        [(4, 16), (4, 16), (4,)], (1, 1, 0), [(4, 16), (4,), (4,)], (1, 0, 0), (4,),
        halos=as_halos((scan,)))
    assert lhs == [["b0", "h0"], ["b0", "h0"], ["b0"]]
    assert rhs == [["b0", "h0"], ["b0"], ["b0"]]
    assert "h0" not in replicated
