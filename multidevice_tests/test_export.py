"""jax.export of a sharded batchpart program, run in a fresh process that
imports batchpart: same values, no collectives. A program with a
``bp.Combiner`` or a parallel ``bp.Scan`` carries their jnp functions: the
fresh process, which never ran the code that declared them, runs it sharded
under Shardy and GSPMD with one all-gather of the parts' small results."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import assert_one_all_gather, local_shapes, the_custom_call

FRESH_PROCESS = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    from jax import export
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import batchpart as bp
    import batchpart.testing
    from batchpart._vocab.dims import scan, user_combiner
    artifact, out, partitioner, specs = sys.argv[1:5]
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    jax.config.update("jax_enable_x64", True)
    batchpart.testing.register()
    bp.linalg.cholesky(np.eye(2))  # the LAPACK targets, as in the exporting process
    # No merge or scan was ever lowered here: the artifact must bring its own.
    assert not user_combiner.COMBINERS._by_name and not scan.SCANS._by_name
    exported = export.deserialize(open(artifact, "rb").read())
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    args = [jax.device_put(np.load(path), NamedSharding(mesh, P(*spec)))
            for path, spec in zip(sys.argv[5:], json.loads(specs))]
    f = jax.jit(exported.call)
    open(os.path.join(out, "compiled.txt"), "w").write(f.lower(*args).compile().as_text())
    outs = f(*args)
    for i, o in enumerate(outs if isinstance(outs, (tuple, list)) else [outs]):
      np.save(os.path.join(out, f"out{i}.npy"), np.asarray(o))
""")


def _run_fresh(tmp_path, exported, *arrays, specs=None, partitioner="shardy"):
  """``exported`` called in a fresh process on ``arrays`` (each sharded over
  8 devices by its spec in ``specs``, default ``P("x")``): its results and
  the compiled program's text."""
  artifact = tmp_path / "program.bin"
  artifact.write_bytes(exported.serialize())
  paths = []
  for i, a in enumerate(arrays):
    paths.append(str(tmp_path / f"arg{i}.npy"))
    np.save(paths[-1], a)
  out = tmp_path / "out"
  out.mkdir()
  specs = [tuple(s) for s in specs] if specs else [("x",)] * len(arrays)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(artifact), str(out),
                         partitioner, json.dumps(specs), *paths],
                        capture_output=True, text=True, timeout=240, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = sorted(out.glob("out*.npy"), key=lambda p: int(p.stem[3:]))
  return [np.load(p) for p in results], (out / "compiled.txt").read_text()


def _export(f, mesh, *arrays, targets, specs=None):
  """``f`` exported on ``arrays`` sharded by ``specs`` (default: each and
  the result ``P("x")``)."""
  shardings = tuple(NamedSharding(mesh, s) for s in specs or [P("x")] * len(arrays))
  jitted = jax.jit(f, in_shardings=shardings,
                   out_shardings=None if specs else shardings[0])
  return export.export(
      jitted, disabled_checks=[export.DisabledSafetyCheck.custom_call(t) for t in targets])(
          *[jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            for a, s in zip(arrays, shardings)])


def _no_collectives(text: str) -> bool:
  return not _hlo.collectives(text)


def test_exported_cholesky_runs_sharded_in_a_fresh_process(tmp_path, mesh8):
  x = np.random.default_rng(0).standard_normal((16, 4, 4)).astype(np.float32)
  a = x @ np.swapaxes(x, -1, -2) + 4 * np.eye(4, dtype=np.float32)
  exported = _export(bp.linalg.cholesky, mesh8, a, targets=["batchpart_potrf"])
  (out,), text = _run_fresh(tmp_path, exported, a)
  np.testing.assert_allclose(out, np.linalg.cholesky(a), rtol=1e-4, atol=1e-4)
  assert _no_collectives(text)


def test_exported_broadcasting_call(tmp_path, mesh8):
  a = np.random.default_rng(1).standard_normal((16, 3, 5)).astype(np.float32)
  v = np.arange(5, dtype=np.float32)
  f = lambda a: kernels.matvec(a, v, alpha=2.0)  # v is a broadcast constant operand
  exported = _export(f, mesh8, a, targets=["batchpart_test_matvec"])
  (out,), text = _run_fresh(tmp_path, exported, a)
  np.testing.assert_allclose(out, 2 * a @ v, rtol=1e-5, atol=1e-5)
  assert _no_collectives(text)


def test_exported_float8_call(tmp_path, mesh8):
  """Operand types the process reading the artifact never parses itself."""
  f8 = jax.numpy.float8_e4m3fn
  x = np.random.default_rng(2).integers(0, 120, (16, 4, 4)).astype(np.uint8)

  def f(bits):
    y = jax.lax.bitcast_convert_type(bits, f8)
    y = bp.ffi_call("batchpart_test_copy_bytes", jax.ShapeDtypeStruct(y.shape, f8),
                    signature="(m,n)->(m,n)")(y)
    return jax.lax.bitcast_convert_type(y, np.uint8)

  exported = _export(f, mesh8, x, targets=["batchpart_test_copy_bytes"])
  (out,), text = _run_fresh(tmp_path, exported, x)
  np.testing.assert_array_equal(out, x)
  assert _no_collectives(text)


def test_shape_polymorphic_export_names_the_target():
  (b,) = export.symbolic_shape("b")
  spec = jax.ShapeDtypeStruct((b, 16), np.float32)
  with np.testing.assert_raises_regex(NotImplementedError,
                                      "batchpart_test_softmax.*shape-polymorphic"):
    export.export(jax.jit(kernels.softmax), disabled_checks=[
        export.DisabledSafetyCheck.custom_call("batchpart_test_softmax")])(spec)


def test_safety_check_names_the_user_target(mesh8):
  x = np.ones((16, 8), np.float32)
  with np.testing.assert_raises_regex(ValueError, "custom calls whose targets"):
    export.export(jax.jit(kernels.softmax))(x)
  exported = export.export(jax.jit(kernels.softmax), disabled_checks=[
      export.DisabledSafetyCheck.custom_call("batchpart_test_softmax")])(x)
  assert "batchpart_test_softmax$bp1$" in exported.mlir_module()


# The Combiner's and the Scan's functions live here, in the test module, which
# the fresh process never imports.
ARG = "batchpart_test_arg_rows"
LINEAR = "batchpart_test_linear_scan"

# (partitioner exported under, exported with shardings, partitioner run under).
# jax calls an artifact exported with shardings under Shardy only (it wraps its
# arguments in Shardy's sharding ops whatever the caller's partitioner), so a
# GSPMD process runs one exported on one device (each batchpart call then
# carries its derived name and functions beside the user's target).
ROUTES = [("shardy", True, "shardy"), ("gspmd", True, "shardy"), ("gspmd", False, "gspmd")]


@pytest.fixture(params=ROUTES, ids=["shardy", "gspmd-to-shardy", "one-device-to-gspmd"])
def route(request):
  exported_under, sharded, run_under = request.param
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", exported_under == "shardy")
  yield sharded, run_under
  jax.config.update("jax_use_shardy_partitioner", previous)


def _export_routed(f, mesh, arrays, specs, target, sharded: bool):
  """``f`` exported with ``arrays`` sharded by ``specs``, or on one device."""
  if sharded:
    return _export(f, mesh, *arrays, targets=[target], specs=specs)
  return export.export(jax.jit(f), disabled_checks=[
      export.DisabledSafetyCheck.custom_call(target)])(*arrays)


def first_max(a, b):
  """NumPy's argmax as a merge: among ties the earlier part keeps its index."""
  (va, ia), (vb, ib) = a, b
  take_b = vb > va
  return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)


def argmax_rows(x):
  out = (jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
         jax.ShapeDtypeStruct(x.shape[:-1], np.int32))
  return bp.ffi_call(ARG, out, signature="(n)->(),()",
                     reduce={"n": bp.Combiner(first_max, index_results=(1,))})(
      x, op=np.int64(0))


def test_exported_combiner_runs_sharded_in_a_fresh_process(tmp_path, mesh8, route):
  """The merge travels in the artifact: the fresh process gathers each
  part's (value, index), never x, and merges them in part order."""
  sharded, run_under = route
  rng = np.random.default_rng(3)
  x = rng.integers(-5, 5, (4, 64)).astype(np.float32)
  x[0, [7, 8, 40]] = 99       # a tie across the boundary of parts 0 and 1
  exported = _export_routed(argmax_rows, mesh8, [x], [P(None, "x")], ARG, sharded)
  assert "batchpart.functions" in exported.mlir_module()
  (value, index), text = _run_fresh(tmp_path, exported, x, specs=[(None, "x")],
                                    partitioner=run_under)
  np.testing.assert_array_equal(index, np.argmax(x, -1))
  np.testing.assert_array_equal(value, x.max(-1))
  assert local_shapes(the_custom_call(text, ARG)) == [(4, 8)]
  assert_one_all_gather(text, "[8,4]")     # each part's 4 candidates, not x[4,64]
  assert {c.opcode for c in _hlo.collectives(text)} == {"all-gather"}
  assert "batchpart.functions" not in text   # read when lowered, dropped by XLA


def decay_merge(a, b):
  """The linear recurrence's summaries (h_T, prod a) of two parts, ``a`` the
  earlier (written apart from ``batchpart.testing``'s own)."""
  (h1, p1), (h2, p2) = a, b
  return h1 * p2 + h2, p2 * p1


def decay_apply(summary, state):
  h, p = summary
  return state * p + h


def linear(a, x, h0):
  state = jax.ShapeDtypeStruct(h0.shape, h0.dtype)
  call = bp.ffi_call(LINEAR, (jax.ShapeDtypeStruct(x.shape, x.dtype), state, state),
                     signature="(t),(t),()->(t),(),()",
                     scan={"t": bp.Scan((2, 1), merge=decay_merge, apply=decay_apply)})
  return call(a, x, h0, reverse=np.int64(0))


def linear_ref(a, x, h0):
  y, h, p = np.zeros_like(x), h0.copy(), np.ones_like(h0)
  for i in range(x.shape[-1]):
    h = a[..., i] * h + x[..., i]
    p = p * a[..., i]
    y[..., i] = h
  return y, h, p


def test_exported_parallel_scan_runs_sharded_in_a_fresh_process(tmp_path, mesh8, route):
  """The Scan's merge and apply travel in the artifact: two passes around
  one all-gather of the parts' summaries, the sequence never gathered."""
  sharded, run_under = route
  rng = np.random.default_rng(4)
  a = rng.uniform(0.8, 1.0, (3, 64))
  x = rng.normal(size=(3, 64))
  h0 = rng.normal(size=(3,))
  with jax.enable_x64(True):
    exported = _export_routed(linear, mesh8, [a, x, h0], [P(None, "x"), P(None, "x"), P()],
                              LINEAR, sharded)
  (y, h, p), text = _run_fresh(tmp_path, exported, a, x, h0,
                               specs=[(None, "x"), (None, "x"), ()], partitioner=run_under)
  for got, want in zip((y, h, p), linear_ref(a, x, h0)):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
  calls = _hlo.custom_calls(text, LINEAR)   # the two passes, on each device's part
  assert len(calls) == 2 and all(local_shapes(c)[:2] == [(3, 8)] * 2 for c in calls)
  assert_one_all_gather(text, "[8,3]")     # each part's (h_T, prod a), not x[3,64]
  assert {c.opcode for c in _hlo.collectives(text)} == {"all-gather"}
  assert "batchpart.functions" not in text   # read when lowered, dropped by XLA
