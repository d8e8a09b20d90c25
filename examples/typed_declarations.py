"""Typed example code: every entry point with every documented form of
``reduce=``, ``halo=`` and ``scan=``.

``mypy`` checks this file with the package (pyproject.toml), so a public
annotation that refuses a documented declaration (a ``bp.Combiner`` as a
reduce op, a ``bp.Halo`` as a width, a dict built beforehand) fails CI.
``tests/test_typing.py`` runs it too: each call is traced, not compiled, on
one device, so that the declarations are also ones the entry points accept.

    python examples/typed_declarations.py
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive

import batchpart as bp
from batchpart import testing

f32 = np.float32
S = jax.ShapeDtypeStruct


def total(x: np.ndarray) -> np.ndarray:
  return x.sum(axis=-1)


def smooth(x: np.ndarray) -> np.ndarray:
  return x  # a stand-in: only the declaration is traced


def running_sum(x: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  out = start[..., None] + np.cumsum(x, axis=-1)
  return out, out[..., -1]


def add_merge(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  return (a[0] + b[0],)


def max_merge(a: tuple[jax.Array, ...], b: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  return (jnp.maximum(a[0], b[0]),)


def host_calls(x: jax.Array, start: jax.Array) -> list[Any]:
  """``bp.pure_callback`` and ``bp.io_callback`` with each kind of declaration."""
  row, rows = S(x.shape[:-1], x.dtype), S(x.shape, x.dtype)
  ops: dict[str, str] = {"n": "sum"}   # built beforehand: dict[str, str]
  widths: dict[str, int] = {"n": 1}
  return [
      bp.pure_callback(total, row, x, signature="(n)->()", reduce={"n": "sum"}),
      bp.pure_callback(total, row, x, signature="(n)->()", reduce=ops),
      bp.pure_callback(total, row, x, signature="(n)->()",
                       reduce={"n": bp.Combiner(add_merge)}),
      bp.pure_callback(smooth, rows, x, signature="(n)->(n)", halo={"n": 1}),
      bp.pure_callback(smooth, rows, x, signature="(n)->(n)", halo=widths),
      bp.pure_callback(smooth, rows, x, signature="(n)->(n)",
                       halo={"n": bp.Halo(1, 2, ends="zero")}),
      bp.pure_callback(running_sum, (rows, row), x, start, signature="(t),()->(t),()",
                       scan={"t": bp.Scan(state=(1, 1), merge=add_merge)}),
      bp.io_callback(running_sum, (rows, row), x, start, signature="(t),()->(t),()",
                     scan={"t": bp.Scan(state=(1, 1))}),
  ]


def kernel_calls(x: jax.Array) -> list[Any]:
  """``bp.ffi_call`` with named ops and a Combiner (``batchpart.testing``'s kernels)."""
  rows = S((*x.shape[:-2], x.shape[-1]), x.dtype)   # x: (..., n, k); n reduced
  w = jnp.ones(x.shape[:-1], x.dtype)
  last = S(x.shape[:-1], x.dtype)                   # over x's last dim
  index = S(x.shape[:-1], np.int32)
  top = (S((*x.shape[:-1], 2), x.dtype), S((*x.shape[:-1], 2), np.int32))
  sum_op, max_op = np.int64(testing.REDUCE_OPS["sum"]), np.int64(testing.REDUCE_OPS["max"])
  return [
      bp.ffi_call("batchpart_test_reduce_rows", rows, signature="(n,k),(n)->(k)",
                  reduce={"n": "sum"})(x, w, op=sum_op, rows=np.int64(-1)),
      bp.ffi_call("batchpart_test_reduce_rows", rows, signature="(n,k),(n)->(k)",
                  reduce={"n": bp.Combiner(max_merge)})(x, w, op=max_op, rows=np.int64(-1)),
      bp.ffi_call("batchpart_test_arg_rows", (last, index), signature="(n)->(),()",
                  reduce={"n": "argmax"})(x, op=np.int64(0)),
      bp.ffi_call("batchpart_test_top_k_rows", top, signature="(n)->(k),(k)",
                  reduce={"n": "min_k"})(x, op=np.int64(1)),
  ]


def adopted(primitive: Primitive | None = None) -> list[Any]:
  """The decorator and the adopting functions take the same declarations."""
  def wrapper(x: jax.Array) -> jax.Array:
    return x

  declared: list[Any] = [
      bp.batch_partitionable(wrapper, signature="(n)->()", reduce={"n": "logsumexp"}),
      bp.batch_partitionable(signature="(n)->(n)", halo={"n": bp.Halo(1, 1, periodic=True)}),
      bp.batch_partitionable(wrapper, signature="(t),()->(t),()",
                             scan={"t": bp.Scan(state=(1, 1))}),
      bp.partition_callback(total, signature="(n)->()", reduce={"n": bp.Combiner(add_merge)}),
      bp.partition_callback(smooth, signature="(n)->(n)", halo={"n": 2}),
      bp.ffi_lowering("typed_example_target", signature="(n)->()", reduce={"n": "argmin"}),
      bp.ffi_lowering("typed_example_target", signature="(n)->(n)", halo={"n": bp.Halo(0, 1)}),
  ]
  bp.partition_ffi_target("typed_example_target", signature="(n),()->(n),()",
                          scan={"n": bp.Scan(state=(1, 1), reverse=True)})
  bp.unpartition("typed_example_target")
  if primitive is not None:
    bp.partition_primitive(primitive, signature="(n)->(k),(k)", reduce={"n": "max_k"})
  return declared


def main() -> int:
  testing.register()
  x = jnp.ones((4, 3, 8), f32)
  start = jnp.zeros((4, 3), f32)
  jax.make_jaxpr(host_calls)(x, start)
  jax.make_jaxpr(kernel_calls)(x)
  adopted()   # partition_primitive needs a primitive with lowering rules: type-checked only
  print("typed declarations: ok")
  return 0


if __name__ == "__main__":
  sys.exit(main())
