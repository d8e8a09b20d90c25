"""bp.explain on one device. Its steps have tests of their own
(test_explain_*.py, test_hlo.py, test_stablehlo.py); the multi-device
behaviour is in multidevice_tests/test_explain.py."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

import batchpart as bp
from batchpart import _core, _hlo, testing as kernels
from batchpart._explain import build
from batchpart._explain.lowered import batch_dims, lowered_calls


def test_single_device_call():
  x = np.ones((6, 5), np.float32)
  report = bp.explain(lambda x: kernels.softmax(x), x)
  assert report.num_devices == 1
  (call,) = report.calls
  assert call.target == "batchpart_test_softmax" and call.num_batch_dims == 1
  assert call.global_operand_shapes == call.device_operand_shapes == ((6, 5),)
  assert call.global_result_shapes == call.device_result_shapes == ((6, 5), (6,))
  assert call.collectives_before == call.collectives_after == ()
  assert call.replication == 1
  assert "test_explain.py" in call.source
  text = str(report)
  assert "batchpart_test_softmax" in text and "f32[6,5]" in text


def test_a_decorated_wrappers_call_is_placed_at_its_line_in_the_wrapper():
  """The decorator evaluates the wrapper's jaxpr again; the call it binds
  keeps the source location of the ``jax.ffi.ffi_call`` it replaces."""
  @bp.batch_partitionable(num_batch_dims=1)
  def wrapper(x):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("batchpart_test_stencil", out)(  # the call's line
        x, rank=np.int64(1), lo=np.int64(1), hi=np.int64(1), mode=np.int64(0))

  kernels.register()
  (call,) = bp.explain(jax.jit(wrapper), np.ones((4, 16), np.float32)).calls
  line = next(i for i, text in enumerate(open(__file__), 1) if "# the call's line" in text)
  assert f"test_explain.py:{line} (" in call.source, call.source
  assert call.source.endswith("wrapper)"), call.source


def test_explain_does_not_run_the_function():
  kernels.reset_batch_elements_processed()
  bp.explain(kernels.softmax, np.ones((6, 5), np.float32))
  assert kernels.batch_elements_processed() == 0


def test_no_ffi_call():
  report = bp.explain(lambda x: jnp.cos(x) * 2, np.ones(3, np.float32))
  assert report.calls == ()
  assert "no FFI call" in str(report)


def test_keyword_arguments_go_to_the_function():
  f = lambda x, *, scale: kernels.softmax(x * scale)[0]
  (call,) = bp.explain(f, np.ones((2, 3), np.float32), scale=2.0).calls
  assert call.global_operand_shapes == ((2, 3),)


def test_vmap_adds_a_batch_dim():
  (call,) = bp.explain(jax.vmap(kernels.softmax), np.ones((2, 3, 4), np.float32)).calls
  assert call.num_batch_dims == 2 and call.global_operand_shapes == ((2, 3, 4),)


def test_one_device_call_is_known_by_its_frontend_attribute():
  # XLA does not partition here: the call keeps the user's target and
  # carries its derived name in a frontend attribute.
  x = np.ones((6, 5), np.float32)
  plain = lambda v: jax.ffi.ffi_call(
      "batchpart_test_softmax", (jax.ShapeDtypeStruct(v.shape, v.dtype),
                                 jax.ShapeDtypeStruct(v.shape[:-1], v.dtype)))(v)
  f = lambda x: (kernels.softmax(x)[0], plain(x * 2)[0])
  (ours, theirs) = lowered_calls(jax.jit(f).lower(x).compiler_ir())
  assert ours.target == theirs.target == "batchpart_test_softmax"
  assert ours.derived_name == "batchpart_test_softmax$bp1$o1$r1,1$no2$nr2,1"
  assert theirs.derived_name is None and theirs.num_batch_dims is None
  report = bp.explain(f, x)
  assert [c.num_batch_dims for c in report.calls] == [1, None]
  assert [c.removed for c in report.calls] == [False, False]
  assert report.calls[0].device_result_shapes == ((6, 5), (6,))
  compiled = [i for i in _hlo.custom_calls(report.hlo_text, "batchpart_test_softmax")]
  assert sorted(str(i.derived_name) for i in compiled) == sorted(
      [str(ours.derived_name), "None"])


def test_batch_dims_from_the_derived_name_alone():
  # a call without the num_batch_dims attribute (or one explain could not
  # tie to the lowered program) is still known by its derived name
  assert batch_dims(None, "k$bp1$o2,1$r2$no3,2$nr3") == 2
  assert batch_dims("3", "k$bp1$o2,1$r2$no3,2$nr3") == 3
  assert batch_dims(None, None) is None and batch_dims(None, "k$bp1$bad") is None
  line = ('  %c = f32[4,2]{1,0} custom-call(%p), custom_call_target="k", '
          'api_version=API_VERSION_TYPED_FFI, frontend_attributes={'
          'batchpart.derived_name="k$bp1$o1$r1$no2$nr2"}')
  (inst,) = _hlo.instructions(line)
  module = _hlo.Module(computations={"main": [inst]}, entry="main")
  report = build._report(None, inst, module, 1)
  assert report.target == "k" and report.num_batch_dims == 1
  assert report.device_result_shapes == ((4, 2),)


SOFTMAX = "batchpart_test_softmax"
_QUOTED = 'explain_my"quoted'
bp.register_ffi_target(_QUOTED, _core.testing.handlers()["softmax"])


def _quoted_softmax(x):
  return bp.ffi_call(_QUOTED, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                               jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
                     signature="(n)->(n),()")(x)


def test_target_with_a_quote():
  report = bp.explain(_quoted_softmax, np.ones((6, 5), np.float32))
  (call,) = report.calls   # no phantom call, none reported missing
  assert call.target == _QUOTED and not call.removed and call.num_batch_dims == 1
  assert call.device_operand_shapes == ((6, 5),) and call.replication == 1
  assert f"[0] {_QUOTED}" in str(report)


def test_source_file_with_a_quote_and_non_ascii(tmp_path):
  # MLIR and XLA escape file names differently; both read as the same frame
  path = tmp_path / 'caf\u00e9 "q".py'
  path.write_text("def g(x, k):\n  return k(x)\n", encoding="utf-8")
  spec = importlib.util.spec_from_file_location("explain_quoted_module", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  x = np.ones((6, 5), np.float32)
  f = lambda x: module.g(x, kernels.softmax)
  report = bp.explain(f, x)
  (call,) = report.calls
  assert not call.removed and call.source == f"{path}:2 (g)"
  (low,) = lowered_calls(jax.jit(f).lower(x).compiler_ir())
  assert ("g", str(path), 2) in [(fr.function, fr.file, fr.line) for fr in low.frames]
  # the compiled call's stack starts with the lowered one: they match by stack
  compiled = _hlo.parse_module(report.hlo_text)
  (inst,) = [i for i in compiled.all_instructions() if i.target == SOFTMAX]
  assert compiled.stack(inst.stack_frame_id)[:len(low.frames)] == low.frames


def test_the_declaration_as_written():
  # "(n)->(n),()" and num_batch_dims=1 give softmax the same batch dims; the
  # report says which the user wrote
  x = np.ones((6, 5), np.float32)
  (call,) = bp.explain(kernels.softmax, x).calls
  assert call.num_batch_dims == 1 and call.declaration == "signature='(n)->(n),()'"
  text = str(bp.explain(kernels.softmax, x))
  assert "declared:    signature='(n)->(n),()'" in text and "(num_batch_dims)" not in text
  by_k = lambda v: bp.ffi_call(SOFTMAX, (jax.ShapeDtypeStruct(v.shape, v.dtype),
                                         jax.ShapeDtypeStruct(v.shape[:-1], v.dtype)),
                               num_batch_dims=np.int64(1))(v)
  (call,) = bp.explain(by_k, x).calls
  assert call.declaration == "num_batch_dims=1"
  w = np.ones((6, 4), np.float32)
  (call,) = bp.explain(lambda x, w: kernels.reduce_rows(x, w, "max"), np.ones((6, 4, 3),
                                                                              np.float32), w).calls
  assert call.declaration == "signature='(n,k),(n)->(k)', reduce={'n': 'max'}"


def _row_sums(x):
  return x.sum(-1)


def test_batchpart_callbacks_report_the_users_operands_and_declaration():
  S = jax.ShapeDtypeStruct
  x = np.ones((6, 5), np.float32)
  w = np.ones((5,), np.float32)
  cases = [
      (lambda x, w: bp.pure_callback(lambda a, b: a @ b, S((6,), np.float32), x, w,
                                     signature="(n),(n)->()"),
       "signature='(n),(n)->()'", ((6, 5), (5,))),
      (lambda x, w: bp.io_callback(_row_sums, S((6,), np.float32), x, num_batch_dims=1),
       "num_batch_dims=1", ((6, 5),)),
      (lambda x, w: bp.pure_callback(_row_sums, S((6,), np.float32), x, signature="(n)->()",
                                     reduce={"n": "sum"}),
       "signature='(n)->()', reduce={'n': 'sum'}", ((6, 5),)),
  ]
  for f, declared, shapes in cases:
    (call,) = bp.explain(f, x, w).calls
    assert call.callback.startswith(("batchpart.pure_callback(", "batchpart.io_callback("))
    # the block vector (custom-call operand 0) is batchpart's, not the user's
    assert call.global_operand_shapes == call.device_operand_shapes == shapes
    assert call.operand_dtypes == ("float32",) * len(shapes)
    assert call.declaration == declared and call.replication == 1
    assert "s64[" not in str(bp.explain(f, x, w))
  (low,) = lowered_calls(jax.jit(cases[0][0]).lower(x, w).compiler_ir())
  assert low.operands == (("float32", (6, 5)), ("float32", (5,)))


def test_stock_callbacks_on_one_device():
  from jax.experimental import io_callback
  S = jax.ShapeDtypeStruct
  x = np.ones((6, 5), np.float32)
  for f, name in [
      (lambda x: jax.pure_callback(np.sin, S(x.shape, x.dtype), x), "jax.pure_callback"),
      (lambda x: io_callback(np.sin, S(x.shape, x.dtype), x, ordered=True),
       "jax.experimental.io_callback (ordered)"),
  ]:
    (call,) = bp.explain(f, x).calls
    assert call.callback == name and call.declaration is None
    # an ordered callback's token is jax's, not an operand of the user's
    assert call.global_operand_shapes == call.device_operand_shapes == ((6, 5),)
    assert call.global_result_shapes == call.device_result_shapes == ((6, 5),)
    assert call.single_device is None and call.replication == 1


ADOPTED = "explain_adopted_softmax"
jax.ffi.register_ffi_target(ADOPTED, _core.testing.handlers()["softmax"], platform="cpu")


def test_partition_ffi_target_declaration_as_written():
  x = np.ones((6, 5), np.float32)
  f = lambda v: jax.ffi.ffi_call(ADOPTED, (jax.ShapeDtypeStruct(v.shape, v.dtype),
                                           jax.ShapeDtypeStruct(v.shape[:-1], v.dtype)))(v)
  for declaration, written in [({"signature": "(n)->(n),()"}, "signature='(n)->(n),()'"),
                               ({"num_batch_dims": 1}, "num_batch_dims=1"),
                               ({"num_batch_dims": lambda ins, outs: 1}, None)]:
    bp.partition_ffi_target(ADOPTED, **declaration)
    try:
      (call,) = bp.explain(f, x).calls
    finally:
      bp.unpartition(ADOPTED)
    assert call.num_batch_dims == 1 and call.declaration == written
  (call,) = bp.explain(f, x).calls
  assert call.num_batch_dims is None and call.declaration is None
