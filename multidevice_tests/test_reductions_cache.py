"""Reductions across processes that share jax's persistent compilation cache:
a program whose reduced dim is combined by sum, then the same program
declared with max, then sum again, each in a fresh process reading the cache
the others wrote. The reduction is part of the call's derived name, so no
process can load the other's executable. The kernel is declared through
``bp.ffi_lowering`` with a three-parameter ``shard_attributes`` rule that
restates its ``rows`` attribute from the local size of the reduced dim (the
kernel fails on a wrong count)."""

import textwrap

import pytest

from helpers import run_sharing_a_cache

SCRIPT = textwrap.dedent("""
    op = sys.argv[2]
    p = compat.Primitive("cached_reduce_rows")
    p.def_abstract_eval(lambda x, w, **_: compat.ShapedArray(x.shape[:1] + x.shape[2:],
                                                            x.dtype))
    mlir.register_lowering(p, bp.ffi_lowering(
        "batchpart_test_reduce_rows", signature="(n,k),(n)->(k)", reduce={"n": op},
        shard_attributes=lambda attrs, batch, core: {"rows": np.int64(core["n"])}))
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 64, 3)).astype(np.float32)
    w = rng.normal(size=(4, 64)).astype(np.float32)
    xs = jax.device_put(x, NamedSharding(mesh, P("a", "b")))
    ws = jax.device_put(w, NamedSharding(mesh, P("a", "b")))
    f = jax.jit(lambda x, w: p.bind(x, w, op=np.int64(testing.REDUCE_OPS[op]),
                                    rows=np.int64(64)))
    text = f.lower(xs, ws).compile().as_text()
    assert text.count(" all-reduce(") == 1, text
    np.testing.assert_allclose(np.asarray(f(xs, ws)),
                               testing.reduce_rows_reference(x, w, op), rtol=1e-5, atol=1e-5)
""")


@pytest.mark.timeout(400)
def test_the_persistent_cache_keeps_reductions_apart(tmp_path):
  run_sharing_a_cache(SCRIPT, tmp_path, ("sum", "max", "sum"), timeout=300)
