"""jax.export of a sharded batchpart program, run in a fresh process that
imports batchpart: same values, no collectives."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
from jax import export
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

FRESH_PROCESS = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    from jax import export
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import batchpart as bp
    import batchpart.testing
    from batchpart import _hlo
    batchpart.testing.register()
    bp.linalg.cholesky(np.eye(2))  # the LAPACK targets, as in the exporting process
    exported = export.deserialize(open(sys.argv[1], "rb").read())
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    args = [jax.device_put(np.load(path), NamedSharding(mesh, P("x"))) for path in sys.argv[3:]]
    f = jax.jit(exported.call)
    text = f.lower(*args).compile().as_text()
    assert not _hlo.collectives(text), [c.opcode for c in _hlo.collectives(text)]
    out = f(*args)
    np.save(sys.argv[2], np.asarray(out[0] if isinstance(out, (tuple, list)) else out))
""")


def _run_fresh(tmp_path, exported, *arrays):
  artifact = tmp_path / "program.bin"
  artifact.write_bytes(exported.serialize())
  paths = []
  for i, a in enumerate(arrays):
    paths.append(str(tmp_path / f"arg{i}.npy"))
    np.save(paths[-1], a)
  out = tmp_path / "out.npy"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(artifact), str(out), *paths],
                        capture_output=True, text=True, timeout=240, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return np.load(out)


def _export(f, mesh, *arrays, targets):
  sharding = NamedSharding(mesh, P("x"))
  jitted = jax.jit(f, in_shardings=(sharding,) * len(arrays), out_shardings=sharding)
  return export.export(
      jitted, disabled_checks=[export.DisabledSafetyCheck.custom_call(t) for t in targets])(
          *[jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in arrays])


def test_exported_cholesky_runs_sharded_in_a_fresh_process(tmp_path, mesh8):
  x = np.random.default_rng(0).standard_normal((16, 4, 4)).astype(np.float32)
  a = x @ np.swapaxes(x, -1, -2) + 4 * np.eye(4, dtype=np.float32)
  exported = _export(bp.linalg.cholesky, mesh8, a, targets=["batchpart_potrf"])
  np.testing.assert_allclose(_run_fresh(tmp_path, exported, a), np.linalg.cholesky(a),
                             rtol=1e-4, atol=1e-4)


def test_exported_broadcasting_call(tmp_path, mesh8):
  a = np.random.default_rng(1).standard_normal((16, 3, 5)).astype(np.float32)
  v = np.arange(5, dtype=np.float32)
  f = lambda a: kernels.matvec(a, v, alpha=2.0)  # v is a broadcast constant operand
  exported = _export(f, mesh8, a, targets=["batchpart_test_matvec"])
  np.testing.assert_allclose(_run_fresh(tmp_path, exported, a), 2 * a @ v, rtol=1e-5,
                             atol=1e-5)


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
  np.testing.assert_array_equal(_run_fresh(tmp_path, exported, x), x)


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
