"""bp.explain on 8 simulated devices, under Shardy and GSPMD.

The acceptance cases are written against a table of (batchpart function,
plain counterpart) pairs so any FFI target can be added to it; each asserts
what explain reports and cross-checks it against the compiled HLO.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.experimental.buffer_callback import buffer_callback
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _core, _hlo, testing as kernels
from batchpart._explain.lowered import lowered_calls

from helpers import compiled_text, flat, local_shapes, put, rng, the_custom_call

SOFTMAX = "batchpart_test_softmax"
MATVEC = "batchpart_test_matvec"
PLAIN_SOFTMAX = "explain_plain_softmax"      # never marked batch partitionable
WRAPPED_SOFTMAX = "explain_wrapped_softmax"  # marked through the decorator

jax.ffi.register_ffi_target(PLAIN_SOFTMAX, _core.testing.handlers()["softmax"],
                            platform="cpu")
jax.ffi.register_ffi_target(WRAPPED_SOFTMAX, _core.testing.handlers()["softmax"],
                            platform="cpu")


def _plain_softmax_call(target, x):
  return jax.ffi.ffi_call(
      target, (jax.ShapeDtypeStruct(x.shape, x.dtype),
               jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)


def plain_softmax(x):
  return _plain_softmax_call(PLAIN_SOFTMAX, x)


@bp.batch_partitionable(signature="(n)->(n),()")
def wrapped_softmax(x):
  return _plain_softmax_call(WRAPPED_SOFTMAX, x)


# One row per FFI kernel: (id, batchpart function, its target, the plain
# jax.ffi.ffi_call doing the same, its target, global input shape). The input
# is sharded on its last (core) dim over the 8 devices.
CASES = [
    ("softmax", kernels.softmax, SOFTMAX, plain_softmax, PLAIN_SOFTMAX, (64, 16)),
]


def _kinds(collectives):
  return [c.kind for c in collectives]


def _one_call(report, target):
  calls = [c for c in report.calls if c.target == target]
  assert len(calls) == 1, f"expected one call to {target}: {report}"
  return calls[0]


def _nbytes(shape, dtype=np.float32):
  return int(np.prod(shape)) * np.dtype(dtype).itemsize


def _core_sharded(mesh, shape, dtype=np.float32):
  x = rng(0).standard_normal(shape).astype(dtype)
  return put(x, mesh, P(*([None] * (len(shape) - 1)), "x"))


def _explain_core_sharded(mesh, fn, target, shape):
  """A core-sharded input of `shape`, explain(fn) on it, and the report's one call to target."""
  xs = _core_sharded(mesh, shape)
  report = bp.explain(fn, xs)
  return xs, report, _one_call(report, target)


# A core-sharded input goes through an all-to-all and every
# device computes its own batch elements; the plain call all-gathers and
# every device computes everything.
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_core_sharded_batchpart_call_uses_all_to_all(partitioner, mesh8, case):
  _, fn, target, _, _, shape = case
  xs, report, call = _explain_core_sharded(mesh8, fn, target, shape)
  assert report.num_devices == 8 and call.num_devices == 8
  assert "all-to-all" in _kinds(call.collectives_before)
  assert "all-gather" not in _kinds(call.collectives_before)
  assert call.replication == 1
  assert call.global_operand_shapes[0] == shape
  hlo_call = the_custom_call(compiled_text(fn, xs), target)
  assert list(call.device_operand_shapes) == local_shapes(hlo_call)
  assert call.device_operand_shapes[0][0] * 8 == shape[0]
  assert call.hlo_name == hlo_call.name
  text = str(report)
  assert target in text and "all-to-all" in text


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_core_sharded_plain_call_all_gathers(partitioner, mesh8, case):
  _, _, _, plain, target, shape = case
  _, report, call = _explain_core_sharded(mesh8, plain, target, shape)
  assert call.num_batch_dims is None
  assert _kinds(call.collectives_before) == ["all-gather"]
  assert call.collectives_before[0].bytes == _nbytes(shape)  # the whole input
  assert call.replication == 8
  assert call.device_operand_shapes == (shape,)
  text = str(report)
  assert target in text and "all-gather" in text and "8 of 8 devices" in text


def test_batch_sharded_softmax(partitioner, mesh8):
  xs = put(rng(1).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  report = bp.explain(lambda x: kernels.softmax(x), xs)
  (call,) = report.calls
  assert call.target == SOFTMAX and call.num_batch_dims == 1
  assert call.collectives_before == () and call.collectives_after == ()
  assert call.replication == 1
  assert call.global_operand_shapes == ((64, 16),)
  assert call.global_result_shapes == ((64, 16), (64,))
  assert call.device_operand_shapes == ((8, 16),)
  assert call.device_result_shapes == ((8, 16), (8,))
  assert call.operand_dtypes == ("float32",)
  assert call.result_dtypes == ("float32", "float32")
  assert not call.removed and not call.in_shard_map
  assert "test_explain.py" in call.source  # the user's frame, not batchpart's
  assert report.partitioner == partitioner


def test_core_sharded_all_to_all_bytes(partitioner, mesh8):
  report = bp.explain(kernels.softmax, _core_sharded(mesh8, (64, 16)))
  (call,) = report.calls
  (a2a,) = call.collectives_before
  # each device ends up with its (8, 16) block of rows
  assert a2a.kind == "all-to-all" and a2a.bytes == _nbytes((8, 16))
  assert a2a.name and a2a.op_name


def test_batch_sharded_plain_call_gathers_and_replicates(partitioner, mesh8):
  xs = put(rng(2).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  (call,) = bp.explain(plain_softmax, xs).calls
  assert _kinds(call.collectives_before) == ["all-gather"]
  assert call.collectives_before[0].bytes == _nbytes((64, 16))
  assert call.device_operand_shapes == ((64, 16),)
  assert call.replication == 8


def test_decorated_plain_call_has_no_redundant_work(partitioner, mesh8):
  """The decorator turns the plain call into one explain finds no fault with."""
  xs = put(rng(3).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  (call,) = bp.explain(wrapped_softmax, xs).calls
  assert call.target == WRAPPED_SOFTMAX and call.num_batch_dims == 1
  assert call.collectives_before == () and call.replication == 1
  assert call.device_operand_shapes == ((8, 16),)


def test_jax_lapack_call_is_an_ffi_call_too(partitioner, mesh8):
  a = np.eye(16, dtype=np.float32)[None].repeat(16, 0)
  report = bp.explain(jnp.linalg.cholesky, put(a, mesh8, P(None, "x")))
  (call,) = report.calls
  assert "potrf" in call.target
  assert _kinds(call.collectives_before) == ["all-gather"]
  assert call.replication == 8


def test_several_calls_in_program_order(partitioner, mesh8):
  a = put(rng(4).standard_normal((16, 4, 6), dtype=np.float32), mesh8, P("x"))
  v = put(rng(5).standard_normal((6,), dtype=np.float32), mesh8, P())
  x = _core_sharded(mesh8, (64, 16))

  def f(a, v, x):
    p = plain_softmax(x)[1]
    s = kernels.softmax(x)[1]
    m = kernels.matvec(a, v, alpha=2.0)
    return p.sum() + s.sum() + m.sum()

  report = bp.explain(f, a, v, x)
  assert [c.target for c in report.calls] == [PLAIN_SOFTMAX, SOFTMAX, MATVEC]
  plain, soft, mv = report.calls
  assert plain.replication == 8 and "all-gather" in _kinds(plain.collectives_before)
  assert soft.replication == 1 and "all-to-all" in _kinds(soft.collectives_before)
  assert mv.replication == 1 and mv.collectives_before == ()
  assert mv.device_operand_shapes == ((2, 4, 6), (6,))
  text = str(report)
  assert "3 FFI calls" in text
  assert text.index(PLAIN_SOFTMAX) < text.index(SOFTMAX) < text.index(MATVEC)


def test_matching_survives_reordering_and_deduplication(partitioner, mesh8):
  """XLA schedules independent calls in its own order and merges identical
  ones; explain ties each compiled call to its source line."""
  x = put(rng(6).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  y = _core_sharded(mesh8, (32, 8))

  def f(x, y):
    a = kernels.softmax(y)[0]
    b = kernels.softmax(x)[0]
    c = kernels.softmax(x)[0]  # identical to b: XLA keeps one
    return a.sum() + b.sum() + c.sum()

  a, b, c = bp.explain(f, x, y).calls
  assert a.global_operand_shapes == ((32, 8),) and a.device_operand_shapes == ((4, 8),)
  assert b.global_operand_shapes == ((64, 16),) and b.device_operand_shapes == ((8, 16),)
  assert c.removed and c.device_operand_shapes is None and c.replication is None
  assert len({a.source, b.source, c.source}) == 3


@pytest.mark.parametrize("spec, replication", [
    (P("a"), 4), (P("b"), 2), (P(("a", "b")), 1), (P(None), 8)])
def test_replication_on_two_dim_mesh(partitioner, mesh2x4, spec, replication):
  x = put(rng(7).standard_normal((16, 8), dtype=np.float32), mesh2x4, P())
  f = lambda x: kernels.softmax(
      jax.lax.with_sharding_constraint(x, NamedSharding(mesh2x4, spec)))
  (call,) = bp.explain(f, x).calls
  assert call.replication == replication
  assert call.device_operand_shapes[0][0] * 8 == 16 * replication


def test_uneven_batch_counts_no_replication(partitioner, mesh8):
  x = put(rng(8).standard_normal((10, 8), dtype=np.float32), mesh8, P())
  f = lambda x: kernels.softmax(
      jax.lax.with_sharding_constraint(x, NamedSharding(mesh8, P("x"))))
  (call,) = bp.explain(f, x).calls
  assert call.device_operand_shapes == ((2, 8),)  # padded to 16 rows
  assert call.replication == 1


def test_call_inside_loop_body(partitioner, mesh8):
  f = lambda x: jax.lax.fori_loop(0, 3, lambda i, v: kernels.softmax(v)[0], x)
  (call,) = bp.explain(f, _core_sharded(mesh8, (64, 16))).calls
  assert call.device_operand_shapes == ((8, 16),)
  assert "all-to-all" in _kinds(call.collectives_before)
  assert call.replication == 1


def test_call_inside_shard_map(partitioner, mesh8):
  f = jax.shard_map(lambda v: kernels.softmax(v)[0], mesh=mesh8,
                    in_specs=P("x"), out_specs=P("x"))
  xs = put(rng(9).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  report = bp.explain(f, xs)
  (call,) = report.calls
  assert call.in_shard_map and call.replication is None
  assert call.global_operand_shapes == ((8, 16),)  # what the body sees
  assert call.device_operand_shapes == ((8, 16),)
  assert "shard_map" in str(report)


def test_jitted_function_and_keyword_arguments(partitioner, mesh8):
  xs = put(rng(10).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  f = jax.jit(lambda x, *, which: kernels.softmax(x)[which],
              static_argnames="which")
  (call,) = bp.explain(f, xs, which=1).calls
  assert call.target == SOFTMAX and call.replication == 1


def test_shape_dtype_struct_arguments(partitioner, mesh8):
  spec = jax.ShapeDtypeStruct((64, 16), np.float32,
                              sharding=NamedSharding(mesh8, P(None, "x")))
  (call,) = bp.explain(plain_softmax, spec).calls
  assert call.replication == 8 and _kinds(call.collectives_before) == ["all-gather"]


def test_program_without_ffi_calls(partitioner, mesh8):
  xs = put(rng(11).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  report = bp.explain(lambda x: jnp.sin(x).sum(), xs)
  assert report.calls == () and report.num_devices == 8
  assert "no FFI call" in str(report)


@pytest.mark.timeout(120)
def test_fully_manual_call_is_known_by_its_frontend_attribute(partitioner, mesh8):
  # XLA does not partition a fully manual body: the call keeps the user's
  # target and carries its derived name in a frontend attribute
  f = jax.shard_map(lambda v: kernels.softmax(v)[0], mesh=mesh8,
                    in_specs=P("x"), out_specs=P("x"))
  xs = put(rng(11).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  (low,) = lowered_calls(jax.jit(f).lower(xs).compiler_ir())
  assert low.target == SOFTMAX and low.in_shard_map
  assert low.derived_name == SOFTMAX + "$bp1$o1$r1,1$no2$nr2,1"
  report = bp.explain(f, xs)
  (call,) = report.calls
  assert call.num_batch_dims == 1 and not call.removed
  assert call.device_result_shapes == ((8, 16), (8,))
  inst = the_custom_call(report.hlo_text, SOFTMAX)
  assert inst.derived_name == low.derived_name


@pytest.mark.timeout(120)
def test_partitioned_call_carries_its_derived_name_as_target(partitioner, mesh8):
  xs = _core_sharded(mesh8, (64, 16))
  (low,) = lowered_calls(jax.jit(lambda x: kernels.softmax(x)[0]).lower(xs).compiler_ir())
  assert low.target == SOFTMAX and low.derived_name.startswith(SOFTMAX + "$bp1$")
  (call,) = bp.explain(lambda x: kernels.softmax(x)[0], xs).calls
  assert call.num_batch_dims == 1 and call.device_operand_shapes == ((8, 16),)


QUOTED = 'explain_md_my"quoted'
bp.register_ffi_target(QUOTED, _core.testing.handlers()["softmax"])


@pytest.mark.timeout(120)
def test_target_with_a_quote(partitioner, mesh8):
  def f(x):
    return bp.ffi_call(QUOTED, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
                       signature="(n)->(n),()")(x)[0]
  xs = put(rng(12).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  report = bp.explain(f, xs)
  (call,) = report.calls   # no phantom call, none reported missing
  assert call.target == QUOTED and not call.removed
  assert call.device_operand_shapes == ((8, 16),) and call.replication == 1


# Host callbacks. jax's own are checked against what the compiled program
# holds: the all-gathers in front, the conditional on partition-id that
# runs the call on device 0 only, the collectives that carry its results on.

S = jax.ShapeDtypeStruct


def _hlo_kinds(text, kind):
  return [c for c in _hlo.collectives(text) if c.opcode == kind]


def _stock_pure(x, y):
  return jax.pure_callback(lambda a, b: a + b.sum(), S(x.shape, x.dtype), x, y)


def _stock_io(x, y):
  return io_callback(lambda a, b: a, S(x.shape, x.dtype), x, y)


def _stock_io_ordered(x, y):
  return io_callback(lambda a, b: a, S(x.shape, x.dtype), x, y, ordered=True)


def _stock_debug(x, y):
  jax.debug.callback(lambda a, b: None, x, y)
  return x * 2


STOCK = [
    ("pure_callback", _stock_pure, "jax.pure_callback"),
    ("io_callback", _stock_io, "jax.experimental.io_callback"),
    ("io_callback_ordered", _stock_io_ordered, "jax.experimental.io_callback (ordered)"),
    ("debug_callback", _stock_debug, "jax.debug.callback"),
]


def _two_operands(mesh):
  x = put(rng(20).standard_normal((64, 16), dtype=np.float32), mesh, P("x"))
  y = put(rng(21).standard_normal((64, 3), dtype=np.float32), mesh, P("x"))
  return x, y


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", STOCK, ids=[c[0] for c in STOCK])
def test_stock_callback_is_one_call_on_device_0_after_a_gather(partitioner, mesh8, case):
  _, fn, name = case
  x, y = _two_operands(mesh8)
  report = bp.explain(fn, x, y)
  (call,) = report.calls
  assert call.callback == name and call.target == "xla_ffi_python_cpu_callback"
  assert call.single_device == 0 and call.replication == 1
  # every operand is gathered whole, as many all-gathers as the program has
  gathers = _hlo_kinds(report.hlo_text, "all-gather")
  assert _kinds(call.collectives_before) == ["all-gather"] * len(gathers) == [
      "all-gather"] * 2
  assert sorted(c.bytes for c in call.collectives_before) == sorted(
      [_nbytes((64, 16)), _nbytes((64, 3))]) == sorted(
      t.nbytes for g in gathers for t in g.result_types)
  assert call.device_operand_shapes == call.global_operand_shapes == ((64, 16), (64, 3))
  # the call itself sits in the true branch of a conditional on partition-id
  module = _hlo.parse_module(report.hlo_text)
  (cond,) = [i for i in module.all_instructions() if i.opcode == "conditional"]
  assert module.computation_of[call.hlo_name] == cond.called[0]
  assert "partition-id" in {i.opcode for i in module.operands(module.operands(cond)[0])}
  text = str(report)
  assert f"[0] {name} (xla_ffi_python_cpu_callback)" in text
  assert "runs on: device 0 only: one call on the whole arrays, after all-gathering " \
         "4.8 KiB per device" in flat(text)
  assert "computed by 8 of 8" not in text


@pytest.mark.timeout(120)
def test_stock_callback_results_broadcast_from_device_0(partitioner, mesh8):
  x, y = _two_operands(mesh8)
  f = jax.jit(lambda x, y: _stock_pure(x, y) * 2, out_shardings=NamedSharding(mesh8, P("x")))
  report = bp.explain(f, x, y)
  (call,) = report.calls
  assert call.single_device == 0
  # XLA broadcasts device 0's results as select-on-partition-id + all-reduce
  (reduce,) = _hlo_kinds(report.hlo_text, "all-reduce")
  assert [(c.kind, c.name, c.bytes) for c in call.collectives_after] == [
      ("all-reduce", reduce.name, _nbytes((64, 16)))]
  assert "all-reduce 4.0 KiB (device 0's results to the others)" in str(report)


@pytest.mark.timeout(120)
def test_stock_buffer_callback_runs_on_every_device(partitioner, mesh8):
  def f(x):
    return buffer_callback(lambda ctx, out, a: None, S(x.shape, x.dtype))(x)

  x, _ = _two_operands(mesh8)
  report = bp.explain(f, x)
  (call,) = report.calls
  assert call.callback == "jax.experimental.buffer_callback"
  assert call.target == "xla_buffer_python_cpu_callback"
  # no maximal sharding: every device gathers and runs it on the whole array
  assert call.single_device is None and call.replication == 8
  (gather,) = _hlo_kinds(report.hlo_text, "all-gather")
  assert [(c.kind, c.name, c.bytes) for c in call.collectives_before] == [
      ("all-gather", gather.name, _nbytes((64, 16)))]
  assert call.device_operand_shapes == ((64, 16),)
  assert "replication: 8 (each batch element computed by 8 of 8 devices)" in str(report)


BP_CALLBACKS = [
    ("signature", lambda x, y: bp.pure_callback(lambda a, b: a.sum(-1) + b.sum(-1),
                                                 S((64,), np.float32), x, y,
                                                 signature="(n),(m)->()"),
     "signature='(n),(m)->()'"),
    ("num_batch_dims", lambda x, y: bp.io_callback(lambda a, b: a, S((64, 16), np.float32),
                                                   x, y, num_batch_dims=1),
     "num_batch_dims=1"),
    ("reduce", lambda x, y: bp.pure_callback(lambda a: a.sum(-1), S((64,), np.float32), x,
                                             signature="(n)->()", reduce={"n": "sum"}),
     "signature='(n)->()', reduce={'n': 'sum'}"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", BP_CALLBACKS, ids=[c[0] for c in BP_CALLBACKS])
def test_batchpart_callback_shows_the_users_operands_and_declaration(partitioner, mesh8,
                                                                     case):
  _, fn, declared = case
  x, y = _two_operands(mesh8)
  report = bp.explain(fn, x, y)
  (call,) = report.calls
  assert call.declaration == declared and call.num_batch_dims == 1
  n = len(call.global_operand_shapes)
  assert call.global_operand_shapes == ((64, 16), (64, 3))[:n]
  assert call.device_operand_shapes == ((8, 16), (8, 3))[:n]
  # the compiled call has one operand more: the block vector, batchpart's own
  # (the batch block's offset and size, then each reduced dim's part)
  hlo_call = the_custom_call(report.hlo_text, "xla_ffi_python_cpu_callback")
  block = (4,) if "reduce=" in declared else (2,)
  assert local_shapes(hlo_call) == [block, *call.device_operand_shapes]
  assert call.single_device is None and call.replication == 1
  assert call.collectives_before == () and _hlo_kinds(report.hlo_text, "all-gather") == []
  text = str(report)
  assert f"declared:    {declared}" in text and "s64[" not in text
  assert "(num_batch_dims)" not in text


@pytest.mark.timeout(120)
def test_ffi_call_declarations_as_written(partitioner, mesh8):
  xs = put(rng(22).standard_normal((64, 16), dtype=np.float32), mesh8, P("x"))
  (call,) = bp.explain(kernels.softmax, xs).calls
  assert call.declaration == "signature='(n)->(n),()'" and call.num_batch_dims == 1
  w = put(np.ones((64, 16), np.float32), mesh8, P("x"))
  x3 = put(np.ones((64, 16, 3), np.float32), mesh8, P("x"))
  (call,) = bp.explain(kernels.reduce_rows, x3, w).calls
  assert call.declaration == "signature='(n,k),(n)->(k)', reduce={'n': 'sum'}"
  # the decorator places each call's batch dims from its wrapper's flow:
  # nothing written for that call, so nothing claimed
  (call,) = bp.explain(wrapped_softmax, xs).calls
  assert call.declaration is None and call.num_batch_dims == 1
