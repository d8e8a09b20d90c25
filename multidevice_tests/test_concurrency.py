"""Concurrency: 8 Python threads compiling and running different batchpart
programs at once, each checked against NumPy on every run.

Every call is partitioned from its own derived target name, so concurrent
lowering and compiling must never mix two programs up; programs that share
types are covered in ``test_interleaved_lowering_keeps_each_programs_layouts``
and in test_call_identity.py.
"""

from __future__ import annotations

import threading
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import put, rng

S = jax.ShapeDtypeStruct
COPY = "batchpart_test_copy_bytes"
NUM_THREADS = 8
RUNS_PER_PROGRAM = 10
SHAPES_PER_THREAD = 2   # each thread compiles this many programs


def _spd(r, batch, n):
  m = r.standard_normal((batch, n, n)).astype(np.float32)
  return m @ np.swapaxes(m, -1, -2) + n * np.eye(n, dtype=np.float32)


def _copy_transposing(x):
  """copy_bytes from a column-major operand into a row-major result."""
  r = x.ndim
  return bp.ffi_call(COPY, S(x.shape, x.dtype), signature="(m,n)->(m,n)",
                     input_layouts=[(*range(r - 2), r - 1, r - 2)])(x)


def _programs(mesh8, mesh2x4, k: int):
  """Eight programs (one per thread): (name, fn, args, numpy check). `k`
  varies the shapes so that each round compiles new programs."""
  r = rng(100 + k)
  b = 8 * (k + 1)
  x = r.standard_normal((b, 16), dtype=np.float32)
  y = r.standard_normal((b + 3, 8 * (k + 1)), dtype=np.float32)
  a = r.standard_normal((b, 4, 6 + k), dtype=np.float32)
  v = r.standard_normal((6 + k,), dtype=np.float32)
  u, w = (r.standard_normal((b, 5 + k), dtype=np.float32) for _ in range(2))
  c = r.standard_normal((b, 3, 4 + k), dtype=np.float32)
  spd = _spd(r, b, 8 * (k + 1))
  sa = _spd(r, b, 4 + k)
  sb = r.standard_normal((b, 4 + k, 2), dtype=np.float32)
  q = r.standard_normal((b, 6 + k, 4), dtype=np.float32)

  def softmax_check(out, x):
    ref = kernels.softmax_reference(x)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[1], ref[1], rtol=1e-5, atol=1e-5)

  return [
      ("softmax batch-sharded", kernels.softmax, [put(x, mesh8, P("x"))],
       lambda out: softmax_check(out, x)),
      ("softmax core-sharded, uneven", lambda y: kernels.softmax(y[: b + 3]),
       [put(np.pad(y, ((0, 5), (0, 0))), mesh2x4, P("a", "b"))],
       lambda out: softmax_check(out, y)),
      ("matvec broadcast", lambda a, v: kernels.matvec(a, v, alpha=2.0),
       [put(a, mesh8, P("x")), put(v, mesh8, P())],
       lambda out: np.testing.assert_allclose(out, 2 * a @ v, rtol=1e-5, atol=1e-5)),
      ("axpy", lambda u, w: bp.ffi_call("batchpart_test_axpy", S(u.shape, u.dtype),
                                        num_batch_dims=1)(u, w, alpha=3.0),
       [put(u, mesh2x4, P(("a", "b"))), put(w, mesh2x4, P("b"))],
       lambda out: np.testing.assert_allclose(out, 3 * u + w, rtol=1e-6)),
      ("copy_bytes column-major", _copy_transposing, [put(c, mesh8, P("x"))],
       lambda out: np.testing.assert_array_equal(
           out, np.swapaxes(c, -1, -2).reshape(c.shape))),
      ("linalg.cholesky", bp.linalg.cholesky, [put(spd, mesh8, P(None, None, "x"))],
       lambda out: np.testing.assert_allclose(out, np.linalg.cholesky(spd), rtol=1e-4,
                                              atol=1e-4)),
      ("linalg.solve", bp.linalg.solve, [put(sa, mesh2x4, P("a")), put(sb, mesh2x4, P("b"))],
       lambda out: np.testing.assert_allclose(out, np.linalg.solve(sa, sb), rtol=1e-3,
                                              atol=1e-4)),
      ("linalg.qr", lambda q: tuple(bp.linalg.qr(q)), [put(q, mesh8, P("x"))],
       lambda out: np.testing.assert_allclose(out[0] @ out[1], q, rtol=1e-4, atol=1e-4)),
  ]


@pytest.mark.timeout(120)
def test_eight_threads_compile_and_run_different_programs(partitioner, mesh8, mesh2x4):
  rounds = [_programs(mesh8, mesh2x4, k) for k in range(SHAPES_PER_THREAD)]
  assert len(rounds[0]) == NUM_THREADS
  barrier = threading.Barrier(NUM_THREADS)
  errors: list[str] = []
  runs = [0] * NUM_THREADS

  def worker(i):
    try:
      barrier.wait(timeout=60)
      for programs in rounds:
        name, fn, args, check = programs[i]
        f = jax.jit(fn)   # a fresh jit: every thread lowers and compiles at once
        for _ in range(RUNS_PER_PROGRAM):
          check(jax.tree.map(np.asarray, f(*args)))
          runs[i] += 1
    except BaseException as e:  # noqa: BLE001 - reported below
      errors.append(f"thread {i} ({name}): {type(e).__name__}: {e}")

  with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(NUM_THREADS)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=110)
  assert not any(t.is_alive() for t in threads), "a thread did not finish"
  assert not errors, "\n".join(errors)
  assert runs == [RUNS_PER_PROGRAM * SHAPES_PER_THREAD] * NUM_THREADS


@pytest.mark.timeout(120)
def test_interleaved_lowering_keeps_each_programs_layouts(mesh8):
  # A shape no other test uses, so that nothing is cached from elsewhere.
  x = np.arange(8 * 5 * 7, dtype=np.float32).reshape(8, 5, 7)
  xs = put(x, mesh8, P("x"))
  transposing = jax.jit(lambda x: _copy_transposing(x))
  plain = jax.jit(lambda x: bp.ffi_call(COPY, S(x.shape, x.dtype),
                                        signature="(m,n)->(m,n)")(x))
  lowered_t = transposing.lower(xs)
  lowered_p = plain.lower(xs)      # same types, default layouts
  out_t = lowered_t.compile()(xs)
  out_p = lowered_p.compile()(xs)
  np.testing.assert_array_equal(out_p, x)
  np.testing.assert_array_equal(out_t, np.swapaxes(x, -1, -2).reshape(x.shape))
