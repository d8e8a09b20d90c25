"""QR and SVD over batchpart's LAPACK targets, with jax's conventions,
options and JVP rules (the same math as jax.lax.linalg's)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from batchpart.linalg import _kernels, _tangent_solves
from batchpart.linalg._decompositions import eigh
from batchpart.linalg._util import (
  H,
  PivotedQRResult,
  QRResult,
  SVDResult,
  as_inexact,
  check_matrix,
  eye_like,
  int_zeros,
  matmul,
  mT,
  tril,
)

# ---- QR -----------------------------------------------------------------------

_QR_MODES = ("reduced", "complete", "r", "raw", "full")


def qr(a: ArrayLike, *, mode: str = "reduced", pivoting: bool = False) -> Any:
  """QR decomposition, as :func:`jax.numpy.linalg.qr` (modes) and
  :func:`jax.lax.linalg.qr` (``pivoting``).

  Args:
    a: array of shape ``(..., m, n)``.
    mode: jnp's modes: ``"reduced"`` (``q`` is ``(..., m, k)``, ``r``
      ``(..., k, n)``, ``k = min(m, n)``), ``"complete"`` (``q`` ``(..., m, m)``,
      ``r`` ``(..., m, n)``), ``"r"`` (only ``r``, reduced), ``"full"`` (numpy's
      old name, the same as ``"reduced"``, as in jnp), or ``"raw"`` (LAPACK's
      geqrf output ``(h, tau)``: ``h`` ``(..., n, m)`` holds ``R`` and the
      Householder reflectors, transposed as numpy returns them; not
      differentiable, as in jax).
    pivoting: column-pivoted QR (LAPACK geqp3): ``a[..., :, p] = q @ r`` with
      ``|diag(r)|`` non-increasing. Not with ``mode="raw"``.

  Returns:
    ``QRResult(Q, R)`` (a named tuple), ``r`` for ``mode="r"``, ``(h, tau)`` for
    ``"raw"``; with ``pivoting``, ``PivotedQRResult(Q, R, P)`` or ``(r, p)``,
    ``p`` int32 ``(..., n)``.

  Raises:
    ValueError: if ``mode`` is not one of the modes above, or ``a`` has fewer
      than 2 dims.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for ``mode="raw"`` with ``pivoting``, for
      derivatives of ``mode="raw"``, for ``mode="raw"`` or ``pivoting`` off
      CPU (CPU-only LAPACK targets), and for floating dtypes LAPACK lacks
      (float16, bfloat16).
  """
  if mode not in _QR_MODES:
    raise ValueError(f"batchpart.linalg.qr: mode must be one of {', '.join(map(repr, _QR_MODES))}"
                     f", got {mode!r}.")
  a, = as_inexact("qr", a)
  check_matrix("qr", "a", a)
  if mode == "raw":
    if pivoting:
      raise NotImplementedError("batchpart.linalg.qr: mode='raw' with pivoting=True is not "
                                "supported (nor in jax).")
    _kernels.require_cpu("qr", "mode='raw'", "batchpart_geqrf", a)
    h, tau = _qr_raw(a)
    return QRResult(mT(h), tau)
  full_matrices = mode == "complete"
  if pivoting:
    _kernels.require_cpu("qr", "pivoting=True", "batchpart_geqp3", a)
    q, r, p = _pivoted_qr(a, full_matrices)
    return (r, p) if mode == "r" else PivotedQRResult(q, r, p)
  q, r = _qr(a, full_matrices)
  return r if mode == "r" else QRResult(q, r)


@jax.custom_jvp
def _qr_raw(a):
  return tuple(_kernels.geqrf(a))


@_qr_raw.defjvp
def _qr_raw_jvp(primals, tangents):
  raise NotImplementedError("batchpart.linalg.qr: mode='raw' is not differentiable (neither is "
                            "jax's); differentiate mode='reduced' or 'complete'.")


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _qr(a, full_matrices):
  return _kernels.qr(a, full_matrices=full_matrices)


@_qr.defjvp
def _qr_jvp(full_matrices, primals, tangents):
  a, = primals
  a_dot, = tangents
  q, r = _qr(a, full_matrices)
  return (q, r), _qr_tangents(a, a_dot, q, r, full_matrices)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _pivoted_qr(a, full_matrices):
  return tuple(_kernels.geqp3(a, full_matrices=full_matrices))  # the JVP's structure


@_pivoted_qr.defjvp
def _pivoted_qr_jvp(full_matrices, primals, tangents):
  a, = primals
  a_dot, = tangents
  q, r, p = _pivoted_qr(a, full_matrices)
  # The permutation is locally constant: differentiate the QR of a[..., p].
  permute = lambda x: jnp.take_along_axis(x, p[..., None, :], axis=-1)
  dq, dr = _qr_tangents(permute(a), permute(a_dot), q, r, full_matrices)
  return (q, r, p), (dq, dr, int_zeros(p))


def _thin_qr_jvp(q, r, dx):
  """Tangents of q (m, n) and r (n, n) for an (m, n) input, m >= n
  (the standard QR tangent, as jax.lax.linalg's)."""
  dx_rinv = _tangent_solves.triangular_solve(r, dx, left_side=False, lower=False)  # X r = dA
  qt_dx_rinv = matmul(H(q), dx_rinv)
  lower = tril(qt_dx_rinv, -1)
  do = lower - H(lower)  # skew-Hermitian
  # Complex inputs: the diagonal's imaginary part.
  do = do + eye_like(do) * (qt_dx_rinv - qt_dx_rinv.real.astype(qt_dx_rinv.dtype))
  dq = matmul(q, do - qt_dx_rinv) + dx_rinv
  dr = matmul(qt_dx_rinv - do, r)
  return dq, dr


def _qr_tangents(x, dx, q, r, full_matrices):
  """(dq, dr) for x = q r, every shape jax differentiates."""
  *batch, m, n = x.shape
  if m < n:
    # Wide: x = [x1 x2] with x1 square, x1 = q r1 and r2 = q^H x2, so
    # dr2 = dq^H x2 + q^H dx2.
    dq, dr1 = _thin_qr_jvp(q, r[..., :, :m], dx[..., :, :m])
    dr2 = matmul(H(dq), x[..., :, m:]) + matmul(H(q), dx[..., :, m:])
    return dq, jnp.concatenate([dr1, dr2], axis=-1)
  q_mn = q[..., :, :n] if full_matrices else q
  r_nn = r[..., :n, :n] if full_matrices else r
  dq_mn, dr_nn = _thin_qr_jvp(q_mn, r_nn, dx)
  if not full_matrices or m == n:
    return dq_mn, dr_nn
  # Tall and complete: the last m - n columns of q span the orthogonal
  # complement; their tangent is dq_mp = dq_mn Z^H - (q_mn + q_mp Z)(dq_pn - Z dq_nn)^H with
  # Z = q_pn (q_nn - I)^-1.
  q_nn, q_pn, q_mp = q_mn[..., :n, :], q_mn[..., n:, :], q[..., :, n:]
  dq_nn, dq_pn = dq_mn[..., :n, :], dq_mn[..., n:, :]
  z_h = _tangent_solves.solve(H(q_nn - eye_like(q_nn)), H(q_pn))
  z = H(z_h)
  dq_mp = matmul(dq_mn, z_h) - matmul(q_mn + matmul(q_mp, z), H(dq_pn - matmul(z, dq_nn)))
  dq = jnp.concatenate([dq_mn, dq_mp], axis=-1)
  dr = jnp.concatenate([dr_nn, jnp.zeros((*batch, m - n, n), dr_nn.dtype)], axis=-2)
  return dq, dr


# ---- SVD ----------------------------------------------------------------------

def svd(a: ArrayLike, *, full_matrices: bool = False, compute_uv: bool = True,
        hermitian: bool = False, algorithm: Any = None) -> Any:
  """Singular value decomposition, as :func:`jax.numpy.linalg.svd` (whose
  ``full_matrices`` default is ``True``; batchpart's is ``False``) and
  :func:`jax.lax.linalg.svd` (``algorithm``).

  Args:
    a: array of shape ``(..., m, n)``.
    full_matrices: ``u`` ``(..., m, m)`` and ``vh`` ``(..., n, n)`` instead of
      ``(..., m, k)`` and ``(..., k, n)``, ``k = min(m, n)``.
    compute_uv: return ``(u, s, vh)``, or only ``s``.
    hermitian: ``a`` is Hermitian (it is symmetrized): the SVD comes from
      :func:`eigh`, as in jnp (``s = |w|`` sorted descending).
    algorithm: ``None``, ``jax.lax.linalg.SvdAlgorithm.DEFAULT`` or
      ``DIVIDE_AND_CONQUER`` (LAPACK gesdd), or ``QR`` (gesvd, CPU only).
      ``JACOBI`` and ``POLAR`` raise ``NotImplementedError``, as jax does on CPU.

  Returns:
    ``SVDResult(U, S, Vh)`` with ``a = U @ diag(S) @ Vh``, ``S`` real, descending;
    or ``s``. A batch element whose decomposition fails is NaN.

  Raises:
    ValueError: if ``a`` has fewer than 2 dims (or, with ``hermitian``, is
      not square), or ``algorithm`` is not None or an ``SvdAlgorithm``.
    TypeError: for operands that are not numeric arrays.
    NotImplementedError: for ``JACOBI`` and ``POLAR``, for ``algorithm``
      with ``hermitian=True``, for ``QR`` off CPU, for the derivative with
      ``full_matrices=True`` of a non-square matrix (as jax), and for
      floating dtypes LAPACK lacks (float16, bfloat16).
  """
  a, = as_inexact("svd", a)
  check_matrix("svd", "a", a, square=bool(hermitian))
  if hermitian:
    if algorithm is not None:
      raise NotImplementedError("batchpart.linalg.svd: algorithm applies to hermitian=False "
                                "only (hermitian=True goes through eigh, as in jnp).")
    return _hermitian_svd(a, bool(compute_uv))
  gesvd = _uses_gesvd(algorithm)
  if gesvd:
    _kernels.require_cpu("svd", "algorithm=SvdAlgorithm.QR", "batchpart_gesvd", a)
  if not compute_uv:
    return _singular_values(a, gesvd)
  return SVDResult(*_svd(a, bool(full_matrices), gesvd))


def _uses_gesvd(algorithm) -> bool:
  """Whether `algorithm` selects gesvd (True) or gesdd (False)."""
  from jax.lax.linalg import SvdAlgorithm
  if algorithm is None or algorithm in (SvdAlgorithm.DEFAULT, SvdAlgorithm.DIVIDE_AND_CONQUER):
    return False
  if algorithm == SvdAlgorithm.QR:
    return True
  if isinstance(algorithm, SvdAlgorithm):
    raise NotImplementedError(
        f"batchpart.linalg.svd: algorithm={algorithm} is not implemented on CPU; LAPACK offers "
        "DIVIDE_AND_CONQUER (gesdd, the default) and QR (gesvd).")
  raise ValueError(f"batchpart.linalg.svd: algorithm must be None or a "
                   f"jax.lax.linalg.SvdAlgorithm, got {algorithm!r}.")


def _hermitian_svd(a, compute_uv):
  w, v = eigh(a)
  s = jnp.abs(w)
  order = jnp.flip(jnp.argsort(s, axis=-1, stable=True), axis=-1)
  s = jnp.take_along_axis(s, order, axis=-1)
  if not compute_uv:
    return s
  sign = jnp.take_along_axis(jnp.sign(w), order, axis=-1)
  u = jnp.take_along_axis(v, order[..., None, :], axis=-1)
  return SVDResult(u, s, H(u * sign[..., None, :].astype(u.dtype)))


def _svd_kernel(gesvd):
  return _kernels.gesvd if gesvd else _kernels.svd


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _singular_values(a, gesvd):
  s, _, _, _ = _svd_kernel(gesvd)(a, full_matrices=False, compute_uv=False)
  return s


@_singular_values.defjvp
def _singular_values_jvp(gesvd, primals, tangents):
  a, = primals
  a_dot, = tangents
  u, s, vh = _svd(a, False, gesvd)
  ds = jnp.real(jnp.diagonal(matmul(matmul(H(u), a_dot), H(vh)), axis1=-2, axis2=-1))
  return s, ds


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _svd(a, full_matrices, gesvd):
  s, u, vt, _ = _svd_kernel(gesvd)(a, full_matrices=full_matrices, compute_uv=True)
  return u, s, vt


@_svd.defjvp
def _svd_jvp(full_matrices, gesvd, primals, tangents):
  a, = primals
  a_dot, = tangents
  if full_matrices and a.shape[-1] != a.shape[-2]:
    raise NotImplementedError(
        "batchpart.linalg.svd: the derivative with full_matrices=True is defined for "
        "square matrices only, as in jax.")
  u, s, vt = _svd(a, full_matrices, gesvd)
  ut, v = H(u), H(vt)
  s_row = s[..., None, :]
  ds_mat = matmul(matmul(ut, a_dot), v)
  ds = jnp.real(jnp.diagonal(ds_mat, axis1=-2, axis2=-1))
  k = s.shape[-1]
  eye = eye_like(s_row, k)
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
