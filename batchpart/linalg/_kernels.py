"""Thin calls of batchpart's LAPACK targets (cc/lapack/kernels.h) through
``batchpart.ffi_call``: signatures, layouts (column-major, or the CPU's
row-major twins of getrf, gesv, trsm and qr), attributes.

Every function here is a single batch-partitionable custom call; the public
functions in this package add jax's conventions and derivatives.
"""

from __future__ import annotations

import threading

import jax
import numpy as np

from batchpart import _core, _cusolver_targets, _lapack_targets
from batchpart._frontend.ffi_call import ffi_call
from batchpart._frontend.signature import parse_signature

_registered = False
_lock = threading.Lock()


def ensure_registered() -> None:
  global _registered
  if _registered:
    return
  with _lock:
    if not _registered:
      _lapack_targets.register()
      _cusolver_targets.register()  # same names for "CUDA", if built and a GPU is present
      _registered = True


def _layout(shape, core_rank: int):
  """Column-major matrices (cc/lapack/kernels.h); vectors as they are."""
  return _lapack_targets.column_major(shape) if core_rank >= 2 else None


def _call(target, signature, operands, results, *, aliases=None, **attributes):
  ensure_registered()
  parsed = parse_signature(signature, owner=f"batchpart.linalg ('{target}')")
  single = not isinstance(results, (list, tuple))
  out_layouts = [_layout(r.shape, len(c))
                 for r, c in zip([results] if single else results, parsed.outputs)]
  return ffi_call(
      target, results, signature=signature,
      input_layouts=[_layout(np.shape(x), len(c)) for x, c in zip(operands, parsed.inputs)],
      output_layouts=out_layouts[0] if single else out_layouts,
      input_output_aliases=aliases,
  )(*operands, **attributes)


def _real(dtype):
  return np.finfo(dtype).dtype


S = jax.ShapeDtypeStruct
i32 = np.int32


def potrf_hermitian(a, *, symmetrize: bool = False):
  """Lower Cholesky factor of Hermitian `a` (of ``(a + a^H) / 2`` with
  ``symmetrize``, computed by the kernel on each device), without relayouts.

  A row-major Hermitian A is, read column-major, A^T = conj(A). Factoring
  that as U^H U (upper) and reading U back row-major gives U^T, and
  A = U^T conj(U) = L L^H with L = U^T: the lower factor, with no transpose
  on either side of the kernel. Only valid for Hermitian input.
  """
  *batch, n, _ = a.shape
  ensure_registered()
  # LAPACK factors in place, so the result takes the operand's buffer (XLA
  # copies it first unless the operand is dead after the call). The small-matrix
  # kernel reads the operand and writes the result anyway: there the alias
  # would only add XLA's copy.
  aliases = None if n <= _core.lapack.small_cholesky_limits()[0] else {0: 0}
  return ffi_call(
      "batchpart_potrf", [S(a.shape, a.dtype), S(tuple(batch), i32)],
      signature="(n,n)->(n,n),()", input_output_aliases=aliases)(
          a, lower=False, symmetrize=bool(symmetrize))


def _row_major_on_cpu(target, signature, operands, results, *, aliases=None,
                      row_major_aliases=..., **attributes):
  """`target` where jax's platform is not CPU; on CPU its row-major twin
  (``<target>_row_major``), which needs no relayout on either side. A program
  traced for another platform than it runs on still gets a correct kernel:
  the column-major target exists everywhere, and the row-major one on a GPU
  fails to compile, naming it."""
  if _platform_of(operands) != "cpu":
    return _call(target, signature, operands, results, aliases=aliases, **attributes)
  ensure_registered()
  if row_major_aliases is ...:
    row_major_aliases = aliases
  return ffi_call(f"{target}_row_major", results, signature=signature,
                            input_output_aliases=row_major_aliases)(*operands, **attributes)


def getrf(a):
  *batch, m, n = a.shape
  batch = tuple(batch)
  # As potrf_hermitian: LAPACK factors in place, the small-matrix kernel
  # reads the operand and writes the result, so only a size it leaves to
  # LAPACK takes the operand's buffer.
  _, largest = _core.lapack.small_lu_sizes()[("getrf", True, np.finfo(a.dtype).bits == 32)]
  return _row_major_on_cpu("batchpart_getrf", "(m,n)->(m,n),(k),(m),()", [a],
                           [S(a.shape, a.dtype), S((*batch, min(m, n)), i32),
                            S((*batch, m), i32), S(batch, i32)], aliases={0: 0},
                           row_major_aliases=None if max(m, n) <= largest else {0: 0})


def qr(a, *, full_matrices: bool):
  *batch, m, n = a.shape
  k = m if full_matrices else min(m, n)
  return _row_major_on_cpu("batchpart_qr", "(m,n)->(m,k),(k,n)", [a],
                           [S((*batch, m, k), a.dtype), S((*batch, k, n), a.dtype)],
                           full_matrices=bool(full_matrices))


def eigh(a, *, lower: bool, compute_vectors: bool = True):
  *batch, n, _ = a.shape
  batch = tuple(batch)
  return _call("batchpart_eigh", "(n,n)->(n),(n,p),()", [a],
               [S((*batch, n), _real(a.dtype)),
                S((*batch, n, n if compute_vectors else 0), a.dtype), S(batch, i32)],
               lower=bool(lower), compute_vectors=bool(compute_vectors))


def _svd_results(a, full_matrices: bool, compute_uv: bool):
  """The result shapes of an SVD target: s, u, vt (empty when not computed), info."""
  *batch, m, n = a.shape
  batch = tuple(batch)
  k = min(m, n)
  if not compute_uv:
    u_cols, vt_rows = 0, 0
  elif full_matrices:
    u_cols, vt_rows = m, n
  else:
    u_cols, vt_rows = k, k
  return [S((*batch, k), _real(a.dtype)), S((*batch, m, u_cols), a.dtype),
          S((*batch, vt_rows, n), a.dtype), S(batch, i32)]


def svd(a, *, full_matrices: bool, compute_uv: bool):
  return _call("batchpart_svd", "(m,n)->(k),(m,p),(q,n),()", [a],
               _svd_results(a, full_matrices, compute_uv),
               full_matrices=bool(full_matrices), compute_uv=bool(compute_uv))


def trsm(a, b, *, left_side: bool, lower: bool, transpose_a: bool, conjugate_a: bool,
         unit_diagonal: bool):
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  signature = "(p,p),(p,q)->(p,q)" if left_side else "(p,p),(q,p)->(q,p)"
  return _row_major_on_cpu(
      "batchpart_trsm", signature, [a, b], S((*batch, *b.shape[-2:]), b.dtype),
      left_side=bool(left_side), lower=bool(lower), transpose_a=bool(transpose_a),
      conjugate_a=bool(conjugate_a), unit_diagonal=bool(unit_diagonal))


def gesv(a, b):
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  return _row_major_on_cpu("batchpart_gesv", "(n,n),(n,r)->(n,r),()", [a, b],
                           [S((*batch, *b.shape[-2:]), b.dtype), S(tuple(batch), i32)])


# ---- CPU-only targets (cc/lapack/option_kernels.h) ------------------------------

def _platform_of(operands) -> str:
  """The platform the operands live on: that of a concrete array's devices,
  else jax's default backend (what a traced computation compiles for)."""
  for x in operands:
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
      try:
        return next(iter(x.devices())).platform
      except (AttributeError, StopIteration, RuntimeError):
        pass
  return jax.default_backend()


def require_cpu(fn: str, option: str, target: str, *operands) -> None:
  """Raises NotImplementedError naming the option and target when a
  CPU-only target would be compiled for another platform."""
  platform = _platform_of(operands)
  if platform != "cpu":
    raise NotImplementedError(
        f"batchpart.linalg.{fn}: {option} uses the CPU-only LAPACK target {target}, which has "
        f"no kernel for platform {platform!r}; run it on CPU devices or leave "
        f"{option.split('=')[0]} at its default.")


def geqrf(a):
  *batch, m, n = a.shape
  batch = tuple(batch)
  return _call("batchpart_geqrf", "(m,n)->(m,n),(k)", [a],
               [S(a.shape, a.dtype), S((*batch, min(m, n)), a.dtype)], aliases={0: 0})


def geqp3(a, *, full_matrices: bool):
  *batch, m, n = a.shape
  batch = tuple(batch)
  k = m if full_matrices else min(m, n)
  return _call("batchpart_geqp3", "(m,n)->(m,k),(k,n),(n)", [a],
               [S((*batch, m, k), a.dtype), S((*batch, k, n), a.dtype), S((*batch, n), i32)],
               full_matrices=bool(full_matrices))


def gesvd(a, *, full_matrices: bool, compute_uv: bool):
  return _call("batchpart_gesvd", "(m,n)->(k),(m,p),(q,n),()", [a],
               _svd_results(a, full_matrices, compute_uv),
               full_matrices=bool(full_matrices), compute_uv=bool(compute_uv))


def posv(a, b, *, lower: bool):
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  return _call("batchpart_posv", "(n,n),(n,r)->(n,r),()", [a, b],
               [S((*batch, *b.shape[-2:]), b.dtype), S(tuple(batch), i32)], lower=bool(lower))
