"""Halo dims across processes that share jax's persistent compilation cache:
one stencil (its own window lo = hi = 1) declared with the halo 1, then 2,
then 1 again through ``bp.partition_ffi_target``, each in a fresh process
reading the cache the others wrote. The programs differ only in the declared
halo, which is part of the call's derived name: no process may load
another's executable (its windows would be the other width)."""

import textwrap

import pytest

from helpers import run_sharing_a_cache

SCRIPT = textwrap.dedent("""
    width = int(sys.argv[2])
    S = jax.ShapeDtypeStruct
    attrs = dict(rank=np.int64(1), lo=np.int64(1), hi=np.int64(1), mode=np.int64(1))
    package = lambda x: jax.ffi.ffi_call("batchpart_test_stencil", S(x.shape, x.dtype))(
        x, **attrs)
    want = np.asarray(package(np.arange(128, dtype=np.float32).reshape(2, 64)))
    bp.partition_ffi_target("batchpart_test_stencil", signature="(n)->(n)",
                            halo={"n": width})
    mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    x = jax.device_put(np.arange(128, dtype=np.float32).reshape(2, 64),
                       NamedSharding(mesh, P(None, "x")))
    f = jax.jit(package)
    text = f.lower(x).compile().as_text()
    assert f"f32[2,{8 + 2 * width}]" in text, text
    np.testing.assert_array_equal(np.asarray(f(x)), want)
""")


@pytest.mark.timeout(400)
def test_the_persistent_cache_keeps_halo_widths_apart(tmp_path):
  run_sharing_a_cache(SCRIPT, tmp_path, ("1", "2", "1"), timeout=300)
