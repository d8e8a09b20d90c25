"""Shared helpers: argument checks and matrix utilities (jax ops only).

The JVP rules of ``_decompositions`` and ``_orthogonal`` build every
identity and diagonal at the rank of the arrays they meet (``eye_like``), so
they run under ``jax_numpy_rank_promotion='raise'`` (jax's test setting) and
on empty batches."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from batchpart._primitive import reshard_core_to_batch


class QRResult(NamedTuple):
  """Like jax.numpy.linalg's QRResult."""
  Q: jax.Array
  R: jax.Array


class EighResult(NamedTuple):
  """Like jax.numpy.linalg's EighResult."""
  eigenvalues: jax.Array
  eigenvectors: jax.Array


class PivotedQRResult(NamedTuple):
  """Column-pivoted QR: ``a[..., :, P] = Q @ R`` (jax.lax.linalg.qr's order)."""
  Q: jax.Array
  R: jax.Array
  P: jax.Array


class SVDResult(NamedTuple):
  """Like jax.numpy.linalg's SVDResult."""
  U: jax.Array
  S: jax.Array
  Vh: jax.Array


def as_inexact(fn: str, *operands: ArrayLike) -> list[jax.Array]:
  """jnp.linalg's promotion: integer and bool inputs become floating."""
  try:
    arrays = [jnp.asarray(a) for a in operands]
  except (TypeError, ValueError) as e:
    raise TypeError(f"batchpart.linalg.{fn}: operands must be numeric arrays: {e}") from e
  dtype = jnp.result_type(*arrays)
  if not jnp.issubdtype(dtype, jnp.inexact):
    dtype = jnp.result_type(dtype, float)  # jax's default float
  if dtype not in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128):
    # Other floating types (float16, bfloat16) are valid jax dtypes that LAPACK
    # lacks: jax's CPU lowering raises NotImplementedError for them, and so do we.
    error = NotImplementedError if jnp.issubdtype(dtype, jnp.inexact) else TypeError
    raise error(f"batchpart.linalg.{fn}: Unsupported dtype {np.dtype(dtype).name}; "
                "float32, float64, complex64 and complex128 are supported.")
  # Matrix dims sharded in Explicit mode: move their mesh axes onto the
  # batch dims first, as the kernels' result types do.
  return [reshard_core_to_batch(a.astype(dtype), min(a.ndim, 2)) for a in arrays]


def check_matrix(fn: str, name: str, a, *, square: bool = False):
  if a.ndim < 2:
    raise ValueError(f"batchpart.linalg.{fn}: {name} must have at least 2 dims, "
                     f"got shape {tuple(a.shape)}.")
  if square and a.shape[-1] != a.shape[-2]:
    raise ValueError(f"batchpart.linalg.{fn}: {name} must be square in its last two "
                     f"dims, got shape {tuple(a.shape)}.")


def mT(x):
  return jnp.swapaxes(x, -1, -2)


def H(x):
  return jnp.conj(mT(x))


def symmetrize(x):
  return (x + H(x)) / 2


def tril(x, k: int = 0):
  return jnp.tril(x, k)


def triu(x, k: int = 0):
  return jnp.triu(x, k)


def eye_like(x, n: int | None = None):
  """An identity of x's rank (leading dims of size 1), so that adding it to
  x needs no rank promotion (jax_numpy_rank_promotion='raise' forbids that)."""
  n = x.shape[-1] if n is None else n
  return jnp.eye(n, dtype=x.dtype).reshape((1,) * (x.ndim - 2) + (n, n))


def hermitian_from_triangle(x, lower: bool):
  """The Hermitian matrix whose `lower` (or upper) triangle is x's: what a
  LAPACK routine that reads one triangle sees."""
  strict = tril(x, -1) if lower else triu(x, 1)
  diagonal = jnp.real(jnp.diagonal(x, axis1=-2, axis2=-1)).astype(x.dtype)
  return strict + H(strict) + eye_like(x) * diagonal[..., None, :]


def matmul(a, b):
  return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def int_zeros(x):
  """The tangent of an integer output."""
  return np.zeros(np.shape(x), dtype=jax.dtypes.float0)
