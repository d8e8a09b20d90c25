"""Every entry point on an Explicit mesh (``jax.make_mesh``'s default axis
type), with and without a mesh context (``jax.set_mesh``): jnp's own ops need
none, so batchpart must not either. Inputs are sharded on a batch dim and on a
core dim; values against NumPy."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
from batchpart import testing as kernels

from helpers import put

P = jax.sharding.PartitionSpec
SOFTMAX = "batchpart_test_softmax"


def _spd(n=8, batch=8, seed=0):
  a = np.random.default_rng(seed).standard_normal((batch, n, n)).astype(np.float32)
  return a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=np.float32)


def _lower(a):
  return np.tril(a) + np.eye(a.shape[-1], dtype=a.dtype)


def _linalg_cases():
  """(name, function of one matrix stack, NumPy reference, input)."""
  a = _spd()
  b = np.random.default_rng(1).standard_normal((8, 8, 3)).astype(np.float32)
  return [
      ("cholesky", bp.linalg.cholesky, np.linalg.cholesky, a),
      ("eigvals", lambda m: bp.linalg.eigh(m)[0], lambda m: np.linalg.eigh(m)[0], a),
      ("qr_r_abs", lambda m: jnp.abs(bp.linalg.qr(m)[1]),
       lambda m: np.abs(np.linalg.qr(m)[1]), a),
      ("svd_s", lambda m: bp.linalg.svd(m, compute_uv=False),
       lambda m: np.linalg.svd(m, compute_uv=False), a),
      ("lu_det", lambda m: jnp.prod(jnp.diagonal(bp.linalg.lu(m)[0], axis1=-2, axis2=-1),
                                    axis=-1) ** 2,
       lambda m: np.linalg.det(m) ** 2, a),
      ("solve", lambda m: bp.linalg.solve(m, jnp.asarray(b)),
       lambda m: np.linalg.solve(m, b), a),
      ("triangular_solve", lambda m: bp.linalg.triangular_solve(
          m, jnp.asarray(b), left_side=True, lower=True),
       lambda m: np.linalg.solve(m, b), _lower(a) / 8),
  ]


@contextlib.contextmanager
def _maybe_context(mesh, context: bool):
  if context:
    with jax.set_mesh(mesh):
      yield
  else:
    yield


@pytest.fixture(params=[False, True], ids=["no_context", "context"])
def context(request):
  return request.param


@pytest.fixture
def explicit_mesh():
  return jax.make_mesh((2, 4), ("a", "b"))   # Explicit axes: jax's default


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _linalg_cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("spec", [P("a", "b", None), P(None, None, "b"), P("a", None, "b")],
                         ids=["batch_and_row", "column", "batch_and_column"])
def test_linalg(case, spec, context, explicit_mesh, partitioner):
  _, f, reference, a = case
  with _maybe_context(explicit_mesh, context):
    out = jax.jit(f)(put(a, explicit_mesh, spec))
  np.testing.assert_allclose(np.asarray(out), reference(a), rtol=2e-3, atol=2e-3)


@pytest.mark.timeout(120)
def test_linalg_shape_errors_are_the_calls_own(context, explicit_mesh):
  a = put(_spd(), explicit_mesh, P("a", "b", None))
  with _maybe_context(explicit_mesh, context), pytest.raises(
      ValueError, match=r"batchpart.linalg.solve: b of shape \(9, 2\) does not fit"):
    jax.jit(bp.linalg.solve)(a, jnp.ones((9, 2)))


def _x():
  return np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)


@bp.batch_partitionable(signature="(n)->(n),()")
def _decorated_softmax(x):
  sds = jax.ShapeDtypeStruct
  return jax.ffi.ffi_call(SOFTMAX, (sds(x.shape, x.dtype), sds(x.shape[:-1], x.dtype)))(x)


def _package_softmax(x):
  sds = jax.ShapeDtypeStruct
  return jax.ffi.ffi_call(SOFTMAX, (sds(x.shape, x.dtype), sds(x.shape[:-1], x.dtype)))(x)


def _host_softmax(x):
  y, lse = kernels.softmax_reference(x)
  return y.astype(x.dtype), lse.astype(x.dtype)


def _package_callback(x):
  sds = jax.ShapeDtypeStruct
  return jax.pure_callback(_host_softmax, (sds(x.shape, x.dtype), sds(x.shape[:-1], x.dtype)),
                           x)


def _bp_callback(x):
  sds = jax.ShapeDtypeStruct
  return bp.pure_callback(_host_softmax, (sds(x.shape, x.dtype), sds(x.shape[:-1], x.dtype)),
                          x, signature="(n)->(n),()")


@contextlib.contextmanager
def _declared(kind):
  if kind == "partition_ffi_target":
    bp.partition_ffi_target(SOFTMAX, signature="(n)->(n),()")
    undo = SOFTMAX
  elif kind == "partition_callback":
    bp.partition_callback(_host_softmax, signature="(n)->(n),()")
    undo = _host_softmax
  else:
    undo = None
  try:
    yield
  finally:
    if undo is not None:
      bp.unpartition(undo)


_ENTRY_POINTS = {
    "ffi_call": kernels.softmax,
    "batch_partitionable": _decorated_softmax,
    "partition_ffi_target": _package_softmax,
    "pure_callback": _bp_callback,
    "partition_callback": _package_callback,
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("entry", sorted(_ENTRY_POINTS))
@pytest.mark.parametrize("spec", [P(("a", "b")), P("a", "b"), P(None, "b")],
                         ids=["batch", "batch_and_core", "core"])
def test_entry_points(entry, spec, context, explicit_mesh, partitioner):
  x = _x()
  with _declared(entry), _maybe_context(explicit_mesh, context):
    y, lse = jax.jit(_ENTRY_POINTS[entry])(put(x, explicit_mesh, spec))
  want_y, want_lse = kernels.softmax_reference(x)
  np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(300)
def test_reduce(context, explicit_mesh, partitioner):
  x, w = kernels.reduce_rows_operands(np.random.default_rng(4), (4,), 8, 3, np.int32)
  with _maybe_context(explicit_mesh, context):
    out = jax.jit(kernels.reduce_rows)(put(x, explicit_mesh, P("a", "b", None)),
                                       put(w, explicit_mesh, P("a", "b")))
  np.testing.assert_array_equal(np.asarray(out), kernels.reduce_rows_reference(x, w))
