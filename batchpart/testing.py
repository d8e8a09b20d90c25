"""batchpart's own test kernels, registered for the tests and the demo.

Each kernel counts the batch elements it processes, so a test can prove that
no device recomputes another's share: after one sharded call the count equals
the batch size, not the batch size times the number of devices.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

import batchpart
from batchpart import _core

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
}
#: the stencil kernel's boundary rules (scipy.ndimage's names)
HALO_MODES = {"zero": 0, "reflect": 1, "nearest": 2, "wrap": 3}
REDUCE_OPS = {"sum": 0, "max": 1, "min": 2}
STATEFUL = "batchpart_test_stateful"          # (n) -> (n), x + offset; a two-stage bundle


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


# ---- linalg test helpers (shared by tests/ and multidevice_tests/) ----------------

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
#: dtype -> rtol and atol of a batchpart.linalg result against NumPy on CPU
TOL = {np.float32: 2e-4, np.complex64: 2e-4, np.float64: 1e-10, np.complex128: 1e-10}


@contextlib.contextmanager
def small_path(kernel: str, path: str) -> Iterator[None]:
  """Runs the block with the small-matrix kernel family `kernel` ("cholesky",
  "triangular_solve", "lu", "qr") on `path` ("auto", "always", "never"),
  then restores the path it had."""
  before = _core.lapack.small_path(kernel)
  _core.lapack.set_small_path(kernel, path)
  try:
    yield
  finally:
    _core.lapack.set_small_path(kernel, before)


@contextlib.contextmanager
def generic_kernels() -> Iterator[None]:
  """Runs the block on the run-time-n small-matrix kernels: the fixed-size
  ones (LU, Cholesky) run only under an AVX-512 cap of the block transposes,
  which the block lowers to AVX2."""
  before = _core.lapack.block_transposes()
  _core.lapack.set_block_transposes("avx2")
  try:
    yield
  finally:
    _core.lapack.set_block_transposes(before)


def lanes(dtype) -> int:
  """The matrices one group of the small-matrix kernels holds: a 64-byte
  vector of ``dtype``'s real type (``kLanes`` in cc/lapack/interleaved.h)."""
  return 64 // np.finfo(dtype).dtype.itemsize


def switch_key(dtype) -> tuple[bool, bool]:
  """(complex, single precision): how ``_core.lapack``'s switch-point tables
  key a dtype."""
  return bool(np.iscomplexobj(np.zeros(0, dtype))), np.finfo(dtype).bits == 32


def random_array(rng, shape, dtype):
  """Standard normal entries (real and imaginary parts for complex dtypes)."""
  x = rng.standard_normal(shape)
  if np.issubdtype(dtype, np.complexfloating):
    x = x + 1j * rng.standard_normal(shape)
  return x.astype(dtype)


def hermitian_pd(rng, batch, n, dtype):
  """Random Hermitian positive definite n x n matrices; n * I keeps them well conditioned."""
  x = random_array(rng, (*batch, n, n), dtype)
  return (x @ conj_transpose(x) + n * np.eye(n)).astype(dtype)


def conj_transpose(x):
  """The conjugate transpose of the last two dims."""
  return np.conj(np.swapaxes(x, -1, -2))


def assert_close(actual, expected, dtype, scale=1.0, tols=TOL):
  """Asserts actual ~ expected within tols[dtype] * scale, relative and absolute."""
  tol = tols[dtype] * scale
  np.testing.assert_allclose(np.asarray(actual), expected, rtol=tol, atol=tol)


def assert_lu(a, lu, pivots, perm, dtype, scale, tols=TOL):
  """Asserts jax.lax.linalg.lu's contract for a: int32 pivots and perm of their shapes,
  and P A = L U within tols[dtype] * scale."""
  *batch, m, n = a.shape
  k = min(m, n)
  assert pivots.shape == (*batch, k) and perm.shape == (*batch, m)
  assert pivots.dtype == np.int32 and perm.dtype == np.int32
  lu = np.asarray(lu)
  l = np.tril(lu[..., :, :k], -1) + np.eye(m, k)
  u = np.triu(lu[..., :k, :])
  permuted = np.take_along_axis(a, np.asarray(perm)[..., None], axis=-2)
  assert_close(l @ u, permuted, dtype, scale, tols)


# ---- the batch-split invariance: a matrix's bits, whatever its batch ------------------

#: Every bp.linalg function, and solve's positive-definite path: the calls whose
#: results must not depend on how a batch is split over devices.
SPLIT_OPS = ("cholesky", "lu", "qr", "eigh", "svd", "solve", "solve_pos", "triangular_solve")
#: Sizes on both sides of every small-matrix switch point (docs/kernels.md) and
#: one large enough (flops per matrix) to be a chunk of its own on the thread pool.
SPLIT_SIZES = (1, 2, 3, 4, 7, 8, 12, 13, 16, 17, 24, 25, 28, 29, 32, 33, 48, 49, 56, 57, 64,
               65, 150)


def split_function(name: str, *, flags=(True, True, False, False, False)):
  """The bp.linalg call of SPLIT_OPS ``name``, a function of the operands
  split_operands makes; ``flags`` are triangular_solve's (left_side, lower,
  transpose_a, conjugate_a, unit_diagonal)."""
  linalg = batchpart.linalg
  left_side, lower, transpose_a, conjugate_a, unit_diagonal = flags
  return {
      "cholesky": linalg.cholesky,
      "lu": linalg.lu,
      "qr": linalg.qr,
      "eigh": linalg.eigh,
      "svd": linalg.svd,
      "solve": linalg.solve,
      "solve_pos": lambda a, b: linalg.solve(a, b, assume_a="pos"),
      "triangular_solve": lambda a, b: linalg.triangular_solve(
          a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
          conjugate_a=conjugate_a, unit_diagonal=unit_diagonal),
  }[name]


def split_operands(rng, name: str, batch: int, n: int, dtype, *,
                   flags=(True, True, False, False, False), wide: bool = False):
  """Random operands of split_function(name, flags=flags) for ``batch``
  matrices of size n: Hermitian positive definite for cholesky, eigh and
  solve_pos, a well-conditioned triangle for triangular_solve, 3 right-hand
  sides; qr factors n x (n + 2) matrices when ``wide``, else (n + 2) x n."""
  if name in ("cholesky", "eigh", "solve_pos"):
    a = hermitian_pd(rng, (batch,), n, dtype)
  elif name == "qr":
    a = random_array(rng, (batch, n, n + 2) if wide else (batch, n + 2, n), dtype)
  elif name == "triangular_solve":
    a = (random_array(rng, (batch, n, n), dtype) / np.sqrt(n) + 2 * np.eye(n)).astype(dtype)
  else:
    a = random_array(rng, (batch, n, n), dtype)
  if name in ("solve", "solve_pos") or (name == "triangular_solve" and flags[0]):
    return a, random_array(rng, (batch, n, 3), dtype)
  if name == "triangular_solve":
    return a, random_array(rng, (batch, 3, n), dtype)
  return (a,)


def bits(x) -> np.ndarray:
  """x's elements as unsigned integers of their width (complex: its two
  parts), so that equality is bit for bit, signs of zero included, except
  that every NaN is one: which payload and sign a NaN result carries is the
  CPU's choice among its operands' (x86 takes the first), and the order of a
  commutative operation's operands the compiler's."""
  x = np.ascontiguousarray(np.asarray(x))
  if x.dtype.kind == "c":
    x = x.view(np.finfo(x.dtype).dtype)
  if x.dtype.kind == "f":
    x = np.where(np.isnan(x), np.asarray(np.nan, x.dtype), x)
  return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def assert_same_bits(actual, expected, what: str = "") -> None:
  """Asserts every leaf of the pytree ``actual`` equals ``expected``'s bit for
  bit, naming the leaf and how many elements differ."""
  leaves, expected_leaves = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(leaves) == len(expected_leaves), what
  for i, (x, y) in enumerate(zip(leaves, expected_leaves)):
    x, y = bits(x), bits(y)
    assert x.shape == y.shape, f"{what}: result {i} has shape {x.shape}, expected {y.shape}"
    differ = int(np.count_nonzero(x != y))
    assert differ == 0, f"{what}: result {i} differs in {differ} of {x.size} elements"


def assert_alone_as_in_batch(f, operands, what: str = "") -> None:
  """Asserts that f on each batch element alone (a batch of one, sliced from
  every operand's leading dim) gives the bits f gives it on the whole batch."""
  whole = f(*operands)
  for i in range(operands[0].shape[0]):
    alone = f(*(x[i:i + 1] for x in operands))
    assert_same_bits(alone, jax.tree.map(lambda r, i=i: r[i:i + 1], whole),
                     f"{what}: batch element {i} alone")
