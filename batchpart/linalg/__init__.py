"""Batch-partitionable linear algebra over LAPACK (CPU).

Each function is one ``batchpart.ffi_call`` with a gufunc signature: under
``jax.jit`` with sharded inputs every device factors its own matrices, in
Auto, Explicit and Manual modes; vmappable; differentiable (JVP rules with
the same math as jax's, reverse mode through them). Semantics and return
conventions follow :mod:`jax.numpy.linalg`, :mod:`jax.scipy.linalg` and
:mod:`jax.lax.linalg`; a failed factorization gives NaN in that batch element.
"""

from batchpart.linalg._decompositions import cholesky, eigh, lu
from batchpart.linalg._orthogonal import qr, svd
from batchpart.linalg._solves import solve, triangular_solve

__all__ = ["cholesky", "eigh", "lu", "qr", "solve", "svd", "triangular_solve"]
