"""The interleaved small-matrix eigh (cc/lapack/small_eigh.*) behind
batchpart_eigh: eigenvalues against numpy and eigenvectors by what defines
them (A V = V diag(w), V unitary) on both sides of the size switch, for every
dtype, either triangle read, partly filled groups, eigenvalues only, repeated
and zero eigenvalues, extreme magnitudes and non-finite elements beside
ordinary matrices, the diagonal's imaginary parts ignored, and gradients
through bp.linalg.eigh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from small_tables import MARKS, both_paths, call, past_a_group, sizes_around

import batchpart as bp
from batchpart import _core
from batchpart.testing import (
  DTYPES,
  assert_alone_as_in_batch,
  assert_close,
  hermitian_pd,
  lanes,
  random_array,
  small_path,
  switch_key,
)

pytestmark = MARKS

# The n the target decomposes interleaved (kEighSizes in
# cc/lapack/small_eigh.h), by (complex, single precision).
SWITCH = _core.lapack.small_eigh_sizes()
SIZES = [1, 2, 3, 4, 7, 8, 16, 17]
NON_FINITE_INFO = -4  # kNonFiniteInfo, cc/common/contracts.h
SIDES = pytest.mark.parametrize("lower", [True, False], ids=["lower", "upper"])


def largest(dtype):
  return SWITCH[switch_key(dtype)][1]


def sizes_around_switch(dtype):
  return sizes_around(largest(dtype), sizes=SIZES)


def eigh(a, lower=True, vectors=True):
  """(w, v, info) of the batchpart_eigh target (column-major, as on every platform)."""
  *batch, n, _ = a.shape
  return call("batchpart_eigh", [a],
              [((*batch, n), np.finfo(a.dtype).dtype, False),
               ((*batch, n, n if vectors else 0), a.dtype, True), (tuple(batch), np.int32, False)],
              lower=lower, compute_vectors=vectors)


def H(x):
  return np.conj(np.swapaxes(x, -1, -2))


def wide(dtype):
  """The double-precision type of dtype's kind."""
  return np.complex128 if np.iscomplexobj(np.zeros(0, dtype)) else np.float64


def symmetric(rng, shape, dtype):
  """Random Hermitian matrices (real symmetric for real dtypes)."""
  x = random_array(rng, shape, wide(dtype))
  return ((x + H(x)) / 2).astype(dtype)


def scale_of(a):
  n = a.shape[-1]
  return max(1.0, float(np.abs(a).max(initial=0.0))) * max(n, 1)


def check_eigh(a, w, v, dtype):
  """Eigenvalues ascending and as numpy's; A V = V diag(w); V^H V = I."""
  n = a.shape[-1]
  assert w.dtype == np.finfo(dtype).dtype and (np.diff(w, axis=-1) >= 0).all()
  assert_close(w, np.linalg.eigvalsh(a.astype(np.complex128)), dtype, scale_of(a))
  assert_close(a @ v, v * w[..., None, :], dtype, scale_of(a))
  assert_close(H(v) @ v, np.broadcast_to(np.eye(n), a.shape), dtype, n)


@SIDES
@pytest.mark.parametrize("dtype", DTYPES)
def test_eigh_matches_numpy_on_both_sides_of_the_switch(lower, dtype):
  rng = np.random.default_rng(0)
  for n in sizes_around_switch(dtype):
    a = symmetric(rng, (lanes(dtype) + 3, n, n), dtype)
    with small_path("eigh", "auto"):
      auto = eigh(a, lower)
    ours, theirs = both_paths("eigh", eigh, a, lower)
    for w, v, info in (ours, theirs):
      assert not info.any()
      check_eigh(a, w, v, dtype)
    # "auto" takes the interleaved kernel up to the switch, bit for bit.
    expected = ours if n <= largest(dtype) else theirs
    for got, want in zip(auto, expected, strict=True):
      np.testing.assert_array_equal(got, want)


@SIDES
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_other_triangle_is_never_read(lower, dtype):
  n = 9
  _, a = past_a_group(symmetric, dtype, (n, n))
  unread = np.triu(np.ones((n, n), bool), 1) if lower else np.tril(np.ones((n, n), bool), -1)
  garbled = np.where(unread, np.asarray(np.nan, dtype), a)
  for batch in (len(a), 5):  # a full group packs whole matrices, a part-filled one the triangle
    w, v, info = both_paths("eigh", eigh, garbled[:batch], lower)[0]
    assert not info.any()
    check_eigh(a[:batch], w, v, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 5, 17, 100])
def test_eigh_of_batches_that_do_not_fill_the_lanes(dtype, batch):
  a = symmetric(np.random.default_rng(batch), (batch, 7, 7), dtype)
  with small_path("eigh", "always"):
    w, v, info = eigh(a)
  assert not info.any()
  check_eigh(a, w, v, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eigenvalues_alone_are_those_with_vectors(dtype):
  a = symmetric(np.random.default_rng(2), (lanes(dtype) + 5, 12, 12), dtype)
  with small_path("eigh", "always"):
    w, v, info = eigh(a, vectors=False)
    w_with_vectors = eigh(a)[0]
  assert v.shape == (len(a), 12, 0) and not info.any()
  np.testing.assert_array_equal(w, w_with_vectors)


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeated_zero_and_already_diagonal_spectra(dtype):
  rng = np.random.default_rng(3)
  n = 8
  q = np.linalg.qr(random_array(rng, (n, n), wide(dtype)))[0]
  cases = [
      np.zeros((n, n)),
      np.eye(n),
      np.diag(np.arange(n, 0, -1.0)),                # diagonal, descending: only sorted
      q @ np.diag([1.0, 1, 1, 2, 2, -3, -3, -3]) @ H(q),  # repeated eigenvalues
      q[:, :3] @ np.diag([5.0, -2, 1]) @ H(q[:, :3]),    # rank 3
      np.ones((n, n)),                               # rank 1
  ]
  a = np.stack(cases + [symmetric(rng, (n, n), wide(dtype))] * 3).astype(dtype)
  w, v, info = both_paths("eigh", eigh, a)[0]
  assert not info.any()
  check_eigh(a, w, v, dtype)
  # Nothing to rotate: the eigenvectors of a diagonal matrix are exact.
  np.testing.assert_array_equal(w[0], np.zeros(n))
  np.testing.assert_array_equal(v[1], np.eye(n, dtype=dtype))
  np.testing.assert_array_equal(w[2], np.arange(1.0, n + 1))
  np.testing.assert_array_equal(np.abs(v[2]), np.eye(n, dtype=dtype)[:, ::-1])


@pytest.mark.parametrize("dtype, magnitude", [
    (np.float32, 1e-30), (np.float32, 1e30), (np.float64, 1e-300), (np.float64, 1e300),
    (np.complex64, 1e-30), (np.complex64, 1e30), (np.complex128, 1e-300),
    (np.complex128, 1e300)])
def test_extreme_magnitudes_beside_ordinary_matrices(dtype, magnitude):
  # Each lane is scaled by its own power of two before its squares are
  # taken; the ordinary matrices in the same groups must not notice.
  rng = np.random.default_rng(4)
  n = 6
  a = symmetric(rng, (2 * lanes(dtype) + 3, n, n), wide(dtype))
  a[::3] *= magnitude
  a = a.astype(dtype)
  w, v, info = both_paths("eigh", eigh, a)[0]
  assert not info.any() and np.isfinite(w).all() and np.isfinite(v).all()
  ordinary = [i for i in range(len(a)) if i % 3]
  check_eigh(a[ordinary], w[ordinary], v[ordinary], dtype)
  tiny = a[::3].astype(wide(dtype)) / magnitude
  assert_close(w[::3] / magnitude, np.linalg.eigvalsh(tiny), dtype, scale_of(tiny))
  assert_close(H(v[::3]) @ v[::3], np.broadcast_to(np.eye(n), tiny.shape),
               dtype, n)


def awkward(rng, n, dtype):
  """Six Hermitian n x n matrices where the Jacobi sweeps branch: ordinary,
  a NaN, already diagonal, negated with zeros (-0 off the diagonal), all
  zero, and a repeated eigenvalue."""
  a = hermitian_pd(rng, (6,), n, dtype)
  a[1, n - 1, 0] = np.nan
  a[2] = np.diag(np.diagonal(a[2]))
  a[3] = -np.triu(np.tril(a[3], 1), -1)  # tridiagonal: -0 elsewhere
  a[4] = 0
  a[5] = np.eye(n) + 0 * a[5]
  a[5, 0, 0] = 2
  return a


@settings(max_examples=15, deadline=None)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(1, 49), lower=st.booleans(),
       vectors=st.booleans(), seed=st.integers(0, 2**16))
def test_a_lone_matrix_gets_the_bits_of_its_group(dtype, n, lower, vectors, seed):
  # A lane's sweeps are its own: alone in a padded group it gets the bits
  # it gets beside the batch's other matrices, however long they rotate
  # (and syevd's bits wherever the matrix lies, above the switch).
  a = awkward(np.random.default_rng(seed), n, dtype)
  for path in ("auto", "always"):
    with small_path("eigh", path):
      assert_alone_as_in_batch(lambda a: eigh(a, lower, vectors), (a,), f"n = {n}, {path}")


@SIDES
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_elements_give_nan_in_their_batch_element_only(lower, dtype, bad):
  a = symmetric(np.random.default_rng(5), (lanes(dtype) + 2, 8, 8), dtype)
  a[1, 4, 1] = a[1, 1, 4] = bad
  a[lanes(dtype), 0, 0] = bad
  w, v, info = both_paths("eigh", eigh, a, lower)[0]
  bad_elements = [1, lanes(dtype)]
  np.testing.assert_array_equal(info[bad_elements], NON_FINITE_INFO)
  assert np.isnan(w[bad_elements]).all() and np.isnan(v[bad_elements]).all()
  ok = [i for i in range(len(a)) if i not in bad_elements]
  assert not info[ok].any()
  check_eigh(a[ok], w[ok], v[ok], dtype)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_the_diagonals_imaginary_parts_are_ignored(dtype):
  # As LAPACK's heevd: a Hermitian matrix's diagonal is real, and whatever
  # imaginary part it holds is not read.
  rng = np.random.default_rng(6)
  a = symmetric(rng, (lanes(dtype) + 3, 7, 7), dtype)
  # Large ones, too: they must not set the lane's scale either.
  noise = random_array(rng, (len(a), 1, 7), np.float64) * np.where(np.arange(len(a)) % 2, 1,
                                                                  1e30)[:, None, None]
  noisy = (a + 1j * np.eye(7) * noise).astype(dtype)
  w, v, info = both_paths("eigh", eigh, noisy)[0]
  assert not info.any()
  check_eigh(a, w, v, dtype)
  np.testing.assert_array_equal(w, both_paths("eigh", eigh, a)[0][0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_linalg_eigh_and_its_gradient_through_the_interleaved_path(dtype):
  a = jnp.asarray(past_a_group(symmetric, dtype, (5, 5), seed=7)[1])
  w, v = bp.linalg.eigh(a)
  check_eigh(np.asarray(a), np.asarray(w), np.asarray(v), dtype)
  # Eigenvectors are defined up to sign; these losses are not.
  loss = lambda f: lambda a: (jnp.sum(jnp.sin(f(a)[0]))
                              + jnp.sum(jnp.abs(f(a)[1]) ** 2 * jnp.arange(5.0)))
  grad = jax.grad(loss(bp.linalg.eigh))(a)
  expected = jax.grad(loss(jnp.linalg.eigh))(a)
  assert_close(np.asarray(grad), np.asarray(expected), dtype, 1000)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_always_runs_the_interleaved_eigh_above_its_switch_point(dtype):
  n = largest(dtype) + 8
  a = symmetric(np.random.default_rng(8), (3, n, n), dtype)
  ours, theirs = both_paths("eigh", eigh, a)
  assert not ours[2].any()
  check_eigh(a, ours[0], ours[1], dtype)
  assert (ours[1] != theirs[1]).any()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), batch=st.integers(1, 20), lower=st.booleans(),
       grading=st.integers(0, 12), dtype=st.sampled_from([np.float64, np.complex128]),
       seed=st.integers(0, 2**32 - 1))
def test_graded_matrices_of_any_batch_and_size(n, batch, lower, grading, dtype, seed):
  # Rows and columns scaled by up to 2^grading apart: badly scaled, still
  # symmetric; the absolute accuracy of a backward-stable solver holds.
  rng = np.random.default_rng(seed)
  d = 2.0 ** rng.integers(0, grading + 1, n)
  a = symmetric(rng, (batch, n, n), dtype) * d[:, None] * d[None, :]
  with small_path("eigh", "always"):
    w, v, info = eigh(a, lower)
  assert not info.any()
  check_eigh(a, w, v, dtype)
