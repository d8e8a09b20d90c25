"""Linear solves for the tangent maps of the JVP rules, through batchpart's
own kernels.

Reverse mode transposes a JVP's tangent map, so its solves must be
transposable: ``lax.custom_linear_solve`` provides that, given the linear
map and solvers for it and for its transpose. jax's own solves would do too,
but they call jaxlib's CPU kernels, which can deadlock XLA's thread pool on
several CPU devices (docs/reliability.md); batchpart's cannot.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from batchpart.linalg import _kernels
from batchpart.linalg._util import eye_like, hermitian_from_triangle, matmul, mT, tril, triu


def triangular_solve(a, b, *, left_side: bool, lower: bool, transpose_a: bool = False,
                     conjugate_a: bool = False, unit_diagonal: bool = False):
  """Solves op(a) x = b (left) or x op(a) = b, transposably."""
  tri = tril(a) if lower else triu(a)
  if unit_diagonal:
    eye = eye_like(a)
    tri = tri * (1 - eye) + eye
  op = mT(tri) if transpose_a else tri
  op = jnp.conj(op) if conjugate_a else op
  matvec = (lambda x: matmul(op, x)) if left_side else (lambda x: matmul(x, op))

  def solve_with(transposed: bool):
    # The linear transpose of x -> op(a) x is y -> op(a)^T y: flip the
    # transpose, keep the conjugation.
    return lambda _, rhs: _kernels.trsm(
        a, rhs, left_side=left_side, lower=lower, transpose_a=transpose_a != transposed,
        conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)

  return lax.custom_linear_solve(matvec, b, solve_with(False), solve_with(True))


def solve(a, b):
  """Solves a x = b for (..., n, k) right-hand sides, transposably."""
  return lax.custom_linear_solve(
      lambda x: matmul(a, x), b,
      lambda _, rhs: _kernels.gesv(a, rhs)[0],
      lambda _, rhs: _kernels.gesv(mT(a), rhs)[0])


def cholesky_solve(a, b, *, lower: bool):
  """Solves h x = b transposably, h the Hermitian positive-definite matrix
  given by a's `lower` (or upper) triangle."""
  h = hermitian_from_triangle(a, lower)
  # h^T = conj(h): solve the transposed system through conjugates.
  return lax.custom_linear_solve(
      lambda x: matmul(h, x), b,
      lambda _, rhs: _kernels.posv(a, rhs, lower=lower)[0],
      lambda _, rhs: jnp.conj(_kernels.posv(a, jnp.conj(rhs), lower=lower)[0]))
