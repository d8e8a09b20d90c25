"""One kernel for every kind of dim, in any layout, as an FFI call and as a
host callback: ``batchpart_test_layout`` and its NumPy twin ``compute``.

Every array names the role of each of its dims (``roles``, one string per
array): ``"0"``-``"3"`` batch dims, ``"n"`` and ``"m"`` the dims the call
combines over or is local along, ``"j"`` a core dim kept whole, ``"k"`` a
top-k's candidates, ``"e"`` an average's width. Both read every array
through its roles, never by position, so a test may declare any signature
(batch dims before, between or after the core dims, kept and combined
results in any order) and compare the call sharded against ``compute`` on
the whole arrays. What each op computes is in ``cc/testing/layout_kernels.cc``.
"""

from __future__ import annotations

import jax
import numpy as np

import batchpart

TARGET = "batchpart_test_layout"
#: the kernel's ops (its attribute ``op``)
OPS = {"sum": 0, "max": 1, "min": 2, "argmax": 3, "argmin": 4, "max_k": 5, "min_k": 6,
       "logsumexp": 7, "sum_max": 8, "halo": 9}
ROLES = "0123nmjke"
_N, _M, _J, _K, _E = (ROLES.index(r) for r in "nmjke")
_NM = (_N, _M)


def _canonical(x, roles: str) -> np.ndarray:
  """``x`` with one axis per role, in ``ROLES`` order (size 1 where absent)."""
  x = np.asarray(x)
  present = [r for r in ROLES if r in roles]
  x = np.transpose(x, [roles.index(r) for r in present])
  return x.reshape([x.shape[present.index(r)] if r in roles else 1 for r in ROLES])


def _as_array(c: np.ndarray, roles: str) -> np.ndarray:
  """A canonical array's axes of ``roles``, in that order."""
  c = np.asarray(c)
  shape = [c.shape[ROLES.index(r)] for r in roles]
  return np.transpose(c, [ROLES.index(r) for r in roles] + [
      i for i, r in enumerate(ROLES) if r not in roles]).reshape(shape)


def is_kept(op: str, roles: str) -> bool:
  """Whether a result with ``roles`` keeps the reduced dims (2 x operand 0)."""
  return op != "halo" and "n" in roles


def compute(op: str, operand_roles, result_roles, *operands, lo: int = 0, hi: int = 0,
            k: int = 1) -> list[np.ndarray]:
  """What ``batchpart_test_layout`` computes, in NumPy (float32 sums in the
  kernel's order where the order shows)."""
  x = _canonical(operands[0], operand_roles[0]).astype(np.float32)
  count = sum(not is_kept(op, roles) for roles in result_roles)
  combining = _combining(op, operand_roles, operands, x, lo, hi, k, count)
  out, i = [], 0
  for roles in result_roles:
    if is_kept(op, roles):
      out.append(_as_array(2 * x, roles))
    elif op == "halo":
      out.append(_as_array(combining[0], roles))
    else:
      out.append(_as_array(combining[i], roles))
      i += 1
  return out


def _combining(op: str, operand_roles, operands, x, lo: int, hi: int, k: int,
               count: int) -> list:
  """The ``count`` canonical results without the reduced dims, in order."""
  if op in ("sum", "max", "min", "sum_max"):
    flat = _flat_nm(x)
    total = np.zeros(flat.shape[:-1], np.float32)
    for i in range(flat.shape[-1]):   # the kernel's order
      total = total + flat[..., i]
    total = _unflat_nm(total)
    extreme = {"max": x.max(axis=_NM, keepdims=True), "min": x.min(axis=_NM, keepdims=True)}
    if op == "sum_max":
      return [total, x.max(axis=_NM, keepdims=True)]
    return [total if op == "sum" else extreme[op]]
  if op in ("argmax", "argmin"):
    index = (np.argmax if op == "argmax" else np.argmin)(x, axis=_N)[:, :, :, :, None]
    value = np.take_along_axis(x, index, _N)
    return [value, index.astype(np.int32)]
  if op in ("max_k", "min_k"):
    order = np.argsort(-x if op == "max_k" else x, axis=_N, kind="stable")
    order = np.take(order, np.arange(k), axis=_N)
    values = np.take_along_axis(x, order, _N)
    return [np.swapaxes(values, _N, _K), np.swapaxes(order, _N, _K).astype(np.int32)]
  if op == "logsumexp":
    v = _canonical(operands[1], operand_roles[1]).astype(np.float64)
    s = x.astype(np.float64)
    top = s.max(axis=_NM, keepdims=True)
    w = np.exp(s - top)
    total = w.sum(axis=_NM, keepdims=True)
    average = (w * v).sum(axis=_NM, keepdims=True) / total
    lse = (top + np.log(total))[..., :1]
    return [average.astype(np.float32)] * (count - 1) + [lse.astype(np.float32)]
  return [_window_sum(x, lo, hi, "m" in operand_roles[0])]


def _flat_nm(x):
  """x with n and m flattened into a last axis (m fastest)."""
  moved = np.moveaxis(x, _NM, (-2, -1))
  return moved.reshape(*moved.shape[:-2], -1)


def _unflat_nm(total):
  return total[..., None, None].reshape(*total.shape[:4], 1, 1, *total.shape[4:])


def _window_sum(x, lo: int, hi: int, has_m: bool) -> np.ndarray:
  """The sum over the window [i - lo, i + hi] along n (and m), indices
  clamped to the array."""
  total = np.zeros_like(x)
  n, m = x.shape[_N], x.shape[_M]
  for dn in range(-lo, hi + 1):
    for dm in (range(-lo, hi + 1) if has_m else (0,)):
      rows = np.clip(np.arange(n) + dn, 0, n - 1)
      cols = np.clip(np.arange(m) + dm, 0, m - 1)
      total = total + np.take(np.take(x, rows, axis=_N), cols, axis=_M)
  return total


def signature(operand_roles, result_roles) -> str:
  """The gufunc signature of arrays with these roles: each array's batch
  roles (digits, contiguous) become its ``...``."""
  def group(roles: str) -> str:
    cores = [r for r in roles if not r.isdigit()]
    first = next((i for i, r in enumerate(roles) if r.isdigit()), None)
    if first is not None:
      cores.insert(first, "...")
    return "(" + ",".join(cores) + ")"
  return ",".join(map(group, operand_roles)) + "->" + ",".join(map(group, result_roles))


def result_types(op: str, result_roles, sizes) -> list:
  """The results' ShapeDtypeStructs: float32, but an index op's second
  combining result (int32)."""
  combining = [i for i, roles in enumerate(result_roles) if not is_kept(op, roles)]
  index = combining[1] if op in ("argmax", "argmin", "max_k", "min_k") else None
  return [jax.ShapeDtypeStruct(tuple(sizes[r] for r in roles),
                               np.int32 if i == index else np.float32)
          for i, roles in enumerate(result_roles)]


def ffi_call(op: str, operand_roles, result_roles, sizes, *, lo: int = 0, hi: int = 0,
             **declaration):
  """``batchpart_test_layout`` through ``batchpart.ffi_call`` with
  ``declaration`` (``reduce=``, ``halo=``); a function of the operands."""
  call = batchpart.ffi_call(TARGET, result_types(op, result_roles, sizes),
                            signature=signature(operand_roles, result_roles), **declaration)
  roles = ";".join((*operand_roles, *result_roles))
  return lambda *xs: call(*xs, op=np.int64(OPS[op]), roles=roles, lo=np.int64(lo),
                          hi=np.int64(hi))


def pure_callback(op: str, operand_roles, result_roles, sizes, *, lo: int = 0, hi: int = 0,
                  **declaration):
  """``compute`` through ``batchpart.pure_callback`` with ``declaration``;
  a function of the operands."""
  def host(*xs):
    return tuple(compute(op, operand_roles, result_roles, *xs, lo=lo, hi=hi,
                         k=sizes.get("k", 1)))
  return lambda *xs: batchpart.pure_callback(
      host, tuple(result_types(op, result_roles, sizes)), *xs,
      signature=signature(operand_roles, result_roles), **declaration)
