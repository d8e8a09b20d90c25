"""batchpart's CUDA kernels (cc/cusolver/, batchpart._cuda).

Three groups, each skipped with its reason where it cannot run:
- without a GPU: registration is a no-op (nothing CUDA is loaded); where the
  CUDA module was built, it loads and exports the CPU kernels' target names;
  where nvcc and cuSOLVER/cuBLAS are found, the CUDA sources configure, compile
  and link from scratch (a CMake build of the _cuda target in a temp dir) and
  the result imports;
- with a CUDA GPU: every batchpart.linalg function x dtype against NumPy on
  the device, both solver paths of each kernel (batched small-matrix routines
  and per-matrix ones), broadcasting, empty batches, and NaN (never an error)
  for failed or non-finite batch elements.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
from batchpart import _cusolver_targets
from batchpart.testing import (
  DTYPES,
  assert_close,
  assert_lu,
  conj_transpose as H,
  hermitian_pd as hpd,
  random_array as rand,
)

REPO = pathlib.Path(__file__).resolve().parent.parent
TOL = {np.float32: 3e-4, np.complex64: 3e-4, np.float64: 1e-10, np.complex128: 1e-10}


# ---- without a GPU -------------------------------------------------------------

def test_register_is_a_no_op_without_cuda_devices():
  if _cusolver_targets.has_cuda_devices():
    pytest.skip("jax has CUDA devices")
  assert _cusolver_targets.register() is False
  assert "batchpart._cuda" not in sys.modules  # nothing CUDA was loaded


def test_built_cuda_module_loads_and_exports_the_cpu_target_names():
  if not _cusolver_targets.available():
    pytest.skip("batchpart._cuda was not built (no nvcc or cuSOLVER/cuBLAS at build time)")
  # A fresh process: importing loads cuSOLVER/cuBLAS, not a GPU.
  code = (
      "from batchpart import _cusolver_targets as t, _core, _lapack_targets\n"
      "t._preload_wheel_libraries()\n"
      "from batchpart import _cuda\n"
      "names = sorted(_cuda.handlers())\n"
      "cpu_names = set(_core.lapack.handlers()) - set(_lapack_targets.CPU_ONLY_TARGET_NAMES)\n"
      "assert names == sorted(cpu_names), names\n"
      "print(_cuda.cuda_runtime_version, _cuda.cusolver_version, _cuda.cublas_version,"
      " _cuda.cuda_architectures)\n")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
  assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("out_batch,in_batch", [
    ((), ()), ((3,), ()), ((3,), (1,)), ((3,), (3,)), ((2, 3), (3,)), ((2, 3), (2, 1)),
    ((2, 3), (1, 3)), ((4, 1, 5), (4, 1, 1)), ((2, 3, 4), (3, 1)), ((2, 1, 3, 4), (2, 1, 1, 4)),
    ((0, 3), (3,)), ((2, 2, 2, 2, 2, 2, 2, 2, 2, 2), (2, 2, 2, 2, 2, 1, 1, 1, 1, 1)),
    ((5, 4, 3, 2), (5, 4, 3, 2)), ((5, 4, 3, 2), (1, 1, 1, 1))])
def test_broadcast_map_matches_numpy(out_batch, in_batch):
  """The batch-broadcast map the device kernels use (trsm/gesv pointer arrays
  and copies), evaluated on the host: merged dims, same indices as NumPy."""
  if not _cusolver_targets.available():
    pytest.skip("batchpart._cuda was not built")
  _cusolver_targets._preload_wheel_libraries()
  from batchpart import _cuda
  count = int(np.prod(in_batch, dtype=np.int64))
  expected = np.broadcast_to(np.arange(count).reshape(in_batch), out_batch).ravel()
  rank, mapping = _cuda._broadcast_map(list(out_batch), list(in_batch))
  np.testing.assert_array_equal(mapping, expected)
  assert rank <= 8


def test_broadcast_map_with_too_many_alternating_dims_is_an_error():
  if not _cusolver_targets.available():
    pytest.skip("batchpart._cuda was not built")
  _cusolver_targets._preload_wheel_libraries()
  from batchpart import _cuda
  out_batch = [2] * 18
  in_batch = [2, 1] * 9  # nine runs of each kind: nothing merges
  with pytest.raises(ValueError, match="needs more than 8 dims on the GPU"):
    _cuda._broadcast_map(out_batch, in_batch)


def _nvcc():
  for candidate in (os.environ.get("CUDACXX"),
                    os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                    "/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
    if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
      return candidate
  return None


@pytest.mark.timeout(1800)
def test_cuda_sources_compile_link_and_import(tmp_path):
  """Configures the repository with BATCHPART_CUDA=AUTO and builds only the
  _cuda target (nvcc for the device kernels, the host compiler for the FFI
  handlers), then imports the result. No GPU needed."""
  nvcc = _nvcc()
  if nvcc is None:
    pytest.skip("no nvcc")
  cmake = shutil.which("cmake")
  if cmake is None:
    pytest.skip("no cmake")
  pytest.importorskip("nanobind", reason="the CMake build needs nanobind (pip install nanobind)")
  if not (REPO / "cc" / "cusolver" / "cuda.cmake").exists():
    pytest.skip("not a source checkout")
  build = tmp_path / "build"
  configure = subprocess.run(
      [cmake, "-S", str(REPO), "-B", str(build), f"-DPython_EXECUTABLE={sys.executable}",
       "-DCMAKE_BUILD_TYPE=Release", "-DBATCHPART_CUDA=AUTO", f"-DCMAKE_CUDA_COMPILER={nvcc}",
       # One architecture keeps the test short; the package build uses the
       # full list (cc/cusolver/cuda.cmake).
       "-DCMAKE_CUDA_ARCHITECTURES=75-real"],
      capture_output=True, text=True)
  assert configure.returncode == 0, configure.stdout + configure.stderr
  if "CUDA kernels not built" in configure.stdout:
    reason = [l for l in configure.stdout.splitlines() if "CUDA kernels not built" in l]
    pytest.skip(reason[0].strip("- "))
  compile_ = subprocess.run(
      [cmake, "--build", str(build), "--target", "_cuda", "--parallel", str(os.cpu_count() or 2)],
      capture_output=True, text=True)
  assert compile_.returncode == 0, compile_.stdout[-20000:] + compile_.stderr[-20000:]
  modules = list(build.glob("_cuda*.so"))
  assert len(modules) == 1, modules
  code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
          "import _cuda\n"
          "print(' '.join(sorted(_cuda.handlers())))\n")
  result = subprocess.run([sys.executable, "-c", code, str(build)], capture_output=True,
                          text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
  assert result.returncode == 0, result.stderr
  from batchpart import _core, _lapack_targets
  cpu_names = set(_core.lapack.handlers()) - set(_lapack_targets.CPU_ONLY_TARGET_NAMES)
  assert result.stdout.split() == sorted(cpu_names)


# ---- with a CUDA GPU -------------------------------------------------------------

@pytest.fixture
def gpu():
  if not _cusolver_targets.available():
    pytest.skip("batchpart._cuda was not built")
  if not _cusolver_targets.has_cuda_devices():
    pytest.skip("no CUDA devices")
  assert _cusolver_targets.register()
  with jax.enable_x64(True):
    yield jax.devices("cuda")[0]


def close(actual, expected, dtype, scale=1.0):
  assert_close(actual, expected, dtype, scale, tols=TOL)


def on(device, *arrays):
  return [jax.device_put(a, device) for a in arrays]


def assert_on_gpu(*arrays):
  for a in arrays:
    assert all(d.platform == "gpu" for d in a.devices()), a.devices()


# Sizes on both sides of the small-matrix paths (n <= 32: potrfBatched,
# syevjBatched, gesvdjBatched; cuBLAS batched LU when n / batch <= 128).
SIZES = [1, 5, 32, 40]
BATCHES = [(), (0,), (1,), (3,), (2, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky(gpu, dtype, n, batch, lower):
  a = hpd(np.random.default_rng(0), batch, n, dtype)
  factor = bp.linalg.cholesky(*on(gpu, a), lower=lower)
  assert_on_gpu(factor)
  l = np.asarray(factor) if lower else H(np.asarray(factor))
  close(l @ H(l), a, dtype, scale=n)
  close(factor, np.linalg.cholesky(a) if lower else H(np.linalg.cholesky(a)), dtype, scale=n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 5), (40, 40), (7, 3), (3, 7), (0, 4), (4, 0)])
@pytest.mark.parametrize("batch", [(), (0,), (3,), (200,), (2, 3)])
def test_lu(gpu, dtype, shape, batch):
  m, n = shape
  a = rand(np.random.default_rng(1), (*batch, m, n), dtype)
  lu, pivots, perm = bp.linalg.lu(*on(gpu, a))
  assert_on_gpu(lu, pivots, perm)
  assert_lu(a, lu, pivots, perm, dtype, scale=max(n, 1), tols=TOL)
  batched = m == n and int(np.prod(batch)) > 1   # cuBLAS getrfBatched (docs/gpu.md)
  if dtype == np.float64 or (dtype == np.complex128 and not batched):
    # Partial pivoting picks the same rows as LAPACK (float32 rounding could
    # flip a near tie, so only double precision is compared). cuBLAS's batched
    # getrf, which batches of complex matrices use, ranks complex pivots by
    # modulus and LAPACK by |re| + |im|: a valid LU either way (assert_lu).
    with jax.default_device(jax.devices("cpu")[0]):
      _, ref_pivots, ref_perm = jax.lax.linalg.lu(a)
    np.testing.assert_array_equal(pivots, ref_pivots)
    np.testing.assert_array_equal(perm, ref_perm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (3, 7), (40, 33), (4, 0), (0, 4)])
@pytest.mark.parametrize("batch", [(), (0,), (2, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(gpu, dtype, shape, batch, mode):
  m, n = shape
  a = rand(np.random.default_rng(2), (*batch, m, n), dtype)
  out = bp.linalg.qr(*on(gpu, a), mode=mode)
  with jax.default_device(jax.devices("cpu")[0]):
    ref = jnp.linalg.qr(a, mode=mode)
  if mode == "r":
    assert out.shape == ref.shape
    close(np.abs(np.asarray(out)), np.abs(np.asarray(ref)), dtype, scale=max(n, 1))
    return
  q, r = map(np.asarray, out)
  assert q.shape == ref[0].shape and r.shape == ref[1].shape
  close(q @ r, a, dtype, scale=max(n, 1))
  eye = np.broadcast_to(np.eye(q.shape[-1]), (*batch, q.shape[-1], q.shape[-1]))
  close(H(q) @ q, eye, dtype, scale=max(m, 1))
  assert np.allclose(np.tril(r, -1), 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("lower", [True, False])
def test_eigh(gpu, dtype, n, batch, lower):
  x = rand(np.random.default_rng(3), (*batch, n, n), dtype)
  a = (x + H(x)) / 2
  w, v = bp.linalg.eigh(*on(gpu, a), lower=lower)
  assert_on_gpu(w, v)
  assert w.dtype == np.finfo(dtype).dtype and v.dtype == dtype
  close(w, np.linalg.eigvalsh(a), dtype, scale=n)
  w, v = np.asarray(w), np.asarray(v)
  close((v * w[..., None, :]) @ H(v), a, dtype, scale=n)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (3, 7), (32, 32), (40, 33), (33, 40),
                                   (40, 4), (4, 40), (0, 3), (3, 0)])
@pytest.mark.parametrize("batch", [(), (0,), (2, 3)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(gpu, dtype, shape, batch, full):
  m, n = shape
  a = rand(np.random.default_rng(4), (*batch, m, n), dtype)
  u, s, vh = map(np.asarray, bp.linalg.svd(*on(gpu, a), full_matrices=full))
  k = min(m, n)
  assert u.shape == (*batch, m, m if full else k) and vh.shape == (*batch, n if full else k, n)
  scale = max(m, n, 1)
  assert s.shape == (*batch, k) and s.dtype == np.finfo(dtype).dtype
  if k:
    close(s, np.linalg.svd(a, compute_uv=False), dtype, scale=scale)
  close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, dtype, scale=scale)
  if full or k:
    close(H(u) @ u, np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] + (u.shape[-1],) * 2),
          dtype, scale=scale)
    close(vh @ H(vh), np.broadcast_to(np.eye(vh.shape[-2]), vh.shape[:-2] + (vh.shape[-2],) * 2),
          dtype, scale=scale)
  close(bp.linalg.svd(*on(gpu, a), compute_uv=False), s, dtype, scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_batch,b_batch", [((), ()), ((3,), (3,)), ((), (3,)), ((3,), ()),
                                             ((2, 1), (3,)), ((1,), (2, 3)), ((0,), ())])
@pytest.mark.parametrize("n", [1, 5, 40])
# (left_side, lower, (transpose_a, conjugate_a), unit_diagonal): every side,
# triangle and op, with and without a unit diagonal.
@pytest.mark.parametrize("options", [
    (True, True, (False, False), False), (True, False, (True, False), True),
    (True, True, (True, True), False), (True, False, (False, True), False),
    (False, True, (False, False), True), (False, False, (True, False), False),
    (False, False, (True, True), True), (False, True, (False, True), False)])
def test_triangular_solve(gpu, dtype, a_batch, b_batch, n, options):
  left_side, lower, transpose, unit_diagonal = options
  rng = np.random.default_rng(5)
  a = rand(rng, (*a_batch, n, n), dtype) + 3 * n * np.eye(n, dtype=dtype)
  b = rand(rng, (*b_batch, n, 2) if left_side else (*b_batch, 2, n), dtype)
  transpose_a, conjugate_a = transpose
  x = bp.linalg.triangular_solve(*on(gpu, a, b), left_side=left_side, lower=lower,
                                 transpose_a=transpose_a, conjugate_a=conjugate_a,
                                 unit_diagonal=unit_diagonal)
  assert_on_gpu(x)
  batch = np.broadcast_shapes(a_batch, b_batch)
  t = np.tril(a) if lower else np.triu(a)
  if unit_diagonal:
    t = t - t * np.eye(n) + np.eye(n)
  op = np.swapaxes(t, -1, -2) if transpose_a else t
  op = np.conj(op) if conjugate_a else op
  op = np.broadcast_to(op, (*batch, n, n))
  bb = np.broadcast_to(b, (*batch, *b.shape[-2:]))
  ref = np.linalg.solve(op, bb) if left_side else \
      np.swapaxes(np.linalg.solve(np.swapaxes(op, -1, -2), np.swapaxes(bb, -1, -2)), -1, -2)
  # The forward error a triangle's conditioning allows: a unit-diagonal random
  # triangle is ill conditioned, and cuBLAS sums in another order than LAPACK.
  cond = float(np.max(np.linalg.cond(op))) if op.size else 1.0
  close(x, ref, dtype, scale=n * max(1.0, n * cond * np.finfo(dtype).eps / TOL[dtype]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_batch,b_batch", [((), ()), ((3,), (3,)), ((), (3,)), ((3,), ()),
                                             ((2, 1), (3,)), ((300,), ()), ((0,), ())])
@pytest.mark.parametrize("n", [1, 5, 40, 200])
def test_solve(gpu, dtype, a_batch, b_batch, n):
  rng = np.random.default_rng(6)
  a = rand(rng, (*a_batch, n, n), dtype) + 2 * n * np.eye(n, dtype=dtype)
  b = rand(rng, (*b_batch, n, 3), dtype)
  x = bp.linalg.solve(*on(gpu, a, b))
  assert_on_gpu(x)
  batch = np.broadcast_shapes(a_batch, b_batch)
  ref = np.linalg.solve(np.broadcast_to(a, (*batch, n, n)), np.broadcast_to(b, (*batch, n, 3)))
  close(x, ref, dtype, scale=n)
  if not b_batch:  # a vector right-hand side
    v = b[:, 0]
    xv = bp.linalg.solve(*on(gpu, a, v))
    close(xv, np.linalg.solve(a, np.broadcast_to(v[:, None], (*a_batch, n, 1)))[..., 0], dtype,
          scale=n)


# ---- failures give NaN, never an error ------------------------------------------------

@pytest.mark.parametrize("n", [3, 40])
def test_cholesky_not_positive_definite_gives_nan_in_that_element(gpu, n):
  a = hpd(np.random.default_rng(7), (4,), n, np.float64)
  a[2] = -np.eye(n)
  factor = np.asarray(bp.linalg.cholesky(*on(gpu, a)))
  assert np.isnan(factor[2]).all()
  close(factor[[0, 1, 3]], np.linalg.cholesky(a[[0, 1, 3]]), np.float64, scale=n)


@pytest.mark.parametrize("n", [4, 40])
@pytest.mark.parametrize("a_batch", [(3,), (3, 1)])
def test_singular_solve_gives_nan_in_that_element(gpu, n, a_batch):
  rng = np.random.default_rng(8)
  a = rand(rng, (*a_batch, n, n), np.float64) + 2 * n * np.eye(n)
  a[1] = 0
  b = rand(rng, (3, n, 2), np.float64)
  x = np.asarray(bp.linalg.solve(*on(gpu, a, b)))
  ab = np.broadcast_to(a, (*np.broadcast_shapes(a_batch, (3,)), n, n))
  bad = np.isnan(x).all(axis=(-1, -2))
  assert (bad == (np.abs(ab).sum(axis=(-1, -2)) == 0)).all()
  good = ~bad
  close(x[good], np.linalg.solve(ab[good], np.broadcast_to(b, x.shape)[good]), np.float64,
        scale=n)


@pytest.mark.parametrize("n", [3, 40])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_eigh_and_svd_non_finite_give_nan_in_that_element(gpu, n, bad):
  a = np.stack([np.eye(n), np.full((n, n), bad), 2 * np.eye(n)])
  w, v = map(np.asarray, bp.linalg.eigh(*on(gpu, a)))
  assert np.isnan(w[1]).all() and np.isnan(v[1]).all()
  close(w[[0, 2]], np.stack([np.ones(n), 2 * np.ones(n)]), np.float64)
  u, s, vh = map(np.asarray, bp.linalg.svd(*on(gpu, a)))
  assert np.isnan(s[1]).all() and np.isnan(u[1]).all() and np.isnan(vh[1]).all()
  close(s[[0, 2]], np.stack([np.ones(n), 2 * np.ones(n)]), np.float64)


@pytest.mark.parametrize("n", [3, 40])
def test_garbage_batch_elements_never_fail_the_call(gpu, n):
  """Padding rows of an uneven shard hold whatever was in memory: NaN, Inf,
  huge or zero matrices. Every kernel returns; the good elements are right."""
  rng = np.random.default_rng(9)
  good = hpd(rng, (2,), n, np.float32)
  junk = np.stack([np.full((n, n), np.nan), np.full((n, n), np.inf), np.full((n, n), 3e38),
                   np.zeros((n, n)), rng.standard_normal((n, n)) * 1e30]).astype(np.float32)
  a = np.concatenate([good, junk])
  b = rand(rng, (len(a), n, 2), np.float32)
  (a_gpu, b_gpu) = on(gpu, a, b)
  results = [
      bp.linalg.cholesky(a_gpu), *bp.linalg.lu(a_gpu), *bp.linalg.qr(a_gpu),
      *bp.linalg.eigh(a_gpu), *bp.linalg.svd(a_gpu), bp.linalg.svd(a_gpu, compute_uv=False),
      bp.linalg.triangular_solve(a_gpu, b_gpu), bp.linalg.solve(a_gpu, b_gpu)]
  jax.block_until_ready(results)
  close(np.asarray(results[0])[:2], np.linalg.cholesky(good), np.float32, scale=n)
  close(np.asarray(bp.linalg.solve(a_gpu, b_gpu))[:2], np.linalg.solve(good, b[:2]),
        np.float32, scale=10 * n)


def test_jit_and_vmap_are_one_cuda_custom_call(gpu):
  a = hpd(np.random.default_rng(10), (3, 4), 3, np.float64)
  f = jax.jit(jax.vmap(bp.linalg.cholesky, in_axes=1))
  (a_gpu,) = on(gpu, a)
  text = f.lower(a_gpu).as_text()
  assert text.count('stablehlo.custom_call @batchpart_potrf(') == 1 and "while" not in text
  out = f(a_gpu)
  assert_on_gpu(out)
  close(out, np.linalg.cholesky(np.swapaxes(a, 0, 1)), np.float64)


def test_gradients_on_gpu_match_jnp(gpu):
  a = hpd(np.random.default_rng(11), (2,), 4, np.float64)
  (a_gpu,) = on(gpu, a)
  ours = jax.grad(lambda x: jnp.sum(bp.linalg.cholesky(x) ** 2))(a_gpu)
  theirs = jax.grad(lambda x: jnp.sum(jnp.linalg.cholesky(x) ** 2))(a_gpu)
  close(ours, np.asarray(theirs), np.float64, scale=10)
