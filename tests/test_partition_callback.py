"""bp.partition_callback on one device: which callbacks a declaration
reaches (the function, a partial of it, a bound method by its class's
function, a callable object by its class's __call__), values through jax's
callbacks, vmap, and errors naming the entry point and the argument."""

import functools

import jax
import numpy as np
import pytest

import batchpart as bp
from batchpart._callback import adopt

S = jax.ShapeDtypeStruct


def rowsum(x):
  return np.sum(np.asarray(x), axis=-1)


class Model:
  def log_prob(self, x):
    return -np.sum(np.asarray(x) ** 2, axis=-1)

  def __call__(self, x):
    return np.asarray(x)


@pytest.fixture
def declare():
  names = []
  def declare(fn, **decl):
    bp.partition_callback(fn, **decl)
    names.append(fn)
  yield declare
  for fn in names:
    bp.unpartition(fn)


def test_the_objects_a_declaration_reaches():
  model = Model()
  bound = functools.partial(model.log_prob)
  assert rowsum in list(adopt._candidates(functools.partial(rowsum)))
  assert Model.log_prob in list(adopt._candidates(model.log_prob))
  assert Model.log_prob in list(adopt._candidates(bound))
  assert Model.__call__ in list(adopt._candidates(model))
  assert rowsum not in list(adopt._candidates(model.log_prob))


def test_declared_function_partial_and_method_only(declare):
  declare(rowsum, num_batch_dims=1)
  assert adopt._declared(functools.partial(functools.partial(rowsum))) is not None
  assert adopt._declared(Model().log_prob) is None
  declare(Model.log_prob, num_batch_dims=1)
  assert adopt._declared(Model().log_prob).owner == \
      "batchpart.partition_callback(Model.log_prob)"


def test_one_device_values_match_stock(declare):
  x = np.arange(24, dtype=np.float32).reshape(6, 4)
  f = jax.jit(lambda x: jax.pure_callback(rowsum, S(x.shape[:1], x.dtype), x,
                                          vmap_method="expand_dims"))
  stock = np.asarray(f(x))
  declare(rowsum, num_batch_dims=1)
  np.testing.assert_array_equal(f(x), stock)
  v = jax.jit(jax.vmap(f))(np.stack([x, 2 * x]))
  np.testing.assert_array_equal(v, np.stack([stock, 2 * stock]))


def test_results_as_any_pytree_of_leaves(declare):
  def two(x):
    return {"a": np.asarray(x) * 2, "b": np.sum(np.asarray(x), -1)}

  declare(two, num_batch_dims=1)
  x = np.ones((3, 2), np.float32)
  out = jax.jit(lambda x: jax.pure_callback(
      two, {"a": S(x.shape, x.dtype), "b": S(x.shape[:1], x.dtype)}, x))(x)
  np.testing.assert_array_equal(out["a"], 2 * x)
  np.testing.assert_array_equal(out["b"], [2, 2, 2])


@pytest.mark.parametrize("kwargs, match", [
    ({}, "exactly one of num_batch_dims and signature"),
    ({"num_batch_dims": 1, "signature": "()->()"}, "exactly one"),
    ({"num_batch_dims": -1}, "num_batch_dims"),
    ({"signature": "(n)->(n", }, "signature"),
    ({"signature": "(n)->(m)", "reduce": {"m": "sum"}}, "not a core dim of any operand"),
])
def test_bad_declarations_name_the_entry_point(kwargs, match):
  with pytest.raises(ValueError, match=match) as e:
    bp.partition_callback(rowsum, **kwargs)
  assert "partition_callback(rowsum)" in str(e.value)


def test_not_callable_and_unhashable():
  with pytest.raises(TypeError, match="must be callable"):
    bp.partition_callback(3, num_batch_dims=1)

  class Unhashable:
    __hash__ = None

    def __call__(self, x):
      return x

  with pytest.raises(TypeError, match="hashable"):
    bp.partition_callback(Unhashable(), num_batch_dims=1)


def test_unpartition_of_a_callback_never_declared_names_it():
  with pytest.raises(ValueError, match=r"the callback 'rowsum' is not partitioned.*"
                                       r"partition_callback"):
    bp.unpartition(rowsum)


def test_returns_the_callback_and_the_same_declaration_again_is_a_no_op(declare):
  assert bp.partition_callback(rowsum, num_batch_dims=1) is rowsum
  declare(rowsum, num_batch_dims=1)


def test_a_bad_arrays_value_names_the_entry_point():
  with pytest.raises(ValueError, match=r"partition_callback\(rowsum\): arrays='torch'"):
    bp.partition_callback(rowsum, num_batch_dims=1, arrays="torch")
