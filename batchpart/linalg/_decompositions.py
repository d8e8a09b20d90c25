"""Cholesky, LU, QR, eigh and SVD over batchpart's LAPACK targets, with
jax's conventions and JVP rules (the same math as jax.lax.linalg's)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from batchpart.linalg import _kernels, _tangent_solves
from batchpart.linalg._util import (
    EighResult, QRResult, SVDResult, H, as_inexact, check_matrix, eye_like, int_zeros, matmul, mT, symmetrize, tril, triu)


def _tangent_trsm(a, b, *, left_side=False, lower=False, transpose_a=False,
                  conjugate_a=False, unit_diagonal=False):
  # jax.lax.linalg.triangular_solve's defaults, through batchpart's kernels.
  return _tangent_solves.triangular_solve(
      a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
      conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)


# ---- Cholesky -----------------------------------------------------------------

def cholesky(a, *, lower: bool = True):
  """Cholesky factor of Hermitian positive-definite matrices.

  Like :func:`jax.numpy.linalg.cholesky` (``upper = not lower``): the input is
  symmetrized, ``(a + a^H) / 2``, and only its factor is returned.

  Args:
    a: array of shape ``(..., n, n)``.
    lower: return the lower factor ``L`` (``a = L L^H``) or the upper ``L^H``.

  Returns:
    The factor, ``(..., n, n)``; a batch element that is not positive definite
    is all NaN.
  """
  a, = as_inexact("cholesky", a)
  check_matrix("cholesky", "a", a, square=True)
  factor = _cholesky_lower(symmetrize(a))
  return factor if lower else H(factor)


@jax.custom_jvp
def _cholesky_lower(a):  # `a` is Hermitian (symmetrized by the caller)
  factor, _ = _kernels.potrf_hermitian(a)
  return factor


@_cholesky_lower.defjvp
def _cholesky_jvp(primals, tangents):
  a, = primals
  a_dot, = tangents
  L = _cholesky_lower(a)
  # Murray 2016 (arXiv:1602.07527): dL = L phi(L^-1 dA L^-H).
  tmp = _tangent_trsm(L, a_dot, left_side=False, transpose_a=True, conjugate_a=True,
                      lower=True)
  inner = _tangent_trsm(L, tmp, left_side=True, lower=True)
  phi = tril(inner) / (1 + eye_like(inner))
  return L, matmul(L, phi)


# ---- LU -----------------------------------------------------------------------

def lu(a):
  """LU decomposition with partial pivoting, as :func:`jax.lax.linalg.lu`.

  Args:
    a: array of shape ``(..., m, n)``.

  Returns:
    ``(lu, pivots, permutation)``: ``lu`` holds the unit-lower ``L`` below the
    diagonal and ``U`` on and above it; ``pivots`` ``(..., min(m, n))`` and
    ``permutation`` ``(..., m)`` are int32, with ``a[..., permutation, :] = L @ U``.
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
  u = jnp.pad(triu(lu_[..., :k, :]), [(0, 0)] * (a.ndim - 2) + [(0, n - k), (0, 0)]) + u_eye
  la = _tangent_trsm(l, x, left_side=True, lower=True, unit_diagonal=True)
  lau = _tangent_trsm(u, la, left_side=False, lower=False)
  lu_dot = matmul(l, tril(lau, -1)) + matmul(triu(lau), u)
  return (lu_, pivots, permutation), (lu_dot[..., :m, :n], int_zeros(pivots),
                                      int_zeros(permutation))


# ---- QR -----------------------------------------------------------------------

def qr(a, *, mode: str = "reduced"):
  """QR decomposition, as :func:`jax.numpy.linalg.qr`.

  Args:
    a: array of shape ``(..., m, n)``.
    mode: ``"reduced"`` (``q`` is ``(..., m, k)``, ``r`` ``(..., k, n)``,
      ``k = min(m, n)``), ``"complete"`` (``q`` ``(..., m, m)``, ``r``
      ``(..., m, n)``) or ``"r"`` (only ``r``, reduced).

  Returns:
    ``QRResult(Q, R)`` (a named tuple), or ``r`` for ``mode="r"``.
  """
  if mode not in ("reduced", "complete", "r"):
    raise ValueError(f"batchpart.linalg.qr: mode must be 'reduced', 'complete' or 'r', "
                     f"got {mode!r}.")
  a, = as_inexact("qr", a)
  check_matrix("qr", "a", a)
  q, r = _qr(a, mode == "complete")
  return r if mode == "r" else QRResult(q, r)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _qr(a, full_matrices):
  return _kernels.qr(a, full_matrices=full_matrices)


@_qr.defjvp
def _qr_jvp(full_matrices, primals, tangents):
  a, = primals
  a_dot, = tangents
  q, r = _qr(a, full_matrices)
  *_, m, n = a.shape
  if m < n or (full_matrices and m != n):
    raise NotImplementedError(
        "batchpart.linalg.qr: the derivative is defined for m >= n (and, with "
        "mode='complete', square matrices), as in jax.")
  # Townsend, "Differentiating the QR decomposition".
  dx_rinv = _tangent_trsm(r, a_dot)  # right side: X r = dA
  qt_dx_rinv = matmul(H(q), dx_rinv)
  lower = tril(qt_dx_rinv, -1)
  do = lower - H(lower)
  do = do + eye_like(do, n) * (qt_dx_rinv - qt_dx_rinv.real.astype(qt_dx_rinv.dtype))
  dq = matmul(q, do - qt_dx_rinv) + dx_rinv
  dr = matmul(qt_dx_rinv - do, r)
  return (q, r), (dq, dr)


# ---- eigh ---------------------------------------------------------------------

def eigh(a, *, lower: bool = True):
  """Eigenvalues and eigenvectors of Hermitian matrices, as
  :func:`jax.numpy.linalg.eigh` (``UPLO="L"`` for ``lower``).

  Args:
    a: array of shape ``(..., n, n)``; it is symmetrized first, as jax does.
    lower: which triangle the kernel reads (after symmetrization both agree).

  Returns:
    ``EighResult(eigenvalues, eigenvectors)``: ``(..., n)`` real, ascending, and
    ``(..., n, n)`` with eigenvectors in columns. A batch element whose
    decomposition fails (e.g. non-finite input) is NaN.
  """
  a, = as_inexact("eigh", a)
  check_matrix("eigh", "a", a, square=True)
  return EighResult(*_eigh(symmetrize(a), bool(lower)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _eigh(a, lower):
  w, v, _ = _kernels.eigh(a, lower=lower)
  return w, v


@_eigh.defjvp
def _eigh_jvp(lower, primals, tangents):
  a, = primals
  a_dot, = tangents
  w_real, v = _eigh(a, lower)
  w = w_real.astype(a.dtype)
  eye = eye_like(a)
  # 1 / (w_j - w_i) off the diagonal, 0 on it, without dividing by zero.
  f = 1 / (eye + w[..., None, :] - w[..., :, None]) - eye
  vh_adot_v = matmul(matmul(H(v), a_dot), v)
  dv = matmul(v, f * vh_adot_v)
  dw = jnp.real(jnp.diagonal(vh_adot_v, axis1=-2, axis2=-1))
  return (w_real, v), (dw, dv)


# ---- SVD ----------------------------------------------------------------------

def svd(a, *, full_matrices: bool = False, compute_uv: bool = True):
  """Singular value decomposition, as :func:`jax.numpy.linalg.svd` (whose
  ``full_matrices`` default is ``True``; batchpart's is ``False``).

  Args:
    a: array of shape ``(..., m, n)``.
    full_matrices: ``u`` ``(..., m, m)`` and ``vh`` ``(..., n, n)`` instead of
      ``(..., m, k)`` and ``(..., k, n)``, ``k = min(m, n)``.
    compute_uv: return ``(u, s, vh)``, or only ``s``.

  Returns:
    ``SVDResult(U, S, Vh)`` with ``a = U @ diag(S) @ Vh``, ``S`` real, descending;
    or ``s``. A batch element whose decomposition fails is NaN.
  """
  a, = as_inexact("svd", a)
  check_matrix("svd", "a", a)
  if not compute_uv:
    return _singular_values(a)
  return SVDResult(*_svd(a, bool(full_matrices)))


@jax.custom_jvp
def _singular_values(a):
  s, _, _, _ = _kernels.svd(a, full_matrices=False, compute_uv=False)
  return s


@_singular_values.defjvp
def _singular_values_jvp(primals, tangents):
  a, = primals
  a_dot, = tangents
  u, s, vh = _svd(a, False)
  ds = jnp.real(jnp.diagonal(matmul(matmul(H(u), a_dot), H(vh)), axis1=-2, axis2=-1))
  return s, ds


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _svd(a, full_matrices):
  s, u, vt, _ = _kernels.svd(a, full_matrices=full_matrices, compute_uv=True)
  return u, s, vt


@_svd.defjvp
def _svd_jvp(full_matrices, primals, tangents):
  a, = primals
  a_dot, = tangents
  if full_matrices and a.shape[-1] != a.shape[-2]:
    raise NotImplementedError(
        "batchpart.linalg.svd: the derivative with full_matrices=True is defined for "
        "square matrices only, as in jax.")
  u, s, vt = _svd(a, full_matrices)
  ut, v = H(u), H(vt)
  s_row = s[..., None, :]
  ds_mat = matmul(matmul(ut, a_dot), v)
  ds = jnp.real(jnp.diagonal(ds_mat, axis1=-2, axis2=-1))
  k = s.shape[-1]
  eye = jnp.eye(k, dtype=s.dtype)
  s_diffs = (s_row + mT(s_row)) * (s_row - mT(s_row))
  f = (1 / (s_diffs + eye) - eye).astype(a.dtype)
  dss = s_row.astype(a.dtype) * ds_mat
  sds = mT(s_row).astype(a.dtype) * ds_mat
  s_zero = (s == 0).astype(s.dtype)
  s_inv = 1 / (s + s_zero) - s_zero
  du_dv_diag = 0.5 * (ds_mat - H(ds_mat)) * (s_inv[..., None, :] * eye).astype(a.dtype)
  du = matmul(u, f * (dss + H(dss)) + du_dv_diag)
  dv = matmul(v, f * (sds + H(sds)))
  m, n = a.shape[-2:]
  if m > n:
    dav = matmul(a_dot, v)
    du = du + (dav - matmul(u, matmul(ut, dav))) / s_row.astype(a.dtype)
  if n > m:
    dahu = matmul(H(a_dot), u)
    dv = dv + (dahu - matmul(v, matmul(vt, dahu))) / s_row.astype(a.dtype)
  return (u, s, vt), (du, ds, H(dv))
