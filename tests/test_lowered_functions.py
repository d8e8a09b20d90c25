"""The jnp functions a description names, as an exported program carries
them (``_vocab/lowered_functions``): a function exported over one leading
batch dim of any size and restored is called on one element, and under any
number of vmaps, as the function it came from; a registry adopts what a
call carries and refuses, naming the target, what it cannot read."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from batchpart._vocab import lowered_functions as lf
from batchpart._vocab.dims import user_combiner

S = jax.ShapeDtypeStruct
WEIGHTS = np.array([1.0, -2.0, 0.5], np.float32)   # a constant the function closes over


def blend(a, b):
  """Two (vector, count) pairs: a weighted max and a sum."""
  (va, na), (vb, nb) = a, b
  return jnp.maximum(va * WEIGHTS, vb), na + nb


TYPES = (S((3,), np.float32), S((), np.int32))


def _pairs(rng, *lead):
  return (rng.normal(size=(*lead, 3)).astype(np.float32),
          rng.integers(0, 9, lead).astype(np.int32))


def test_a_restored_function_equals_its_source_on_one_element_and_under_vmaps():
  restored, types = lf.restore_batched(lf.export_batched(blend, "cpu", False, TYPES, TYPES))
  assert types == (TYPES, TYPES)
  rng = np.random.default_rng(0)
  one, other = _pairs(rng), _pairs(rng)
  stacked, more = _pairs(rng, 5), _pairs(rng, 2, 5)
  cases = [
      (lambda f: jax.jit(f), (one, other)),
      (lambda f: jax.jit(jax.vmap(f)), (stacked, _pairs(rng, 5))),
      (lambda f: jax.jit(jax.vmap(f, in_axes=(0, None))), (stacked, one)),
      (lambda f: jax.jit(jax.vmap(jax.vmap(f), in_axes=(1, 0))),
       (jax.tree.map(lambda x: np.swapaxes(x, 0, 1), more), _pairs(rng, 2, 5))),
      (lambda f: jax.jit(jax.vmap(f)), (_pairs(rng, 0), _pairs(rng, 0))),
  ]
  for wrap, args in cases:
    got, want = wrap(restored)(*args), wrap(blend)(*args)
    for g, w in zip(got, want):
      assert g.shape == w.shape and g.dtype == w.dtype
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_carried_combiner_is_adopted_with_its_index_results():
  def first_max(a, b):
    (va, ia), (vb, ib) = a, b
    take_b = vb > va
    return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

  types = (S((), np.float32), S((), np.int32))
  name = user_combiner.lowered_name("t", user_combiner.Combiner(first_max, index_results=(1,)),
                                    types)
  text = user_combiner.COMBINERS.carried(name, "cpu")
  fresh = lf.Registry(user_combiner.OP_PREFIX, "merges", user_combiner._carry,
                      user_combiner._restore)
  fresh.adopt(name, text, "t")
  reg = fresh.get(name, "t")
  assert reg.element_types == types and reg.combiner.index_results == (1,)
  assert not reg.x64 and fresh.carried(name, "cuda") == text   # carried on as it came
  a, b = (np.float32(1), np.int32(4)), (np.float32(1), np.int32(9))
  assert [int(v) for v in reg.combiner.merge(a, b)] == [1, 4]   # a tie: the earlier wins


@pytest.mark.parametrize("name, text, why", [
    ("merge_0123456789abcdef", "{", "Expecting property name"),
    ("merge_0123456789abcdef", json.dumps({"version": 99}), "format 99, this batchpart "
                                                             "reads 1"),
    ("scan_0123456789abcdef", json.dumps({"version": 1}), "not a name of the form merge_"),
    ("merge_0123456789abcdef", json.dumps({"version": 1, "merge": "bm90IGFuIGFydGlmYWN0",
                                           "index_results": [], "x64": False}), ""),
])
def test_what_a_registry_cannot_read_is_refused_naming_the_target(name, text, why):
  registry = lf.Registry(user_combiner.OP_PREFIX, "merges its parts with the Combiner",
                         user_combiner._carry, user_combiner._restore)
  with pytest.raises(ValueError, match=f"the exported call to 'my_target' carries '{name}', "
                                       f"which this batchpart cannot read: .*{why}"):
    registry.adopt(name, text, "my_target")


def test_what_this_process_declares_wins_over_what_an_artifact_brought():
  """The name is not checked against what an artifact carries under it: a
  function this process lowers itself under that name replaces it, and is
  what it carries on."""
  def registry():
    return lf.Registry(user_combiner.OP_PREFIX, "merges", user_combiner._carry,
                       user_combiner._restore)

  def entry(merge):
    return user_combiner.Registered(user_combiner.Combiner(merge), (S((), np.float32),),
                                    False)

  elsewhere = registry()
  name = elsewhere.name("theirs", lambda: ("one text", entry(lambda a, b: (a[0] * b[0],))))
  here = registry()
  here.adopt(name, elsewhere.carried(name, "cpu"), "t")
  own = entry(lambda a, b: (a[0] + b[0],))
  assert here.name("mine", lambda: ("one text", own)) == name
  assert here.get(name, "t") is own
  assert here.carried(name, "cpu") != elsewhere.carried(name, "cpu")
