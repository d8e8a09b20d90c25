"""Triangular and general solves over batchpart's LAPACK targets, with
jax's conventions and JVP rules."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from batchpart.linalg import _kernels, _tangent_solves
from batchpart.linalg._util import (
  as_inexact,
  check_matrix,
  hermitian_from_triangle,
  matmul,
  mT,
  tril,
  triu,
)


def triangular_solve(a: ArrayLike, b: ArrayLike, *, left_side: bool = True, lower: bool = True,
                     transpose_a: bool = False, unit_diagonal: bool = False,
                     conjugate_a: bool = False) -> jax.Array:
  """Solves a triangular system, as :func:`jax.lax.linalg.triangular_solve`
  (whose defaults are ``left_side=False, lower=False``).

  Args:
    a: triangular matrices ``(..., m, m)``; the other triangle is not read.
    b: right-hand sides ``(..., m, n)`` if ``left_side`` else ``(..., n, m)``.
      The batch dims of ``a`` and ``b`` broadcast without being materialised.
      As in jax, ``b`` may have one dim fewer than ``a``, ``(..., m)`` with
      ``a``'s batch dims: one right-hand side per matrix (a column for
      ``left_side``, else a row). (A ``b`` of that rank that is not of that
      shape is a matrix with broadcast batch dims.)
    left_side: solve ``op(a) @ x = b`` (True) or ``x @ op(a) = b``.
    lower: whether ``a`` is lower (True) or upper triangular.
    transpose_a: ``op(a) = a^T`` (with ``conjugate_a``, ``a^H``).
    unit_diagonal: assume ones on the diagonal of ``a`` without reading it.
    conjugate_a: conjugate ``a`` (only meaningful with complex dtypes).

  Returns:
    ``x``, of ``b``'s core shape and the broadcast batch shape.

  Raises:
    ValueError: if ``a`` is not square or has fewer than 2 dims, or ``b``
      does not fit it.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for floating dtypes LAPACK lacks (float16,
      bfloat16); float32, float64, complex64 and complex128 are supported
      (integer and bool inputs are promoted to jax's default float).
  """
  a, b = as_inexact("triangular_solve", a, b)
  check_matrix("triangular_solve", "a", a, square=True)
  # jax.lax.linalg.triangular_solve's rule, where jax accepts it.
  vector = (b.ndim == a.ndim - 1 and tuple(b.shape[:-1]) == tuple(a.shape[:-2]) and
            b.shape[-1] == a.shape[-1])
  if vector:
    b = jnp.expand_dims(b, -1 if left_side else -2)
  check_matrix("triangular_solve", "b", b)
  m = a.shape[-1]
  if (b.shape[-2] if left_side else b.shape[-1]) != m:
    raise ValueError(
        f"batchpart.linalg.triangular_solve: b of shape "
        f"{tuple(b.shape[:-1] if left_side and vector else b.shape)} does not fit a "
        f"of shape {tuple(a.shape)} with left_side={left_side}.")
  options = (bool(left_side), bool(lower), bool(transpose_a), bool(conjugate_a),
             bool(unit_diagonal))
  x = _trsm(a, b, options)
  if vector:
    x = x[..., 0] if left_side else x[..., 0, :]
  return x


def _op(a, transpose_a, conjugate_a):
  if transpose_a:
    a = jnp.swapaxes(a, -1, -2)
  return jnp.conj(a) if conjugate_a else a


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _trsm(a, b, options):
  left_side, lower, transpose_a, conjugate_a, unit_diagonal = options
  return _kernels.trsm(a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
                       conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)


@_trsm.defjvp
def _trsm_jvp(options, primals, tangents):
  left_side, lower, transpose_a, conjugate_a, unit_diagonal = options
  a, b = primals
  a_dot, b_dot = tangents
  x = _trsm(a, b, options)
  # Only the triangle the kernel reads (without a unit diagonal) varies.
  a_dot = tril(a_dot, -1 if unit_diagonal else 0) if lower else \
      triu(a_dot, 1 if unit_diagonal else 0)
  op_a_dot = _op(a_dot, transpose_a, conjugate_a)
  rhs = b_dot - (matmul(op_a_dot, x) if left_side else matmul(x, op_a_dot))
  x_dot = _tangent_solves.triangular_solve(
      a, rhs, left_side=left_side, lower=lower, transpose_a=transpose_a,
      conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)
  return x, x_dot


_ASSUME_A = ("gen", "sym", "her", "pos")


def solve(a: ArrayLike, b: ArrayLike, *, assume_a: str = "gen", lower: bool = False
          ) -> jax.Array:
  """Solves ``a @ x = b``, as :func:`jax.numpy.linalg.solve` (shapes) and
  :func:`jax.scipy.linalg.solve` (``assume_a``, ``lower``).

  Args:
    a: ``(..., n, n)``.
    b: ``(n,)``, or ``(..., n, k)``; batch dims broadcast against ``a``'s.
    assume_a: ``"gen"`` (LU, getrf + getrs, reads all of ``a``); ``"pos"``
      (Hermitian positive definite: Cholesky, potrf + potrs, CPU only);
      ``"sym"`` / ``"her"`` (symmetric / Hermitian: LU of the matrix that
      the ``lower`` triangle defines, so the result is scipy's; jax reads all
      of ``a`` instead, which agrees whenever ``a`` is what it claims).
    lower: for ``assume_a != "gen"``, read the lower (True) or upper (False,
      scipy's default) triangle of ``a`` only.

  Returns:
    ``x`` of shape ``(..., n)`` for a vector ``b``, else ``(..., n, k)``. A batch
    element whose ``a`` is singular (or, for ``"pos"``, not positive definite)
    is all NaN.

  Raises:
    ValueError: if ``assume_a`` is not one of the values above, ``a`` is not
      square or has fewer than 2 dims, or ``b`` does not fit it.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for floating dtypes LAPACK lacks (float16,
      bfloat16); float32, float64, complex64 and complex128 are supported
      (integer and bool inputs are promoted to jax's default float), and
      for ``assume_a="pos"`` off CPU (a CPU-only LAPACK target).
  """
  if assume_a not in _ASSUME_A:
    raise ValueError(f"batchpart.linalg.solve: assume_a must be one of "
                     f"{', '.join(map(repr, _ASSUME_A))}, got {assume_a!r}.")
  a, b = as_inexact("solve", a, b)
  check_matrix("solve", "a", a, square=True)
  n = a.shape[-1]
  vector = b.ndim == 1
  if vector:
    if b.shape[0] != n:
      raise ValueError(f"batchpart.linalg.solve: b of shape {tuple(b.shape)} does not fit "
                       f"a of shape {tuple(a.shape)}.")
    b = b[:, None]
  elif b.shape[-2] != n:
    raise ValueError(f"batchpart.linalg.solve: b of shape {tuple(b.shape)} does not fit "
                     f"a of shape {tuple(a.shape)}; b is (n,) or (..., n, k).")
  if assume_a == "pos":
    _kernels.require_cpu("solve", "assume_a='pos'", "batchpart_posv", a, b)
    x = _posv(a, b, bool(lower))
  else:
    if assume_a == "her":
      a = hermitian_from_triangle(a, bool(lower))
    elif assume_a == "sym":
      strict = tril(a, -1) if lower else triu(a, 1)
      a = strict + mT(strict) + (a - tril(a, -1) - triu(a, 1))
    x = _solve(a, b)
  return x[..., 0] if vector else x


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _posv(a, b, lower):
  x, _ = _kernels.posv(a, b, lower=lower)
  return x


@_posv.defjvp
def _posv_jvp(lower, primals, tangents):
  a, b = primals
  a_dot, b_dot = tangents
  x = _posv(a, b, lower)
  # The kernel reads one triangle of a: only it varies.
  a_dot = hermitian_from_triangle(a_dot, lower)
  return x, _tangent_solves.cholesky_solve(a, b_dot - matmul(a_dot, x), lower=lower)


@jax.custom_jvp
def _solve(a, b):
  x, _ = _kernels.gesv(a, b)
  return x


@_solve.defjvp
def _solve_jvp(primals, tangents):
  a, b = primals
  a_dot, b_dot = tangents
  x = _solve(a, b)
  return x, _tangent_solves.solve(a, b_dot - matmul(a_dot, x))
