"""Cholesky, LU and eigh over batchpart's LAPACK targets, with jax's
conventions, options and JVP rules (the same math as jax.lax.linalg's); QR
and SVD are in ``_orthogonal``."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from batchpart.linalg import _kernels, _tangent_solves
from batchpart.linalg._util import (
  EighResult,
  H,
  as_inexact,
  check_matrix,
  eye_like,
  hermitian_from_triangle,
  int_zeros,
  matmul,
  symmetrize,
  tril,
  triu,
)


def _tangent_trsm(a, b, *, left_side=False, lower=False, transpose_a=False,
                  conjugate_a=False, unit_diagonal=False):
  # jax.lax.linalg.triangular_solve's defaults, through batchpart's kernels.
  return _tangent_solves.triangular_solve(
      a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
      conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)


# ---- Cholesky -----------------------------------------------------------------

def cholesky(a: ArrayLike, *, lower: bool = True, symmetrize_input: bool = True) -> jax.Array:
  """Cholesky factor of Hermitian positive-definite matrices.

  Like :func:`jax.numpy.linalg.cholesky` (``upper = not lower``).

  Args:
    a: array of shape ``(..., n, n)``.
    lower: return the lower factor ``L`` (``a = L L^H``) or the upper ``L^H``.
    symmetrize_input: factor ``(a + a^H) / 2`` (True, as jax's default), or
      the Hermitian matrix given by ``a``'s lower triangle alone (False, as
      jax: the strict upper triangle is never read, whichever factor is
      returned). Derivatives follow what is read.

  Returns:
    The factor, ``(..., n, n)``; a batch element that is not positive definite
    is all NaN.

  Raises:
    ValueError: if ``a`` has fewer than 2 dims or is not square.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for floating dtypes LAPACK lacks (float16,
      bfloat16); float32, float64, complex64 and complex128 are supported
      (integer and bool inputs are promoted to jax's default float).
  """
  a, = as_inexact("cholesky", a)
  check_matrix("cholesky", "a", a, square=True)
  factor = _cholesky_lower(a, bool(symmetrize_input))
  return factor if lower else H(factor)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _cholesky_lower(a, symmetrize_input):
  # The kernel symmetrizes on each device: a transpose in jax would move the
  # other triangle across devices when a matrix dim is sharded.
  factor, _ = _kernels.potrf_hermitian(a, symmetrize=symmetrize_input)
  return factor


@_cholesky_lower.defjvp
def _cholesky_jvp(symmetrize_input, primals, tangents):
  a, = primals
  a_dot, = tangents
  # What the kernel factors: (a + a^H) / 2, or the Hermitian matrix of a's
  # lower triangle.
  a_dot = (symmetrize(a_dot) if symmetrize_input
           else hermitian_from_triangle(a_dot, lower=True))
  L = _cholesky_lower(a, symmetrize_input)
  # The Cholesky tangent: dL = L phi(L^-1 dA L^-H), phi = lower triangle with
  # the diagonal halved.
  tmp = _tangent_trsm(L, a_dot, left_side=False, transpose_a=True, conjugate_a=True,
                      lower=True)
  inner = _tangent_trsm(L, tmp, left_side=True, lower=True)
  phi = tril(inner) / (1 + eye_like(inner))
  return L, matmul(L, phi)


# ---- LU -----------------------------------------------------------------------

def lu(a: ArrayLike) -> tuple[jax.Array, jax.Array, jax.Array]:
  """LU decomposition with partial pivoting, as :func:`jax.lax.linalg.lu`.

  Args:
    a: array of shape ``(..., m, n)``.

  Returns:
    ``(lu, pivots, permutation)``: ``lu`` holds the unit-lower ``L`` below the
    diagonal and ``U`` on and above it; ``pivots`` ``(..., min(m, n))`` and
    ``permutation`` ``(..., m)`` are int32, with ``a[..., permutation, :] = L @ U``.

  Raises:
    ValueError: if ``a`` has fewer than 2 dims.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for floating dtypes LAPACK lacks (float16,
      bfloat16); float32, float64, complex64 and complex128 are supported
      (integer and bool inputs are promoted to jax's default float).
  """
  a, = as_inexact("lu", a)
  check_matrix("lu", "a", a)
  return _lu(a)


@jax.custom_jvp
def _lu(a):
  lu_, pivots, permutation, _ = _kernels.getrf(a)
  return lu_, pivots, permutation


@_lu.defjvp
def _lu_jvp(primals, tangents):
  a, = primals
  a_dot, = tangents
  lu_, pivots, permutation = _lu(a)
  *_, m, n = a.shape
  k = min(m, n)
  x = jnp.take_along_axis(a_dot, permutation[..., None], axis=-2)
  l = jnp.pad(tril(lu_[..., :, :k], -1), [(0, 0)] * (a.ndim - 1) + [(0, m - k)])
  l = l + eye_like(l, m)
  u_eye = jnp.pad(jnp.eye(n - k, dtype=a.dtype), ((k, 0), (k, 0)))
  u = jnp.pad(triu(lu_[..., :k, :]), [(0, 0)] * (a.ndim - 2) + [(0, n - k), (0, 0)])
  u = u + u_eye.reshape((1,) * (a.ndim - 2) + (n, n))
  la = _tangent_trsm(l, x, left_side=True, lower=True, unit_diagonal=True)
  lau = _tangent_trsm(u, la, left_side=False, lower=False)
  lu_dot = matmul(l, tril(lau, -1)) + matmul(triu(lau), u)
  return (lu_, pivots, permutation), (lu_dot[..., :m, :n], int_zeros(pivots),
                                      int_zeros(permutation))


# ---- eigh ---------------------------------------------------------------------

def eigh(a: ArrayLike, *, lower: bool = True, symmetrize_input: bool = True,
         sort_eigenvalues: bool = True, implementation: Any = None
         ) -> tuple[jax.Array, jax.Array]:
  """Eigenvalues and eigenvectors of Hermitian matrices, as
  :func:`jax.numpy.linalg.eigh` (``UPLO="L"`` for ``lower``) and
  :func:`jax.lax.linalg.eigh` (which returns them in the other order).

  Args:
    a: array of shape ``(..., n, n)``.
    lower: which triangle is read.
    symmetrize_input: decompose ``(a + a^H) / 2`` (True, jax's default), or
      the Hermitian matrix given by the ``lower`` (or upper) triangle alone
      (False: the other triangle is never read). Derivatives follow what is
      read.
    sort_eigenvalues: accepted for jax's signature; the eigenvalues come out
      ascending either way (jax allows any order when False).
    implementation: ``None`` or a ``jax.lax.linalg.EighImplementation``, as
      jax takes it on CPU: ``None`` and ``QR`` run LAPACK's syevd/heevd (on
      CPU, batches of small matrices run batchpart's interleaved Jacobi
      kernel instead, to the same accuracy), ``JACOBI`` and ``QDWH`` raise
      ``NotImplementedError`` as jax does there.

  Returns:
    ``EighResult(eigenvalues, eigenvectors)``: ``(..., n)`` real, ascending, and
    ``(..., n, n)`` with eigenvectors in columns. A batch element whose
    decomposition fails (e.g. non-finite input) is NaN.

  Raises:
    ValueError: if ``a`` has fewer than 2 dims or is not square, or
      ``implementation`` is not None or an ``EighImplementation``.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for ``JACOBI`` and ``QDWH`` (as jax on CPU), and for
      floating dtypes LAPACK lacks (float16, bfloat16); float32, float64,
      complex64 and complex128 are supported (integer and bool inputs are
      promoted to jax's default float).
  """
  del sort_eigenvalues  # always sorted
  _check_eigh_implementation(implementation)
  a, = as_inexact("eigh", a)
  check_matrix("eigh", "a", a, square=True)
  return EighResult(*_eigh(symmetrize(a) if symmetrize_input else a, bool(lower)))


def _check_eigh_implementation(implementation) -> None:
  """jax's CPU choices: syevd for None and QR; the others are not on CPU."""
  from jax.lax.linalg import EighImplementation
  if implementation is None or implementation == EighImplementation.QR:
    return
  if implementation == EighImplementation.JACOBI:
    raise NotImplementedError("batchpart.linalg.eigh: the Jacobi implementation is not "
                              "supported on CPU (as in jax.lax.linalg.eigh).")
  if implementation == EighImplementation.QDWH:
    raise NotImplementedError("batchpart.linalg.eigh: the QDWH implementation is only "
                              "supported on TPU (as in jax.lax.linalg.eigh).")
  raise ValueError("batchpart.linalg.eigh: implementation must be None or a "
                   f"jax.lax.linalg.EighImplementation, got {implementation!r}.")


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _eigh(a, lower):
  w, v, _ = _kernels.eigh(a, lower=lower)
  return w, v


@_eigh.defjvp
def _eigh_jvp(lower, primals, tangents):
  a, = primals
  a_dot, = tangents
  # Only the triangle the kernel reads varies.
  a_dot = hermitian_from_triangle(a_dot, lower)
  w_real, v = _eigh(a, lower)
  w = w_real.astype(a.dtype)
  eye = eye_like(a)
  # 1 / (w_j - w_i) off the diagonal, 0 on it, without dividing by zero.
  f = 1 / (eye + w[..., None, :] - w[..., :, None]) - eye
  vh_adot_v = matmul(matmul(H(v), a_dot), v)
  dv = matmul(v, f * vh_adot_v)
  dw = jnp.real(jnp.diagonal(vh_adot_v, axis1=-2, axis2=-1))
  return (w_real, v), (dw, dv)
