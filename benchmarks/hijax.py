"""batchpart against a HiJAX primitive whose ``expand`` wraps the FFI call in
``jax.shard_map`` (jax's FFI tutorial's pattern for sharding a foreign call,
Explicit sharding mode), on 8 simulated CPU devices, interleaved in one
process, under Shardy and GSPMD.

The kernel is batchpart's test softmax (``batchpart_test_softmax``: a row-wise
softmax and log-sum-exp, signature ``(n)->(n),()``) on ``(4096, 256)``
float32. Candidates: ``bp.ffi_call``; the HiJAX primitive; a plain
``jax.ffi.ffi_call``; a ``shard_map`` written by hand. Then each candidate on
an input sharded along the *core* dim (``P(None, "x")``): the maximum error
against NumPy, which shows who follows a sharding it was not written for.

  python benchmarks/hijax.py            # prints the markdown tables
  python benchmarks/hijax.py --quick    # (1024, 256), fewer repeats
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _hi_primitive_base():
  """jax's HiJAX primitive base class, under the name this jax gives it."""
  from jax.experimental import hijax
  for name in ("VJPHiPrimitive", "HiPrimitive", "HiPrim"):
    if hasattr(hijax, name):
      return getattr(hijax, name)
  raise RuntimeError("this jax has no HiJAX primitive class")


def _hijax_softmax():
  """The tutorial's pattern for the test softmax: a HiJAX primitive whose
  ``expand`` runs the FFI call inside ``jax.shard_map`` with the output
  specs of the primitive's Explicit-mode result types."""
  import jax

  base = _hi_primitive_base()

  class Softmax(base):
    def __init__(self, aval):
      self.in_avals = (aval,)
      row_spec = jax.P(*tuple(aval.sharding.spec)[:-1])
      self.out_aval = (aval, aval.update(shape=aval.shape[:-1],
                                         sharding=aval.sharding.update(spec=row_spec)))
      self.params = {}
      super().__init__()

    def expand(self, x):
      def body(x):
        return jax.ffi.ffi_call(
            "batchpart_test_softmax",
            (jax.ShapeDtypeStruct(x.shape, x.dtype),
             jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)
      return jax.shard_map(body, out_specs=tuple(a.sharding.spec for a in self.out_aval))(x)

  return lambda x: Softmax(jax.typeof(x))(x)


def main(argv):
  quick = "--quick" in argv
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  sys.path.insert(0, HERE)
  import jax
  import numpy as np
  from _timing import print_comparison, under_both_partitioners
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  from batchpart import testing as kernels

  jax.config.update("jax_cpu_enable_async_dispatch", False)
  kernels.register()
  n = 1024 if quick else 4096
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  x = np.random.default_rng(0).standard_normal((n, 256)).astype(np.float32)
  want = kernels.softmax_reference(x)[0]

  def plain(x):
    return jax.ffi.ffi_call("batchpart_test_softmax",
                            (jax.ShapeDtypeStruct(x.shape, x.dtype),
                             jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)))(x)

  by_hand = jax.shard_map(plain, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x")))
  named = {"bp.ffi_call": kernels.softmax, "HiJAX primitive + shard_map": _hijax_softmax(),
           "jax.ffi.ffi_call": plain, "shard_map by hand": by_hand}

  def candidates():
    return {name: (jax.jit(lambda x, f=f: f(x)[0]),) * 2 for name, f in named.items()}

  check = lambda y: np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, NamedSharding(mesh, P("x")))
    rows = under_both_partitioners(candidates, (xs,), check, repeats=3 if quick else 9)
    print(f"softmax over ({n}, 256) float32 rows, batch-sharded over 8 simulated CPU devices, "
          f"Explicit mode, jax {jax.__version__}\n")
    print_comparison(rows, "bp.ffi_call", "call")
    print("\nthe same input sharded along the row (core) dim, P(None, 'x'): max |error|\n")
    print("| call | max error | note |")
    print("| --- | ---: | --- |")
    xc = jax.device_put(x, NamedSharding(mesh, P(None, "x")))
    for name, (f, _) in candidates().items():
      try:
        err = float(np.max(np.abs(np.asarray(f(xc)) - want)))
        print(f"| {name} | {err:.2g} | |")
      except Exception as e:  # noqa: BLE001 - reported in the table
        print(f"| {name} | - | raises {type(e).__name__}: {str(e).splitlines()[0][:80]} |")


if __name__ == "__main__":
  main(sys.argv[1:])
