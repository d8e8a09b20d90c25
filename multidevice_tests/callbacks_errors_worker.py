"""Runs host-callback programs that fail, on 8 simulated CPU devices, in a
process of its own (test_callbacks_errors.py): a callback failing on the
blocks it is called with once left the devices holding only padding alone in
the collective after it, and XLA ended the process.

    python callbacks_errors_worker.py PARTITIONER CASES_JSON

Each case is a dict: ``api`` (pure, io, buffer, adopted), ``n`` (batch size;
0: a call with no batch dims), ``error`` (None, raise, shape, dtype,
returns) and ``after`` (sum: a collective after the call; none). Prints one
JSON line per case: the error message where the program raised, else
whether its value matched NumPy's.
"""

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_cpu_enable_async_dispatch", False)
jax.config.update("jax_use_shardy_partitioner", sys.argv[1] == "shardy")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import batchpart as bp  # noqa: E402

S = jax.ShapeDtypeStruct
MESH = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
K = 3   # core size: each batch element is a row of K values


def faulty_sin(error):
  """np.sin of a block, or the ``error`` asked for."""
  def faulty_sin(x):
    x = np.asarray(x)
    if error == "raise":
      raise ValueError("no sine today")
    if error == "shape":
      return np.sin(x)[..., :-1]
    if error == "dtype":
      return np.sin(x).astype(np.int32)
    return np.sin(x)
  return faulty_sin


def faulty_sin_in_place(error):
  """np.sin of a block written in place (buffer_callback), or the error."""
  def faulty_sin_in_place(ctx, out, x):
    if error == "raise":
      raise ValueError("no sine today")
    np.asarray(out)[...] = np.sin(np.asarray(x))
    if error == "returns":
      return 0
  return faulty_sin_in_place


def adopted(error):
  """A package's own jax.pure_callback, made per shard by partition_callback."""
  fn = faulty_sin(error)
  bp.partition_callback(fn, num_batch_dims=1, arrays="numpy")
  return lambda x: jax.pure_callback(fn, S(x.shape, x.dtype), x, vmap_method="expand_dims")


def call(case):
  """The callback of ``case`` as a function of the operand."""
  api, error, nb = case["api"], case["error"], 0 if case["n"] == 0 else 1
  if api == "pure":
    return lambda x: bp.pure_callback(faulty_sin(error), S(x.shape, x.dtype), x,
                                      num_batch_dims=nb)
  if api == "io":
    return lambda x: bp.io_callback(faulty_sin(error), S(x.shape, x.dtype), x,
                                    num_batch_dims=nb)
  if api == "buffer":
    return lambda x: bp.buffer_callback(faulty_sin_in_place(error), S(x.shape, x.dtype),
                                        num_batch_dims=nb)(x)
  return adopted(error)


def program(case):
  """The jitted program of ``case``, its operands and NumPy's value (None:
  not compared)."""
  f = call(case)
  if case["n"] == 0:
    # No batch dims: one device calls, the others hold padding; the product
    # with a batch-sharded operand and its sum put an all-reduce after the
    # call. (No value to compare: the other devices' copies of the result
    # are not the caller's.)
    x = np.linspace(0.1, 0.9, K, dtype=np.float32)
    z = jax.device_put(np.ones(8, np.float32), NamedSharding(MESH, P("x")))
    return jax.jit(lambda x, z: jnp.sum(z * jnp.sum(f(x)))), (x, z), None
  x = np.linspace(-2, 2, case["n"] * K, dtype=np.float32).reshape(case["n"], K)
  sharding = NamedSharding(MESH, P("x"))

  def g(x):
    return f(jax.lax.with_sharding_constraint(x, sharding))

  if case["after"] == "sum":
    return jax.jit(lambda x: jnp.sum(g(x))), (x,), np.sum(np.sin(x))
  return jax.jit(g), (x,), np.sin(x)


def run(case) -> dict:
  f, args, expected = program(case)
  try:
    value = np.asarray(f(*args))
  except Exception as e:   # the error the user sees
    return {**case, "raised": type(e).__name__, "message": str(e)}
  return {**case, "raised": None, "matches": None if expected is None else
          bool(np.allclose(value, expected, rtol=1e-5, atol=1e-5))}


def main():
  for case in json.loads(sys.argv[2]):
    print(json.dumps(run(case)), flush=True)
  # The process goes on working after the failures.
  ok = run({"api": "pure", "n": 13, "error": None, "after": "sum"})
  print(json.dumps({**ok, "api": "final"}), flush=True)


if __name__ == "__main__":
  main()
