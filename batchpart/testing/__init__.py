"""batchpart's own test kernels, registered for the tests and the demo.

Each kernel counts the batch elements it processes, so a test can prove that
no device recomputes another's share: after one sharded call the count equals
the batch size, not the batch size times the number of devices.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import batchpart
from batchpart import _core

# batchpart.linalg's helpers, in a module of their own, under this name too.
from batchpart.testing.linalg import (
  DTYPES as DTYPES,
  SPLIT_OPS as SPLIT_OPS,
  SPLIT_SIZES as SPLIT_SIZES,
  TOL as TOL,
  assert_alone_as_in_batch as assert_alone_as_in_batch,
  assert_close as assert_close,
  assert_lu as assert_lu,
  assert_same_bits as assert_same_bits,
  bits as bits,
  conj_transpose as conj_transpose,
  generic_kernels as generic_kernels,
  hermitian_pd as hermitian_pd,
  lanes as lanes,
  random_array as random_array,
  small_path as small_path,
  split_case as split_case,
  split_function as split_function,
  split_operands as split_operands,
  switch_key as switch_key,
)

#: target name -> short kernel name in batchpart._core.testing.handlers()
TARGETS = {
    "batchpart_test_softmax": "softmax",      # (n) -> (n), ()
    "batchpart_test_matvec": "matvec",        # (m,n),(n) -> (m); attr alpha: f64
    "batchpart_test_axpy": "axpy",            # (n),(n) -> (n); attr alpha: f64
    "batchpart_test_copy_bytes": "copy_bytes",  # (m,n) -> (m,n), memory as laid out
    "batchpart_test_count": "count",          # (n) -> nothing: counts and sums its input
    # (a..,...,t..),(c..,...,d..) -> (e..,...,f..): the sum of both operands'
    # core elements at each batch element, everywhere in the result's core
    # dims; attrs x_lead, x_trail, y_lead, y_trail, out_lead, out_trail: int64
    "batchpart_test_core_sum": "core_sum",
    # (n,k),(n) -> (k): out[j] = op over i of w[i] * x[i, j]; attrs op (0 sum,
    # 1 max, 2 min) and rows (the n the call must see, -1 any): int64. Counts
    # batch x n rows; batch dims broadcast. Reducible over n (reduce={"n": ...}).
    "batchpart_test_reduce_rows": "reduce_rows",
    # (n) -> (), (): NumPy's argmax (attr op 0) or argmin (op 1) over n and the
    # value there; f32, f64, s32 values, int32 index. Combines by the same name.
    "batchpart_test_arg_rows": "arg_rows",
    # (q,d),(n,d),(n,e),(n) -> (q,e),(q): softmax(q k^T + bias) v and its lse
    # (bias -inf masks a key; every key masked: o = 0, lse = -inf); f32, f64.
    # Combines over n by logsumexp.
    "batchpart_test_attention": "attention",
    # (n) -> (k), (k): the k largest (attr op 0) or smallest (op 1) values of
    # n and their indices, NaNs first, ties to the lower index; f32, f64, s32
    # values, int32 indices. Combines by max_k (min_k).
    "batchpart_test_top_k_rows": "top_k_rows",
    # (n,k),(n) -> (k),(n): total[j] = sum_i w[i] x[i,j] and row[i] =
    # w[i] sum_j x[i,j]; f32. With reduce={"n": "sum"} total combines and
    # row keeps n, split like the operands.
    "batchpart_test_weigh_rows": "weigh_rows",
    # (...,n) -> (...,n) (attr rank 1) or (...,n,m) -> (...,n,m) (rank 2): a
    # sum over the window [i - lo, i + hi] (per dim) with asymmetric weights,
    # boundary rule attr mode (HALO_MODES); attrs rank, lo, hi, mode: int64;
    # f32, f64. Local along n (and m): halo={"n": Halo(lo, hi)}.
    "batchpart_test_stencil": "stencil",
    # (...,n,m) -> (...,n,m): the 5-point Laplacian, zero outside; f32, f64.
    "batchpart_test_laplacian": "laplacian",
    # (...,n,m) -> (...,n): the stencil's window along n of the row sums over
    # m (attrs lo, hi, mode); f32, f64, s32. halo={"n": ...}, reduce={"m": "sum"}.
    "batchpart_test_row_stencil": "row_stencil",
    # (...,t),(...,t),(...) -> (...,t),(...),(...): h[i] = a[i] h[i-1] + x[i]
    # from h0, returning (h, h_T, prod a); attr reverse (int64: from the
    # end); f32, f64, s32 (wrapping). scan={"t": LINEAR_SCAN} (linear_scan()).
    "batchpart_test_linear_scan": "linear_scan",
    # (...,t),(...) -> (...,t),(...): y[i] = s0 + x[0] + ... + x[i] and the
    # total; attr reverse; f32, f64, s32. scan={"t": Scan((1, 1), merge=add)}.
    "batchpart_test_prefix_sum": "prefix_sum",
    # (...,t),(...) -> (...,t),(...): h[i] = tanh(w h[i-1] + x[i]); attrs w
    # (f64), reverse; f32, f64. Nonlinear: a sequential scan only.
    "batchpart_test_tanh_rnn": "tanh_rnn",
    # (...,t,d),(...,t,d),(...,t,e),(...,d,e) -> (...,t,e),(...,d,e): causal
    # linear attention, S[i] = S[i-1] + k[i] v[i]^T from S0, o[i] = q[i]^T
    # S[i]; attr reverse; f32, f64. scan={"t": Scan((3, 1), merge=add)}
    # (linear_attention()).
    "batchpart_test_linear_attention": "linear_attention",
    # Any arrays, each read through the roles of its dims (attr roles): one
    # kernel for every kind of dim in any layout (testing.layouts).
    "batchpart_test_layout": "layout",
}
#: the stencil kernel's boundary rules (scipy.ndimage's names)
HALO_MODES = {"zero": 0, "reflect": 1, "nearest": 2, "wrap": 3}
REDUCE_OPS = {"sum": 0, "max": 1, "min": 2}
STATEFUL = "batchpart_test_stateful"          # (n) -> (n), x + offset; a two-stage bundle


def linear_merge(a, b):
  """The linear recurrence's summaries ``(h_T, prod a)`` of two consecutive
  parts composed (``a`` the earlier)."""
  (h1, p1), (h2, p2) = a, b
  return p2 * h1 + h2, p1 * p2


def linear_apply(summary, state):
  """The state after a stretch with summary ``(h_T, prod a)``."""
  h, p = summary
  return p * state + h


def add_merge(a, b):
  """Sums compose by adding: the prefix sum's summary is its total."""
  return (a[0] + b[0],)


def linear_scan(shape, dtype, *, reverse: bool = False):
  """``batchpart_test_linear_scan`` as a ``bp.ffi_call`` with ``t`` scanned:
  call it with ``(a, x, h0, reverse=np.int64(...))``."""
  state = jax.ShapeDtypeStruct(tuple(shape[:-1]), dtype)
  scan = batchpart.Scan(state=(2, 1), merge=linear_merge, apply=linear_apply,
                        reverse=reverse)
  return batchpart.ffi_call(
      "batchpart_test_linear_scan", (jax.ShapeDtypeStruct(tuple(shape), dtype), state, state),
      signature="(t),(t),()->(t),(),()", scan={"t": scan})


def linear_attention(q_shape, e: int, dtype, *, reverse: bool = False):
  """``batchpart_test_linear_attention`` as a ``bp.ffi_call`` with ``t``
  scanned (states add): call it with ``(q, k, v, s0, reverse=np.int64(...))``,
  ``q`` of ``q_shape`` (..., t, d)."""
  *lead, t, d = q_shape
  scan = batchpart.Scan(state=(3, 1), merge=add_merge, reverse=reverse)
  return batchpart.ffi_call(
      "batchpart_test_linear_attention",
      (jax.ShapeDtypeStruct((*lead, t, e), dtype), jax.ShapeDtypeStruct((*lead, d, e), dtype)),
      signature="(t,d),(t,d),(t,e),(d,e)->(t,e),(d,e)", scan={"t": scan})


def register() -> None:
  """Registers the test kernels (idempotent) and marks them batch partitionable."""
  handlers = _core.testing.handlers()
  for target, short in TARGETS.items():
    batchpart.register_ffi_target(target, handlers[short], platform="cpu")


def register_stateful() -> None:
  """Registers ``batchpart_test_stateful``: an ``{"instantiate", "execute"}``
  bundle whose execute stage reads the state (``offset``, an f32 attribute)
  its instantiate stage built. Its state type must reach XLA before the
  handler, so this starts the CPU backend first (idempotent)."""
  global _stateful_registered
  if _stateful_registered:
    return
  jax.devices("cpu")
  jax.ffi.register_ffi_type("batchpart_test_stateful_offset",
                            _core.testing.stateful_offset_type(), platform="cpu")
  handlers = _core.testing.handlers()
  batchpart.register_ffi_target(STATEFUL, {"instantiate": handlers["stateful_instantiate"],
                                           "execute": handlers["stateful_execute"]})
  _stateful_registered = True


_stateful_registered = False


def stateful(x, offset: float):
  """x + offset through the stateful bundle (register_stateful first)."""
  return batchpart.ffi_call(STATEFUL, jax.ShapeDtypeStruct(x.shape, x.dtype),
                            signature="(n)->(n)")(x, offset=np.float32(offset))


def count(x):
  """A call with no results, kept for its side effect: adds x's rows to the
  batch-element counter and its values to ``counted_sum``."""
  return batchpart.ffi_call("batchpart_test_count", [], signature="(n)->",
                            has_side_effect=True)(x)


def counted_sum() -> float:
  return _core.testing.counted_sum()


def batch_elements_processed() -> int:
  return _core.testing.batch_elements_processed()


def reset_batch_elements_processed() -> None:
  _core.testing.reset_batch_elements_processed()


def softmax(x):
  """Row-wise softmax and log-sum-exp over the last dim."""
  return batchpart.ffi_call(
      "batchpart_test_softmax",
      (jax.ShapeDtypeStruct(x.shape, x.dtype),
       jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)),
      signature="(n)->(n),()")(x)


def matvec(a, x, *, alpha: float = 1.0):
  """alpha * A @ x with broadcast batch dims."""
  batch = np.broadcast_shapes(a.shape[:-2], x.shape[:-1])
  return batchpart.ffi_call(
      "batchpart_test_matvec",
      jax.ShapeDtypeStruct((*batch, a.shape[-2]), a.dtype),
      signature="(m,n),(n)->(m)")(a, x, alpha=np.float64(alpha))


def reduce_rows(x, w, op: str = "sum", *, rows: int = -1, reduce: bool = True):
  """``op`` over n of ``w[..., n, None] * x[..., n, k]`` through
  ``batchpart_test_reduce_rows``, with n declared reduced (or not)."""
  out = jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1]), x.dtype)
  return batchpart.ffi_call(
      "batchpart_test_reduce_rows", out, signature="(n,k),(n)->(k)",
      reduce={"n": op} if reduce else None)(
          x, w, op=np.int64(REDUCE_OPS[op]), rows=np.int64(rows))


def arg_rows(x, op: str = "argmax", *, reduce: bool = True):
  """(value, index) of NumPy's ``op`` ("argmax", "argmin") over x's last dim
  through ``batchpart_test_arg_rows``, with that dim combined by ``op``."""
  out = (jax.ShapeDtypeStruct(x.shape[:-1], x.dtype),
         jax.ShapeDtypeStruct(x.shape[:-1], np.int32))
  return batchpart.ffi_call("batchpart_test_arg_rows", out, signature="(n)->(),()",
                            reduce={"n": op} if reduce else None)(
      x, op=np.int64(("argmax", "argmin").index(op)))


def top_k_rows(x, k: int, op: str = "max_k", *, reduce: bool = True):
  """(values, indices) of the ``k`` best of x's last dim through
  ``batchpart_test_top_k_rows``, with that dim combined by ``op``
  ("max_k", "min_k")."""
  out = (jax.ShapeDtypeStruct((*x.shape[:-1], k), x.dtype),
         jax.ShapeDtypeStruct((*x.shape[:-1], k), np.int32))
  return batchpart.ffi_call("batchpart_test_top_k_rows", out, signature="(n)->(k),(k)",
                            reduce={"n": op} if reduce else None)(
      x, op=np.int64(("max_k", "min_k").index(op)))


def top_k_reference(x, k: int, op: str = "max_k"):
  """NumPy's (values, indices) for ``top_k_rows``: a stable sort of the last
  dim by (NaN first, value descending for max_k, ascending for min_k)."""
  x = np.asarray(x)
  key = -x if op == "max_k" else x
  if x.dtype.kind == "f":
    # NaNs first (lexsort's last key leads), then by value; lexsort is stable.
    order = np.lexsort((np.where(np.isnan(x), 0, key), ~np.isnan(x)), axis=-1)
  else:
    order = np.argsort(key, axis=-1, kind="stable")
  index = order[..., :k]
  return np.take_along_axis(x, index, -1), index


def weigh_rows(x, w):
  """(total, row) of ``batchpart_test_weigh_rows``: n reduced by a sum in
  total and kept in row."""
  out = (jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1]), x.dtype),
         jax.ShapeDtypeStruct(x.shape[:-1], x.dtype))
  return batchpart.ffi_call("batchpart_test_weigh_rows", out, signature="(n,k),(n)->(k),(n)",
                            reduce={"n": "sum"})(x, w)


def attention(q, k, v, bias, *, reduce: bool = True):
  """(o, lse) of softmax attention through ``batchpart_test_attention``,
  with the keys' dim n combined by logsumexp."""
  out = (jax.ShapeDtypeStruct((*q.shape[:-1], v.shape[-1]), q.dtype),
         jax.ShapeDtypeStruct(q.shape[:-1], q.dtype))
  return batchpart.ffi_call("batchpart_test_attention", out,
                            signature="(q,d),(n,d),(n,e),(n)->(q,e),(q)",
                            reduce={"n": "logsumexp"} if reduce else None)(q, k, v, bias)


def attention_reference(q, k, v, bias):
  """(o, lse) in float64 NumPy; a query with every key masked: o = 0, lse = -inf."""
  s = np.einsum("...qd,...nd->...qn", np.float64(q), np.float64(k)) + np.float64(bias)[
      ..., None, :]
  top = s.max(axis=-1, keepdims=True)
  safe = np.where(np.isfinite(top), top, 0.0)
  e = np.exp(s - safe)
  z = e.sum(axis=-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    o = np.where(z > 0, (e @ np.float64(v)) / np.where(z > 0, z, 1), 0.0)
    lse = (safe + np.log(z))[..., 0]
  return o, lse


def reduce_rows_operands(rng, batch, n: int, k: int, dtype=np.float32):
  """x (*batch, n, k) and w (*batch, n) for ``reduce_rows``: small integers
  for integer dtypes (exact sums), normal values otherwise, complex parts
  both non-zero."""
  dtype = np.dtype(dtype)

  def draw(shape):
    if dtype.kind == "i":
      return rng.integers(-9, 10, shape).astype(dtype)
    v = rng.standard_normal(shape)
    if dtype.kind == "c":
      v = v + 1j * rng.standard_normal(shape)
    return v.astype(dtype)

  return draw((*batch, n, k)), draw((*batch, n))


def reduce_rows_reference(x, w, op: str = "sum"):
  v = np.asarray(w)[..., :, None] * np.asarray(x)
  reducers: dict[str, Any] = {"sum": np.sum, "max": np.max, "min": np.min}
  return reducers[op](v, axis=-2)


def softmax_reference(x):
  x = np.asarray(x)
  m = x.max(axis=-1, keepdims=True)
  e = np.exp(x - m)
  s = e.sum(axis=-1, keepdims=True)
  return e / s, (m + np.log(s))[..., 0]

