"""``bp.Combiner`` on one device: the checks that run before anything does
(index results, the merge's output tree, shapes and dtypes), each naming
the target, the dim and the result; and the derived name, which carries a
digest of the lowered merge, so a changed merge is a new call for jax's
caches and an equal one (a new object) the same call. (Eight devices:
multidevice_tests/test_user_combiner.py.)"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp

S = jax.ShapeDtypeStruct
ARG = "batchpart_test_arg_rows"


def first_max(a, b):
  (va, ia), (vb, ib) = a, b
  take_b = vb > va
  return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)


def call(combiner, index_dtype=np.int32):
  def f(x):
    out = (S(x.shape[:-1], x.dtype), S(x.shape[:-1], index_dtype))
    return bp.ffi_call(ARG, out, signature="(n)->(),()", reduce={"n": combiner})(
        x, op=np.int64(0))
  return f


X = np.array([[1, 5, 5, 2], [0, -1, 3, 3]], np.float32)


def _name(f) -> str:
  return re.search(r"\$x:n=(merge_[0-9a-f]+)", jax.jit(f).lower(X).as_text()).group(1)


def test_one_device_values():
  value, index = jax.jit(call(bp.Combiner(first_max, index_results=(1,))))(X)
  np.testing.assert_array_equal(np.asarray(index), [1, 2])


def test_the_name_digests_the_lowered_merge():
  a = _name(call(bp.Combiner(first_max, index_results=(1,))))
  again = _name(call(bp.Combiner(lambda p, q: first_max(p, q), index_results=(1,))))
  other = _name(call(bp.Combiner(lambda p, q: first_max(q, p), index_results=(1,))))
  assert a == again and a != other


def test_the_name_tells_index_results_apart():
  """The same merge with other index results offsets other results: another
  name, so neither takes the other's offsets (nor an artifact's)."""
  offset = _name(call(bp.Combiner(first_max, index_results=(1,))))
  kept = _name(call(bp.Combiner(first_max)))
  assert offset != kept


def test_an_index_result_must_be_an_integer():
  with pytest.raises(TypeError, match=re.escape(f"batchpart.ffi_call('{ARG}')") +
                     r": reduce Combiner\(first_max.*over the dim\(s\) n: result 0 is an "
                     "index result .* has dtype float32"):
    call(bp.Combiner(first_max, index_results=(0,)))(X)


def test_an_index_result_out_of_range_is_refused():
  with pytest.raises(ValueError, match="index_results names result 2; the call has 2"):
    call(bp.Combiner(first_max, index_results=(2,)))(X)


@pytest.mark.parametrize("merge, message", [
    (lambda a, b: a[0], r"merge returns float32\[\]; it must return a tuple like its "
                        r"inputs, \(float32\[\], int32\[\]\)"),
    (lambda a, b: (a[0], a[1].astype(jnp.float32)), r"merge returns result 1 as float32\[\]; it "
                                                    r"must keep the input's int32\[\]"),
    (lambda a, b: (a[0][None], a[1]), r"merge returns result 0 as float32\[1\]"),
    (lambda a, b: a[5], "merge fails on two tuples"),
])
def test_a_merge_that_changes_its_results_is_refused(merge, message):
  with pytest.raises(ValueError, match=f"'{ARG}': reduce Combiner.* over the dim n: the "
                                       f"Combiner's {message}"):
    jax.jit(call(bp.Combiner(merge))).lower(X)


def test_a_combiner_over_two_dims_names_its_merge_for_each():
  combiner = bp.Combiner(lambda a, b: (a[0] + b[0],))
  f = bp.ffi_call("batchpart_test_reduce_rows", [S((2,), np.float32)],
                  signature="(n,m)->()", reduce={"n": combiner, "m": combiner})
  text = jax.jit(lambda x: f(x, op=np.int64(0), rows=np.int64(-1))).lower(
      np.zeros((2, 4, 3), np.float32)).as_text()
  merges = re.findall(r"\$x:(n|m)=(merge_[0-9a-f]+)", text)
  assert [d for d, _ in merges] == ["n", "m"] and merges[0][1] == merges[1][1]


def test_index_results_over_two_dims_are_refused():
  with pytest.raises(ValueError, match=re.escape(f"batchpart.ffi_call('{ARG}')") +
                     r": reduce Combiner\(first_max.*over the dims n, m: its index_results "
                     r"\(1,\) would count positions along one dim"):
    combiner = bp.Combiner(first_max, index_results=(1,))
    bp.ffi_call(ARG, [S((4,), np.float32), S((4,), np.int32)], signature="(n,m)->(),()",
                reduce={"n": combiner, "m": combiner})


def test_bad_arguments():
  with pytest.raises(TypeError, match="merge must be callable"):
    bp.Combiner(3)
  with pytest.raises(ValueError, match="distinct non-negative"):
    bp.Combiner(first_max, index_results=(1, 1))


def test_a_merge_this_process_never_lowered_is_named():
  from batchpart._vocab.dims.user_combiner import registered
  with pytest.raises(ValueError, match="the call to 't' merges its parts with the Combiner "
                                       "'merge_0000000000000000', which this process has "
                                       "not declared and the program does not carry"):
    registered("merge_0000000000000000", "t")


def test_only_a_call_lowered_for_export_carries_its_merge():
  f = call(bp.Combiner(first_max, index_results=(1,)))
  assert "batchpart.functions" not in jax.jit(f).lower(X).as_text()
  exported = jax.export.export(jax.jit(f), disabled_checks=[
      jax.export.DisabledSafetyCheck.custom_call(ARG)])(X)
  assert re.search(r"batchpart.functions = \{merge_[0-9a-f]{16} = ", exported.mlir_module())
