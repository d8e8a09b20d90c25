"""batchpart.linalg's test helpers, shared by tests/ and multidevice_tests/:
operands, tolerances, switches to a kernel's other path, and the batch-split
invariance (a matrix's bits, whatever batch it is in). ``batchpart.testing``
exports every name."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import numpy as np

import batchpart
from batchpart import _core

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


def split_case(draw, name: str, batch):
  """A drawn case of SPLIT_OPS ``name``: ``draw`` is hypothesis's
  ``data.draw``, ``batch(n)`` draws the batch size for matrices of size n
  (or a tuple led by it). Returns the drawn batch, the function, its
  operands and the case in words."""
  from hypothesis import strategies as st  # a test dependency, not the package's
  dtype = draw(st.sampled_from(DTYPES), label="dtype")
  n = draw(st.sampled_from(SPLIT_SIZES), label="n")
  drawn = batch(n)
  size = drawn[0] if isinstance(drawn, tuple) else drawn
  flags = tuple(draw(st.lists(st.booleans(), min_size=5, max_size=5), label="flags"))
  wide = draw(st.booleans(), label="wide")
  operands = split_operands(np.random.default_rng(n * 41 + size), name, size, n, dtype,
                            flags=flags, wide=wide)
  return drawn, split_function(name, flags=flags), operands, (
      f"{name} {np.dtype(dtype).name} n={n}")


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
