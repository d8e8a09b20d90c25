"""Kernel-level tests of batchpart's CPU LAPACK targets (cc/lapack/).

Every target is called through a plain ``jax.ffi.ffi_call`` with column-major
layouts for matrices, exactly as the contracts in cc/lapack/kernels.h state,
and checked against numpy/scipy and by reconstruction.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
import scipy.linalg
from hypothesis import HealthCheck, given, settings, strategies as st

from batchpart import _core, _lapack_targets
from batchpart._lapack_targets import column_major
from batchpart.testing import conj_transpose as herm, hermitian_pd, random_array as random

pytestmark = pytest.mark.timeout(120)

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
HYPOTHESIS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module", autouse=True)
def _lapack_with_x64():
    _lapack_targets.register()
    with jax.enable_x64(True):
        yield


# ---- calling the targets -----------------------------------------------------


def matrix(shape, dtype):
    """A result spec for a (batched) matrix: laid out column-major."""
    return (tuple(shape), dtype, True)


def array(shape, dtype):
    """A result spec for batched vectors or scalars: default layout."""
    return (tuple(shape), dtype, False)


def ffi(target, operands, results, *, row_major=False, **attrs):
    """Calls `target`; every operand is a (batched) matrix, passed column-major
    (row-major with `row_major`).

    `results` holds matrix(...) / array(...) specs; returns numpy arrays.
    """
    layout = (lambda shape: None) if row_major else column_major
    call = jax.ffi.ffi_call(
        target,
        [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype, _ in results],
        input_layouts=[layout(np.shape(x)) for x in operands],
        output_layouts=[layout(shape) if is_matrix else None
                        for shape, _, is_matrix in results],
    )
    return tuple(np.asarray(r) for r in call(*operands, **attrs))


def real_dtype(dtype):
    return np.finfo(dtype).dtype


def potrf(a, lower=True, symmetrize=False):
    batch = a.shape[:-2]
    return ffi("batchpart_potrf", [a], [matrix(a.shape, a.dtype), array(batch, np.int32)],
               lower=lower, symmetrize=symmetrize)


def getrf(a, row_major=False):
    *batch, m, n = a.shape
    k = min(m, n)
    return ffi(
        "batchpart_getrf_row_major" if row_major else "batchpart_getrf",
        [a],
        [matrix(a.shape, a.dtype), array((*batch, k), np.int32), array((*batch, m), np.int32),
         array(batch, np.int32)],
        row_major=row_major,
    )


# The CPU's row-major twins (batchpart_<op>_row_major) share their targets' tests.
LAYOUTS = pytest.mark.parametrize("row_major", [False, True], ids=["column_major", "row_major"])


def qr(a, full_matrices=False, row_major=False):
    *batch, m, n = a.shape
    cols = m if full_matrices else min(m, n)
    return ffi(
        "batchpart_qr_row_major" if row_major else "batchpart_qr",
        [a],
        [matrix((*batch, m, cols), a.dtype), matrix((*batch, cols, n), a.dtype)],
        row_major=row_major,
        full_matrices=full_matrices,
    )


def eigh(a, lower=True, compute_vectors=True):
    *batch, n, _ = a.shape
    return ffi(
        "batchpart_eigh",
        [a],
        [
            array((*batch, n), real_dtype(a.dtype)),
            matrix((*batch, n, n if compute_vectors else 0), a.dtype),
            array(batch, np.int32),
        ],
        lower=lower,
        compute_vectors=compute_vectors,
    )


def svd(a, full_matrices=False, compute_uv=True):
    *batch, m, n = a.shape
    k = min(m, n)
    u_cols = (m if full_matrices else k) if compute_uv else 0
    vt_rows = (n if full_matrices else k) if compute_uv else 0
    return ffi(
        "batchpart_svd",
        [a],
        [
            array((*batch, k), real_dtype(a.dtype)),
            matrix((*batch, m, u_cols), a.dtype),
            matrix((*batch, vt_rows, n), a.dtype),
            array(batch, np.int32),
        ],
        full_matrices=full_matrices,
        compute_uv=compute_uv,
    )


def broadcast_batch(a, b):
    return np.broadcast_shapes(a.shape[:-2], b.shape[:-2])


def trsm(a, b, *, left_side=True, lower=True, transpose_a=False, conjugate_a=False,
         unit_diagonal=False, row_major=False):
    shape = (*broadcast_batch(a, b), *b.shape[-2:])
    (x,) = ffi(
        "batchpart_trsm_row_major" if row_major else "batchpart_trsm",
        [a, b],
        [matrix(shape, b.dtype)],
        row_major=row_major,
        left_side=left_side,
        lower=lower,
        transpose_a=transpose_a,
        conjugate_a=conjugate_a,
        unit_diagonal=unit_diagonal,
    )
    return x


def gesv(a, b, row_major=False):
    batch = broadcast_batch(a, b)
    return ffi("batchpart_gesv_row_major" if row_major else "batchpart_gesv", [a, b],
               [matrix((*batch, *b.shape[-2:]), b.dtype), array(batch, np.int32)],
               row_major=row_major)


# ---- inputs and tolerances -------------------------------------------------------


def unread_triangle(n, lower):
    """Mask of the strict triangle a kernel told `lower` must ignore."""
    ones = np.ones((n, n), bool)
    return np.triu(ones, 1) if lower else np.tril(ones, -1)


def tol(dtype):
    return 2e-4 if np.finfo(dtype).bits <= 32 else 1e-10


def assert_close(actual, expected, dtype, scale=1.0):
    """Entrywise close, with an absolute slack proportional to `scale`."""
    t = tol(dtype)
    np.testing.assert_allclose(actual, expected, rtol=t, atol=t * max(scale, 1.0))


def scale_of(a):
    return float(np.max(np.abs(a), initial=1.0)) * max(a.shape[-1], 1) if a.size else 1.0


batch_shapes = st.lists(st.integers(0, 3), max_size=2).map(tuple)
dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)


# ---- registration ------------------------------------------------------------


def test_registration_table_names_the_targets():
    assert {"batchpart_potrf", "batchpart_getrf", "batchpart_qr", "batchpart_eigh",
            "batchpart_svd", "batchpart_trsm", "batchpart_gesv",
            *_lapack_targets.CPU_ONLY_TARGET_NAMES} == set(_core.lapack.handlers())
    assert _core.lapack.initialized()


def test_register_is_idempotent():
    _lapack_targets.register()
    _lapack_targets.register()


def test_column_major_layout():
    assert column_major((3,)) is None
    assert column_major((2, 3)) == (1, 0)
    assert column_major((4, 1, 2, 3)) == (0, 1, 3, 2)
    assert column_major((2, 0, 0)) is None  # empty: nothing to lay out


def test_initialize_rejects_missing_routines():
    from scipy.linalg import cython_blas, cython_lapack

    lapack = dict(cython_lapack.__pyx_capi__)
    del lapack["zgesdd"]
    with pytest.raises(ValueError, match="zgesdd"):
        _core.lapack.initialize(lapack, cython_blas.__pyx_capi__)
    assert _core.lapack.initialized()  # the earlier, complete tables stay


def test_kernels_before_initialize_fail_cleanly():
    """A kernel registered but never given LAPACK pointers returns an error."""
    script = textwrap.dedent(
        """
        import jax, numpy as np
        from batchpart import _core
        jax.ffi.register_ffi_target(
            "batchpart_potrf", _core.lapack.handlers()["batchpart_potrf"], platform="cpu")
        call = jax.ffi.ffi_call(
            "batchpart_potrf",
            (jax.ShapeDtypeStruct((2, 2), np.float32), jax.ShapeDtypeStruct((), np.int32)))
        try:
            call(np.eye(2, dtype=np.float32), lower=True, symmetrize=False)
        except Exception as e:
            print("ERROR:", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, out.stderr
    assert "batchpart_potrf" in out.stdout and "not initialized" in out.stdout


# ---- potrf -------------------------------------------------------------------------


@HYPOTHESIS
@given(batch=batch_shapes, n=st.integers(0, 6), dtype=dtypes, lower=st.booleans(), seed=seeds)
def test_potrf_matches_numpy(batch, n, dtype, lower, seed):
    a = hermitian_pd(np.random.default_rng(seed), batch, n, dtype)
    factor, info = potrf(a, lower=lower)
    assert factor.shape == a.shape and factor.dtype == dtype
    assert info.shape == batch and info.dtype == np.int32 and not info.any()
    expected = np.linalg.cholesky(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64))
    if not lower:
        expected = herm(expected)
    assert_close(factor, expected, dtype, scale_of(a))
    other = np.triu(factor, 1) if lower else np.tril(factor, -1)
    assert not other.any()  # the other triangle is zeroed


@HYPOTHESIS
@given(batch=batch_shapes, n=st.integers(0, 6), dtype=dtypes, lower=st.booleans(), seed=seeds)
def test_potrf_symmetrize_factors_the_hermitian_part(batch, n, dtype, lower, seed):
    """symmetrize=True factors (A + A^H) / 2, reading both triangles."""
    rng = np.random.default_rng(seed)
    a = hermitian_pd(rng, batch, n, dtype)
    skew = random(rng, a.shape, dtype)
    perturbed = (a + (skew - herm(skew)) / 4).astype(dtype)  # same Hermitian part
    factor, info = potrf(perturbed, lower=lower, symmetrize=True)
    assert not info.any()
    expected = np.linalg.cholesky(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64))
    assert_close(factor, expected if lower else herm(expected), dtype, scale_of(a))


@pytest.mark.parametrize("dtype", DTYPES)
def test_potrf_not_positive_definite_gives_nan_in_that_element_only(dtype):
    a = hermitian_pd(np.random.default_rng(0), (4,), 5, dtype)
    a[2] = -a[2]  # negative definite
    factor, info = potrf(a)
    assert info[2] > 0 and np.isnan(factor[2]).all()
    ok = [0, 1, 3]
    assert not info[ok].any()
    assert_close(factor[ok] @ herm(factor[ok]), a[ok], dtype, scale_of(a))


# ---- getrf -------------------------------------------------------------------------


def split_lu(lu):
    *_, m, n = lu.shape
    k = min(m, n)
    lower = np.tril(lu[..., :, :k], -1) + np.eye(m, k, dtype=lu.dtype)
    upper = np.triu(lu[..., :k, :])
    return lower, upper


def check_lu(a, lu, pivots, perm, info):
    """`lu` factors `a` as LAPACK would: A[perm] = L U, scipy's pivots."""
    *batch, m, n = a.shape
    k = min(m, n)
    dtype = a.dtype
    assert lu.shape == a.shape and pivots.shape == (*batch, k) and perm.shape == (*batch, m)
    assert not info.any()
    lower, upper = split_lu(lu)
    permuted = np.take_along_axis(a, perm[..., :, None].astype(np.int64), axis=-2)
    assert_close(lower @ upper, permuted, dtype, scale_of(a))
    for index in np.ndindex(*batch):
        assert sorted(perm[index]) == list(range(m))
        if k:
            _, expected_piv = scipy.linalg.lu_factor(a[index].astype(np.complex128))
            assert list(pivots[index]) == list(expected_piv)


@LAYOUTS
@HYPOTHESIS
@given(batch=batch_shapes, m=st.integers(0, 6), n=st.integers(0, 6), dtype=dtypes, seed=seeds)
def test_getrf_reconstructs_and_matches_scipy_pivots(row_major, batch, m, n, dtype, seed):
    a = random(np.random.default_rng(seed), (*batch, m, n), dtype)
    check_lu(a, *getrf(a, row_major))


# The row-major kernel factors up to 64x64 itself and hands larger matrices,
# transposed, to LAPACK (cc/lapack/lu_steps.h): both sides of the switch.
@pytest.mark.parametrize("m, n", [(64, 64), (65, 65), (64, 90), (90, 64), (130, 20), (20, 130)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_major_getrf_on_both_sides_of_its_size_switch(m, n, dtype):
    a = random(np.random.default_rng(m * n), (2, m, n), dtype)
    check_lu(a, *getrf(a, row_major=True))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_singular_keeps_factors_and_reports_info(row_major, dtype):
    a = random(np.random.default_rng(1), (3, 4, 4), dtype)
    a[1, :, 2] = 0  # column 3 is zero: U[2, 2] == 0
    lu, _, perm, info = getrf(a, row_major)
    assert info[1] == 3 and info[0] == 0 and info[2] == 0
    assert np.isfinite(lu).all()
    lower, upper = split_lu(lu)
    permuted = np.take_along_axis(a, perm[..., :, None].astype(np.int64), axis=-2)
    assert_close(lower @ upper, permuted, dtype, scale_of(a))


# ---- qr ----------------------------------------------------------------------------


@LAYOUTS
@HYPOTHESIS
@given(batch=batch_shapes, m=st.integers(0, 6), n=st.integers(0, 6), dtype=dtypes,
       full=st.booleans(), seed=seeds)
def test_qr_reconstructs(row_major, batch, m, n, dtype, full, seed):
    a = random(np.random.default_rng(seed), (*batch, m, n), dtype)
    q, r = qr(a, full_matrices=full, row_major=row_major)
    cols = m if full else min(m, n)
    assert q.shape == (*batch, m, cols) and r.shape == (*batch, cols, n)
    assert_close(q @ r, a, dtype, scale_of(a))
    assert_close(herm(q) @ q, np.broadcast_to(np.eye(cols), q.shape[:-2] + (cols, cols)), dtype,
                 max(m, 1))
    assert not np.tril(r, -1).any()


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5)])
def test_qr_matches_numpy_up_to_signs(row_major, dtype, shape):
    a = random(np.random.default_rng(2), (2, *shape), dtype)
    for full in (False, True):
        _, r = qr(a, full_matrices=full, row_major=row_major)
        expected = np.linalg.qr(a, mode="complete" if full else "reduced").R
        assert_close(np.abs(r), np.abs(expected), dtype, scale_of(a))


# The row-major kernel runs its own Householder QR on real matrices up to
# 128 x 128 (min(m, n) and m * max(n, q columns)) and LAPACK's LQ of A^T on
# the rest (cc/lapack/qr_steps.h). Both take LAPACK's reflectors and signs,
# so Q and R equal numpy's (geqrf + orgqr), not only up to signs. The shapes
# cover both sides of the switch, every width of the last column block, and
# tall, wide, full and reduced.
QR_SWITCH_SHAPES = [(1, 1), (8, 8), (17, 5), (5, 17), (64, 64), (63, 100), (100, 63), (128, 128),
                    (129, 129), (128, 1), (1, 200), (100, 17), (130, 17), (300, 40)]


@pytest.mark.parametrize("m, n", QR_SWITCH_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_major_qr_equals_lapacks_on_both_sides_of_its_switch(m, n, dtype):
    a = random(np.random.default_rng(m * 1000 + n), (2, m, n), dtype)
    for full in (False, True):
        q, r = qr(a, full_matrices=full, row_major=True)
        expected = np.linalg.qr(a, mode="complete" if full else "reduced")
        assert_close(r, expected.R, dtype, scale_of(a))
        assert_close(q, expected.Q, dtype, max(m, n))


# Squares of these underflow or overflow in the kernel's own type; its
# norms must not (LAPACK's nrm2 scales; the row-major kernel sums in double
# and scales doubles out of double's range).
@pytest.mark.parametrize("dtype, magnitude", [(np.float32, 1e-30), (np.float32, 1e30),
                                              (np.float64, 1e-300), (np.float64, 1e300)])
@pytest.mark.parametrize("n", [8, 64, 200])
def test_row_major_qr_of_extreme_magnitudes(dtype, magnitude, n):
    rng = np.random.default_rng(n)
    a = (random(rng, (2, n, n), np.float64) * magnitude).astype(dtype)
    q, r = qr(a, row_major=True)
    assert np.isfinite(q).all() and np.isfinite(r).all()
    assert_close(q @ r, a, dtype, scale_of(a))
    assert_close(herm(q) @ q, np.broadcast_to(np.eye(n), q.shape), dtype, n)


@pytest.mark.parametrize("n", [8, 200])
@pytest.mark.parametrize("fill", [np.nan, np.inf])
def test_row_major_qr_garbage_stays_in_its_element(n, fill):
    a = random(np.random.default_rng(3), (3, n, n), np.float32)
    a[1, n // 2, 1] = fill
    q, r = qr(a, row_major=True)
    assert np.isnan(q[1]).any() or np.isnan(r[1]).any()
    ok = [0, 2]
    assert_close(q[ok] @ r[ok], a[ok], np.float32, scale_of(a[ok]))


# ---- eigh --------------------------------------------------------------------------


@HYPOTHESIS
@given(batch=batch_shapes, n=st.integers(0, 6), dtype=dtypes, lower=st.booleans(), seed=seeds)
def test_eigh_reconstructs(batch, n, dtype, lower, seed):
    rng = np.random.default_rng(seed)
    x = random(rng, (*batch, n, n), dtype)
    a = ((x + herm(x)) / 2).astype(dtype)
    # The triangle eigh must not read holds garbage.
    garbled = np.where(unread_triangle(n, lower), np.asarray(np.nan, dtype), a)
    w, v, info = eigh(garbled, lower=lower)
    assert w.dtype == real_dtype(dtype) and w.shape == (*batch, n) and v.shape == a.shape
    assert not info.any()
    assert_close(w, np.linalg.eigvalsh(a), dtype, scale_of(a))
    assert_close((v * w[..., None, :]) @ herm(v), a, dtype, scale_of(a))
    assert_close(herm(v) @ v, np.broadcast_to(np.eye(n), a.shape), dtype, max(n, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_eigh_values_only(dtype):
    x = random(np.random.default_rng(3), (3, 4, 4), dtype)
    a = (x + herm(x)) / 2
    w, v, info = eigh(a, compute_vectors=False)
    assert v.shape == (3, 4, 0) and not info.any()
    assert_close(w, np.linalg.eigvalsh(a), dtype, scale_of(a))


# ---- svd ---------------------------------------------------------------------------


@HYPOTHESIS
@given(batch=batch_shapes, m=st.integers(0, 6), n=st.integers(0, 6), dtype=dtypes,
       full=st.booleans(), seed=seeds)
def test_svd_reconstructs(batch, m, n, dtype, full, seed):
    a = random(np.random.default_rng(seed), (*batch, m, n), dtype)
    s, u, vt, info = svd(a, full_matrices=full)
    k = min(m, n)
    assert s.dtype == real_dtype(dtype) and s.shape == (*batch, k) and not info.any()
    assert u.shape == (*batch, m, m if full else k)
    assert vt.shape == (*batch, n if full else k, n)
    assert_close(s, np.linalg.svd(a, compute_uv=False), dtype, scale_of(a))
    assert_close((u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :], a, dtype, scale_of(a))
    eye = np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] + (u.shape[-1],) * 2)
    assert_close(herm(u) @ u, eye, dtype, max(m, 1))
    assert_close(vt @ herm(vt),
                 np.broadcast_to(np.eye(vt.shape[-2]), vt.shape[:-2] + (vt.shape[-2],) * 2),
                 dtype, max(n, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_svd_values_only(dtype):
    a = random(np.random.default_rng(4), (2, 5, 3), dtype)
    s, u, vt, info = svd(a, compute_uv=False)
    assert u.shape == (2, 5, 0) and vt.shape == (2, 0, 3) and not info.any()
    assert_close(s, np.linalg.svd(a, compute_uv=False), dtype, scale_of(a))


def test_svd_of_empty_matrix_gives_identities():
    s, u, vt, info = svd(np.zeros((2, 3, 0)), full_matrices=True)
    assert s.shape == (2, 0) and not info.any()
    np.testing.assert_array_equal(u, np.broadcast_to(np.eye(3), (2, 3, 3)))
    assert vt.shape == (2, 0, 0)


# ---- trsm --------------------------------------------------------------------------


def triangular(rng, shape, dtype, lower):
    n = shape[-1]
    a = random(rng, shape, dtype) + 2 * n * np.eye(n, dtype=dtype)  # well conditioned
    return np.tril(a) if lower else np.triu(a)


def trsm_reference(a, b, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    n = a.shape[-1]
    tri = np.where(unread_triangle(n, lower), 0, a)
    if unit_diagonal:
        tri = tri - tri * np.eye(n) + np.eye(n)
    op = np.swapaxes(tri, -1, -2) if transpose_a else tri
    op = np.conj(op) if conjugate_a else op
    batch = broadcast_batch(a, b)
    op = np.broadcast_to(op, (*batch, n, n))
    if left_side:
        return np.linalg.solve(op, np.broadcast_to(b, (*batch, *b.shape[-2:])))
    bt = np.swapaxes(np.broadcast_to(b, (*batch, *b.shape[-2:])), -1, -2)
    return np.swapaxes(np.linalg.solve(np.swapaxes(op, -1, -2), bt), -1, -2)


@LAYOUTS
@HYPOTHESIS
@given(batch=batch_shapes, p=st.integers(0, 5), q=st.integers(0, 4), dtype=dtypes,
       flags=st.tuples(*[st.booleans()] * 5), broadcast=st.sampled_from(["none", "a", "b"]),
       seed=seeds)
def test_trsm_matches_numpy(row_major, batch, p, q, dtype, flags, broadcast, seed):
    left_side, lower, transpose_a, conjugate_a, unit_diagonal = flags
    rng = np.random.default_rng(seed)
    a_batch = batch[1:] if broadcast == "a" else batch  # a broadcast over the leading dim
    b_batch = (1,) * len(batch) if broadcast == "b" else batch
    a = triangular(rng, (*a_batch, p, p), dtype, lower)
    # The triangle trsm must not read holds garbage.
    a = np.where(unread_triangle(p, lower), np.asarray(np.nan, dtype), a)
    b = random(rng, (*b_batch, p, q) if left_side else (*b_batch, q, p), dtype)
    x = trsm(a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
             conjugate_a=conjugate_a, unit_diagonal=unit_diagonal, row_major=row_major)
    expected = trsm_reference(a, b, *flags)
    assert x.shape == expected.shape
    assert_close(x, expected, dtype, scale_of(b))


# The row-major kernel substitutes on rows for real left-side solves up to
# 16x16 and calls BLAS otherwise (cc/lapack/triangular_solve.cc): every flag
# on both sides of the switch. NaN fills what must not be read: the other
# triangle, and the diagonal when it is unit.
@pytest.mark.parametrize("p", [1, 8, 16, 17])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=5)),
                         ids=lambda f: "".join("LlTCU"[i] if v else "-" for i, v in enumerate(f)))
def test_row_major_trsm_on_both_sides_of_its_substitution_switch(p, dtype, flags):
    left_side, lower, transpose_a, conjugate_a, unit_diagonal = flags
    rng = np.random.default_rng(p)
    a = triangular(rng, (2, p, p), dtype, lower)
    unread = unread_triangle(p, lower) | (np.eye(p, dtype=bool) if unit_diagonal else False)
    a = np.where(unread, np.asarray(np.nan, dtype), a)
    b = random(rng, (2, p, 3) if left_side else (2, 3, p), dtype)
    x = trsm(a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
             conjugate_a=conjugate_a, unit_diagonal=unit_diagonal, row_major=True)
    assert_close(x, trsm_reference(np.where(unread, 0, a), b, *flags), dtype, scale_of(b))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_trsm_broadcasts_both_operands(row_major, dtype):
    rng = np.random.default_rng(5)
    a = triangular(rng, (1, 3, 4, 4), dtype, lower=True)
    b = random(rng, (2, 1, 4, 2), dtype)
    x = trsm(a, b, row_major=row_major)
    assert x.shape == (2, 3, 4, 2)
    assert_close(x, trsm_reference(a, b, True, True, False, False, False), dtype, scale_of(b))


# ---- gesv --------------------------------------------------------------------------


@LAYOUTS
@HYPOTHESIS
@given(batch=batch_shapes, n=st.integers(0, 5), r=st.integers(0, 3), dtype=dtypes,
       broadcast=st.sampled_from(["none", "a", "b"]), seed=seeds)
def test_gesv_matches_numpy(row_major, batch, n, r, dtype, broadcast, seed):
    rng = np.random.default_rng(seed)
    a_batch = (1,) * len(batch) if broadcast == "a" else batch
    b_batch = batch[1:] if broadcast == "b" else batch
    a = (random(rng, (*a_batch, n, n), dtype) + 2 * n * np.eye(n)).astype(dtype)
    b = random(rng, (*b_batch, n, r), dtype)
    x, info = gesv(a, b, row_major)
    out_batch = broadcast_batch(a, b)
    assert x.shape == (*out_batch, n, r) and info.shape == out_batch and not info.any()
    expected = np.linalg.solve(np.broadcast_to(a, (*out_batch, n, n)),
                               np.broadcast_to(b, (*out_batch, n, r)))
    assert_close(x, expected, dtype, scale_of(b))


@LAYOUTS
@pytest.mark.parametrize("dtype", DTYPES)
def test_gesv_singular_gives_nan_in_that_element_only(row_major, dtype):
    rng = np.random.default_rng(6)
    a = (random(rng, (3, 4, 4), dtype) + 8 * np.eye(4)).astype(dtype)
    a[0, 1] = 0  # a zero row
    b = random(rng, (3, 4, 2), dtype)
    x, info = gesv(a, b, row_major)
    assert info[0] > 0 and np.isnan(x[0]).all()
    assert not info[1:].any()
    assert_close(x[1:], np.linalg.solve(a[1:], b[1:]), dtype, scale_of(b))


@LAYOUTS
def test_gesv_shared_matrix_many_right_hand_sides(row_major):
    """One A broadcast over a batch of b: factored once per chunk, still right."""
    rng = np.random.default_rng(7)
    a = (random(rng, (6, 6), np.float64) + 12 * np.eye(6))[None]
    b = random(rng, (500, 6, 3), np.float64)
    x, info = gesv(a, b, row_major)
    assert not info.any()
    assert_close(x, np.linalg.solve(a, b), np.float64, scale_of(b))


# The row-major solve factors up to 64x64 itself and larger matrices through
# LAPACK (cc/lapack/lu_steps.h); the substitution is its own at every size.
@pytest.mark.parametrize("n, r", [(64, 1), (64, 64), (65, 3), (100, 130)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_major_gesv_on_both_sides_of_its_size_switch(n, r, dtype):
    rng = np.random.default_rng(n + r)
    a = random(rng, (2, n, n), dtype)
    b = random(rng, (2, n, r), dtype)
    x, info = gesv(a, b, row_major=True)
    assert not info.any()
    assert_close(a @ x, b, dtype, n * np.abs(a).max() * np.abs(x).max())


# ---- garbage (padding rows) never fails the call ----------------------------------

GARBAGE = [np.nan, np.inf, -np.inf, 1e30, 0.0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fill", GARBAGE)
def test_garbage_batch_elements_do_not_fail_the_call(dtype, fill):
    rng = np.random.default_rng(8)
    n = 4
    spd = hermitian_pd(rng, (3,), n, dtype)
    gen = random(rng, (3, n, n), dtype) + 2 * n * np.eye(n, dtype=dtype)
    rhs = random(rng, (3, n, 2), dtype)
    spd[1] = fill
    gen[1] = fill
    ok = [0, 2]

    factor, info = potrf(spd)
    assert_close(factor[ok], np.linalg.cholesky(spd[ok]), dtype, scale_of(spd[ok]))

    lu, _, perm, info = getrf(gen)
    assert not info[ok].any()

    q, r = qr(gen)
    assert_close(q[ok] @ r[ok], gen[ok], dtype, scale_of(gen[ok]))

    w, v, info = eigh(spd)
    assert not info[ok].any()
    assert_close(w[ok], np.linalg.eigvalsh(spd[ok]), dtype, scale_of(spd[ok]))
    if not np.isfinite(fill):
        assert info[1] == -4 and np.isnan(w[1]).all() and np.isnan(v[1]).all()

    s, u, vt, info = svd(gen)
    assert not info[ok].any()
    assert_close(s[ok], np.linalg.svd(gen[ok], compute_uv=False), dtype, scale_of(gen[ok]))
    if not np.isfinite(fill):
        assert info[1] == -4 and np.isnan(s[1]).all()

    x = trsm(np.tril(gen), rhs)
    assert_close(x[ok], np.linalg.solve(np.tril(gen[ok]), rhs[ok]), dtype, scale_of(rhs))

    x, info = gesv(gen, rhs)
    assert not info[ok].any()
    assert_close(x[ok], np.linalg.solve(gen[ok], rhs[ok]), dtype, scale_of(rhs))


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_random_garbage_everywhere_never_fails(dtype):
    rng = np.random.default_rng(9)
    values = np.array(GARBAGE + [1e-30, -1.0, 3.0])
    a = values[rng.integers(0, len(values), (16, 5, 5))].astype(dtype)
    b = values[rng.integers(0, len(values), (16, 5, 2))].astype(dtype)
    potrf(a), getrf(a), qr(a, True), eigh(a), svd(a, True), trsm(a, b), gesv(a, b)


# ---- bad shapes are errors, not crashes --------------------------------------------

TRSM_ATTRS = {"left_side": True, "lower": True, "transpose_a": False, "conjugate_a": False,
              "unit_diagonal": False}
POTRF_ATTRS = {"lower": True, "symmetrize": False}
BAD_CALLS = [
    # (target, operands, results, attrs, message fragment)
    ("batchpart_potrf", [np.ones((2, 3, 4))],
     [matrix((2, 3, 4), np.float64), array((2,), np.int32)], POTRF_ATTRS, "square"),
    ("batchpart_potrf", [np.ones((2, 3, 3))],
     [matrix((2, 4, 4), np.float64), array((2,), np.int32)], POTRF_ATTRS, "(2, 4, 4)"),
    ("batchpart_potrf", [np.ones((2, 3, 3))],
     [matrix((2, 3, 3), np.float32), array((2,), np.int32)], POTRF_ATTRS, "float32"),
    ("batchpart_potrf", [np.ones((2, 3, 3))],
     [matrix((2, 3, 3), np.float64), array((2,), np.float32)], POTRF_ATTRS, "info"),
    ("batchpart_potrf", [np.ones((3, 3), np.int32)],
     [matrix((3, 3), np.int32), array((), np.int32)], POTRF_ATTRS, "unsupported dtype int32"),
    ("batchpart_potrf", [np.ones((3,))], [array((3,), np.float64), array((), np.int32)],
     POTRF_ATTRS, "rank >= 2"),
    ("batchpart_getrf", [np.ones((4, 3))],
     [matrix((4, 3), np.float64), array((4,), np.int32), array((4,), np.int32),
      array((), np.int32)], {}, "pivots"),
    ("batchpart_qr", [np.ones((4, 3))], [matrix((4, 3), np.float64), matrix((3, 3), np.float64)],
     {"full_matrices": True}, "(4, 4)"),
    ("batchpart_qr_row_major", [np.ones((4, 3))],
     [matrix((4, 3), np.float64), matrix((3, 3), np.float64)], {"full_matrices": True}, "(4, 4)"),
    ("batchpart_eigh", [np.ones((3, 3), np.complex64)],
     [array((3,), np.complex64), matrix((3, 3), np.complex64), array((), np.int32)],
     {"lower": True, "compute_vectors": True}, "eigenvalues"),
    ("batchpart_eigh", [np.ones((3, 3))],
     [array((3,), np.float64), matrix((3, 3), np.float64), array((), np.int32)],
     {"lower": True, "compute_vectors": False}, "(3, 0)"),
    ("batchpart_svd", [np.ones((4, 3))],
     [array((3,), np.float64), matrix((4, 3), np.float64), matrix((3, 3), np.float64),
      array((), np.int32)], {"full_matrices": True, "compute_uv": True}, "result u"),
    ("batchpart_trsm", [np.eye(3)[None].repeat(2, 0), np.ones((3, 3, 2))],
     [matrix((3, 3, 2), np.float64)], TRSM_ATTRS, "broadcast"),
    ("batchpart_trsm", [np.eye(3), np.ones((4, 2))], [matrix((4, 2), np.float64)], TRSM_ATTRS,
     "does not fit"),
    ("batchpart_gesv", [np.eye(3), np.ones((4, 2))],
     [matrix((4, 2), np.float64), array((), np.int32)], {}, "does not fit"),
    ("batchpart_gesv", [np.eye(3), np.ones((3, 2), np.float32)],
     [matrix((3, 2), np.float64), array((), np.int32)], {}, "operand b has dtype float32"),
]


@pytest.mark.parametrize("target, operands, results, attrs, fragment", BAD_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_shapes_raise_with_the_kernels_message(target, operands, results, attrs, fragment):
    with pytest.raises(jax.errors.JaxRuntimeError) as excinfo:
        ffi(target, operands, results, **attrs)
    message = str(excinfo.value)
    assert target in message and "INVALID_ARGUMENT" in message
    assert fragment in message


# ---- threading ---------------------------------------------------------------------


def test_num_chunks_policy():
    assert _core.lapack.num_chunks(10_000, 1e4, 2) > 1  # many small matrices
    assert _core.lapack.num_chunks(10_000, 1e4, 1) == 1  # no pool
    assert _core.lapack.num_chunks(10_000, 20, 8) == 1  # tiny matrices contend
    # Large matrices: one per chunk, however they share out (BLAS never
    # threads inside a call, whose bits would then depend on the batch).
    assert _core.lapack.num_chunks(8, 1e8, 2) == 8
    assert _core.lapack.num_chunks(9, 1e8, 2) == 9
    assert _core.lapack.num_chunks(3, 1e8, 2) == 3
    assert _core.lapack.num_chunks(6, 1e8, 4) == 6
    assert _core.lapack.num_chunks(3, 1e3, 8) == 1  # too little work in all
    assert _core.lapack.num_chunks(1, 1e5, 8) == 1
    assert _core.lapack.num_chunks(10_000, 1e4, 4) <= 16


@pytest.mark.parametrize("threads", [2, 3, 4, 8])
@pytest.mark.parametrize("batch, flops", [(256, 2730), (256, 4e3), (100, 1e4), (37, 5e4), (5, 4e5)])
def test_chunks_share_out_evenly_over_the_threads(threads, batch, flops):
    # Chunks are claimed one at a time; with 3 chunks on 2 threads one thread
    # does two of them while the other waits (256 groups of 16 interleaved
    # 8 x 8 float32 Cholesky factors: 2730 flops each, 3 affordable chunks).
    chunks = _core.lapack.num_chunks(batch, flops, threads)
    assert chunks == 1 or chunks < threads or chunks % threads == 0, chunks


@pytest.fixture
def serial_then_restore():
    yield lambda enabled: _core.lapack.set_intra_op_parallelism(enabled)
    _core.lapack.set_intra_op_parallelism(True)


@pytest.mark.parametrize("batch, n", [(600, 16), (4, 192)], ids=["small", "large"])
def test_thread_pool_and_serial_loops_agree(serial_then_restore, batch, n):
    rng = np.random.default_rng(10)
    spd = hermitian_pd(rng, (batch,), n, np.float64)
    gen = random(rng, (batch, n, n), np.complex128)
    rhs = random(rng, (batch, n, 2), np.complex128)
    assert _core.lapack.num_chunks(batch, n**3 / 3, 2) > 1

    def run():
        return potrf(spd), svd(gen), gesv(gen, rhs), eigh(spd)

    serial_then_restore(False)
    serial = run()
    serial_then_restore(True)
    pooled = run()
    # Every loop runs BLAS on one thread, whichever thread runs a matrix.
    for s_out, p_out in zip(jax.tree.leaves(serial), jax.tree.leaves(pooled), strict=True):
        np.testing.assert_array_equal(s_out, p_out)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.sampled_from([64, 200, 1024, 3000]), min_size=2, max_size=6),
       seed=st.integers(0, 2**16))
def test_concurrent_batch_loops_on_the_pool_finish_with_the_serial_bits(
        serial_then_restore, batches, seed):
    # Several host threads run batch loops on the one intra-op pool at once:
    # each caller claims chunks, then waits (spinning, then asleep) for the
    # chunks pool threads claimed. A lost wake-up would hang here (the test
    # timeout); a chunk run twice or skipped would change the bits, which the
    # interleaved kernels make the same whichever thread runs a group.
    rng = np.random.default_rng(seed)
    operands = [hermitian_pd(rng, (b,), 8, np.float32) for b in batches]

    def run(a):
        return potrf(a), getrf(a)

    serial_then_restore(False)
    serial = [run(a) for a in operands]
    serial_then_restore(True)
    assert _core.lapack.num_chunks(3000 // 16, 16 * 8**3, 2) > 1
    with concurrent.futures.ThreadPoolExecutor(len(operands)) as pool:
        pooled = list(pool.map(run, operands))
    for s_out, p_out in zip(jax.tree.leaves(serial), jax.tree.leaves(pooled), strict=True):
        np.testing.assert_array_equal(s_out, p_out)
