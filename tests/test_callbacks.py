"""bp.pure_callback / bp.io_callback on one device: values, the calling
convention, the checks, vmap, derivatives through custom_jvp, errors,
lifetime, and what jax.export and the persistent cache do; and, with
threads for devices, how a device holding only padding learns that the
devices that called failed."""

import functools
import gc
import threading
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
from batchpart._callback import host
from batchpart._callback.agreement import Agreement
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription

rng = np.random.default_rng(0)
S = jax.ShapeDtypeStruct


def _sym(n, k, dtype=np.float32):
  a = rng.standard_normal((n, k, k))
  return (a + np.swapaxes(a, -1, -2)).astype(dtype)


class Recorder:
  """A callback that records the blocks it gets."""

  def __init__(self, fn):
    self.fn, self.calls, self.lock = fn, [], threading.Lock()

  def __call__(self, *args, **kwargs):
    with self.lock:
      self.calls.append(([np.asarray(a).shape for a in args], kwargs.get("index")))
    kwargs.pop("index", None)
    return self.fn(*args, **kwargs)


def test_values_eager_and_jit_pytrees_and_kwargs():
  x = _sym(5, 4)

  def fn(pair, *, scale):
    a, b = pair
    return {"w": np.linalg.eigvalsh(a) * scale, "t": np.trace(b, axis1=-2, axis2=-1)}

  out_type = {"w": S((5, 4), np.float32), "t": S((5,), np.float32)}

  def f(x):
    # Result leaves in pytree order: "t", then "w".
    return bp.pure_callback(fn, out_type, (x, 2 * x), signature="(n,n),(n,n),()->(),(n)",
                            scale=np.float32(3))

  for g in (f, jax.jit(f)):
    out = g(x)
    np.testing.assert_allclose(out["w"], 3 * np.linalg.eigvalsh(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["t"], 2 * np.trace(x, axis1=-2, axis2=-1), rtol=1e-5)


def test_one_device_one_call_with_the_whole_batch_and_index():
  x = rng.standard_normal((3, 4, 2)).astype(np.float32)
  rec = Recorder(lambda x: x * 2)
  y = jax.jit(lambda x: bp.pure_callback(rec, S(x.shape, x.dtype), x, num_batch_dims=2,
                                         with_index=True))(x)
  np.testing.assert_allclose(y, 2 * x)
  assert rec.calls == [([(3, 4, 2)], (slice(0, 3), slice(0, 4)))]


def test_io_callback_runs_once_even_when_unused():
  seen = []

  def write(x):
    seen.append(np.array(x))
    return np.zeros((), np.int32)[None].repeat(x.shape[0])

  @jax.jit
  def f(x):
    bp.io_callback(write, S((4,), np.int32), x, num_batch_dims=1)
    return x + 1

  x = np.arange(8, dtype=np.float32).reshape(4, 2)
  np.testing.assert_array_equal(f(x), x + 1)
  assert len(seen) == 1
  np.testing.assert_array_equal(seen[0], x)


def test_io_callback_without_results():
  seen = []
  jax.jit(lambda x: bp.io_callback(lambda x: seen.append(x.sum()) or (), (), x,
                                   num_batch_dims=1))(np.ones((3, 2), np.float32))
  assert seen == [6.0]


def test_no_batch_dims_and_no_operands():
  y = jax.jit(lambda: bp.pure_callback(lambda: np.arange(3, dtype=np.float32),
                                       S((3,), np.float32), signature="->(n)"))()
  np.testing.assert_array_equal(y, np.arange(3))
  z = jax.jit(lambda x: bp.pure_callback(lambda x: x * 2, S((2,), np.float32), x,
                                         num_batch_dims=0))(np.ones(2, np.float32))
  np.testing.assert_array_equal(z, [2, 2])


def test_shared_operand_passed_whole():
  a = rng.standard_normal((6, 3)).astype(np.float32)
  m = rng.standard_normal((3, 3)).astype(np.float32)
  rec = Recorder(lambda a, m: a @ m)
  y = jax.jit(lambda a, m: bp.pure_callback(rec, S((6, 3), np.float32), a, m,
                                            signature="(k),(k,j)->(j)"))(a, m)
  np.testing.assert_allclose(y, a @ m, rtol=1e-5, atol=1e-6)
  assert rec.calls[0][0] == [(6, 3), (3, 3)]


def test_vmap_is_one_call_with_one_more_batch_dim():
  x = rng.standard_normal((4, 5, 3)).astype(np.float32)
  v = rng.standard_normal((3,)).astype(np.float32)
  rec = Recorder(lambda x, v: x @ v)

  def f(x, v):
    return bp.pure_callback(rec, S(x.shape[:-1], x.dtype), x, v, signature="(n),(n)->()",
                            vmap_method="sequential")

  y = jax.jit(jax.vmap(f, in_axes=(0, None)))(x, v)
  np.testing.assert_allclose(y, x @ v, rtol=1e-5)
  assert rec.calls == [([(4, 5, 3), (3,)], None)]
  rec.calls.clear()
  y = jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(0, None))(x, v)
  np.testing.assert_allclose(y, x @ v, rtol=1e-5)
  assert len(rec.calls) == 1


def test_vmap_num_batch_dims_broadcasts_unmapped_operands():
  x = rng.standard_normal((4, 5)).astype(np.float32)
  y = rng.standard_normal((5,)).astype(np.float32)
  out = jax.vmap(lambda x, y: bp.pure_callback(lambda a, b: a + b, S((5,), np.float32),
                                               x, y, num_batch_dims=1),
                 in_axes=(0, None))(x, y)
  np.testing.assert_allclose(out, x + y)


def test_vmap_io_callback_keeps_index_of_the_new_dim():
  seen = []

  def write(x, index):
    seen.append(index)
    return x

  jax.vmap(lambda x: bp.io_callback(write, S((3,), np.float32), x, num_batch_dims=1,
                                    with_index=True))(np.ones((2, 3), np.float32))
  assert seen == [(slice(0, 2), slice(0, 3))]


def test_differentiation_through_custom_jvp():
  @jax.custom_jvp
  def sin(x):
    return bp.pure_callback(np.sin, S(x.shape, x.dtype), x, num_batch_dims=1)

  @sin.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    return sin(x), bp.pure_callback(np.cos, S(x.shape, x.dtype), x, num_batch_dims=1) * t

  x = np.linspace(0, 1, 6).astype(np.float32)
  np.testing.assert_allclose(jax.grad(lambda x: sin(x).sum())(x), np.cos(x), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: sin(x).sum()))(x), np.cos(x),
                             rtol=1e-6)


def test_without_custom_jvp_differentiation_raises_naming_the_callback():
  def my_host_fn(x):
    return x

  with pytest.raises(ValueError, match=r"pure_callback\(.*my_host_fn\).*custom_jvp"):
    jax.grad(lambda x: bp.pure_callback(my_host_fn, S((), np.float32), x,
                                        num_batch_dims=0))(1.0)


def test_ordered_io_callback_raises_naming_jax():
  with pytest.raises(ValueError, match=r"jax\.experimental\.io_callback"):
    bp.io_callback(print, (), np.ones(2), num_batch_dims=1, ordered=True)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "exactly one of num_batch_dims and signature"),
    ({"num_batch_dims": 1, "signature": "()->()"}, "exactly one"),
    ({"num_batch_dims": 3}, "exceeds the rank of operand 0"),
    ({"signature": "(n)->(n,n)"}, "core dim .n."),
])
def test_bad_declarations_name_the_callback(kwargs, match):
  def my_cb(x):
    return x

  with pytest.raises(ValueError, match=match) as info:
    bp.pure_callback(my_cb, S((4, 3), np.float32), np.ones((4, 3), np.float32), **kwargs)
  assert "batchpart.pure_callback(" in str(info.value) and "my_cb" in str(info.value)


def test_bad_vmap_method():
  with pytest.raises(ValueError, match="vmap_method"):
    bp.pure_callback(np.sin, S((2,), np.float32), np.ones(2), num_batch_dims=1,
                     vmap_method="nope")


@pytest.mark.parametrize("result, match", [
    (lambda x: x[:-1], r"result 0 has shape \(3, 2\).*needs shape \(4, 2\)"),
    (lambda x: np.concatenate([x, x]), r"result 0 has shape \(8, 2\)"),
    (lambda x: x.astype(np.int32), "dtype int32.*dtype float32"),
    (lambda x: (x, x), "structure"),
])
def test_wrong_results_raise_before_reaching_xla(result, match):
  def wrong_cb(x):
    return result(x)

  f = jax.jit(lambda x: bp.pure_callback(wrong_cb, S((4, 2), np.float32), x,
                                         num_batch_dims=1))
  with pytest.raises(Exception, match=match) as info:
    f(np.ones((4, 2), np.float32)).block_until_ready()
  assert "batchpart.pure_callback(" in str(info.value) and "wrong_cb" in str(info.value)
  # The process keeps working.
  ok = jax.jit(lambda x: bp.pure_callback(lambda x: x, S((4, 2), np.float32), x,
                                          num_batch_dims=1))
  np.testing.assert_array_equal(ok(np.ones((4, 2), np.float32)), 1)


def test_exceptions_reach_the_user_naming_the_callback():
  def failing_cb(x):
    raise KeyError("missing thing")

  for kind in (bp.pure_callback, bp.io_callback):
    f = jax.jit(functools.partial(kind, failing_cb, S((3,), np.float32), num_batch_dims=1))
    with pytest.raises(Exception, match=r"failing_cb\) raised KeyError: 'missing thing'"):
      f(np.ones(3, np.float32)).block_until_ready()
  np.testing.assert_array_equal(
      bp.pure_callback(np.negative, S((3,), np.float32), np.ones(3, np.float32),
                       num_batch_dims=1), -1)


def test_float64_results_canonicalize_like_jax():
  # x64 off: a float64 result is taken as float32, as jax.pure_callback does.
  y = jax.jit(lambda x: bp.pure_callback(lambda x: x.astype(np.float64), S((3,), np.float32),
                                         x, num_batch_dims=1))(np.ones(3, np.float32))
  assert y.dtype == np.float32


def test_callable_is_freed_with_its_programs():
  refs = []
  x = np.ones((4, 3), np.float32)
  for i in range(300):
    fn = functools.partial(np.add, np.float32(i))
    refs.append(weakref.ref(fn))
    kind = bp.pure_callback if i % 2 else bp.io_callback
    g = jax.jit(lambda x, fn=fn, kind=kind: kind(fn, S(x.shape, x.dtype), x,
                                                 num_batch_dims=1))
    assert float(g(x)[0, 0]) == 1 + i
    del fn, g
  gc.collect()
  assert sum(r() is not None for r in refs) == 0


def test_callable_lives_while_an_executable_can_call_it():
  fn = functools.partial(np.multiply, np.float32(3))
  ref = weakref.ref(fn)
  compiled = jax.jit(functools.partial(bp.pure_callback, fn, S((2,), np.float32),
                                       num_batch_dims=1)).lower(
      np.ones(2, np.float32)).compile()
  del fn
  gc.collect()
  assert ref() is not None
  np.testing.assert_array_equal(compiled(np.ones(2, np.float32)), 3)
  del compiled
  gc.collect()
  assert ref() is None


def test_jax_export_refuses_host_callbacks_as_for_jax():
  f = jax.jit(lambda x: bp.pure_callback(np.sin, S((2,), np.float32), x, num_batch_dims=1))
  with pytest.raises(NotImplementedError, match="host_callbacks"):
    jax.export.export(f)(S((2,), np.float32))
  g = jax.jit(lambda x: jax.pure_callback(np.sin, S((2,), np.float32), x))
  with pytest.raises(NotImplementedError, match="host_callbacks"):
    jax.export.export(g)(S((2,), np.float32))


_CACHE_SCRIPT = """
import sys, numpy as np, jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import functools, batchpart as bp
kind, k = sys.argv[2], np.float32(sys.argv[3])
fn = functools.partial(np.add, k)
out = jax.ShapeDtypeStruct((4,), np.float32)
if kind == "bp":
  f = jax.jit(lambda x: bp.pure_callback(fn, out, x, num_batch_dims=1) * 2)
else:
  f = jax.jit(lambda x: jax.pure_callback(fn, out, x) * 2)
print(float(f(np.arange(4, dtype=np.float32))[3]))
"""


def _cache_run(tmp_path, cache, kind, k):
  import subprocess
  import sys
  script = tmp_path / "cache_script.py"
  script.write_text(_CACHE_SCRIPT)
  out = subprocess.run([sys.executable, str(script), str(cache), kind, str(k)],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  return float(out.stdout.split()[-1]), len(list(cache.iterdir()))


def test_persistent_cache_behaves_as_for_jax_callbacks(tmp_path):
  """jax 0.10 never writes a program with host callbacks to the persistent
  cache; newer jax writes it and binds the loading process's callables. Either
  way batchpart's callbacks do what jax's do, and a program read back calls
  the callable of the process that runs it."""
  written = {}
  for kind in ("bp", "jax"):
    cache = tmp_path / kind
    cache.mkdir()
    value, entries = _cache_run(tmp_path, cache, kind, 1)
    assert value == 2 * (3 + 1)
    written[kind] = entries > 0
    value, entries_after = _cache_run(tmp_path, cache, kind, 5)   # same program text
    assert value == 2 * (3 + 5)
    assert entries_after == entries
  assert written["bp"] == written["jax"]


def test_lowered_call_targets_jax_callback_with_derived_name_in_attribute():
  text = jax.jit(lambda x: bp.pure_callback(np.sin, S((4, 2), np.float32), x,
                                            num_batch_dims=1)).lower(
      np.ones((4, 2), np.float32)).as_text()
  assert "custom_call @xla_ffi_python_cpu_callback" in text
  assert "index = 0 : ui64" in text
  assert 'batchpart.callback = "batchpart.pure_callback(sin)"' in text
  assert "$bp1$" in text and "@xla_ffi_python_cpu_callback$" not in text


def test_derived_name_carries_the_callback_flag():
  d = CallDescription("xla_ffi_python_cpu_callback", (0, 1), (1,), ((0,), (1, 0)), ((0,),),
                      callback_partitions=8)
  name = derived_names.encode(d)
  assert name.endswith("$c8")
  assert derived_names.decode(name) == d
  plain = CallDescription("t", (1,), (1,), ((0,),), ((0,),))
  assert "$c" not in derived_names.encode(plain)
  with pytest.raises(ValueError):
    derived_names.decode("t$bp1$o1$r1$no1$nr1$c0")


def test_host_call_trims_padding_and_pads_results():
  rec = Recorder(lambda x: x * 2)
  flat = host.FlatCallback(rec, jax.tree_util.tree_structure(((0,), {})),
                           jax.tree_util.tree_structure(0), with_index=True,
                           kind="pure_callback")
  call = host.HostCall(flat, batch=(13,), operand_shapes=[(13, 2)],
                       operand_batch_ranks=(1,), result_shapes=[(13, 2)],
                       result_dtypes=[np.float32], unit=False)
  x = np.arange(4, dtype=np.float32).reshape(2, 2)
  (y,) = call(np.array([12, 2]), x)
  assert y.shape == (2, 2)
  np.testing.assert_array_equal(y[0], 2 * x[0])
  assert rec.calls == [([(1, 2)], (slice(12, 13),))]
  (z,) = call(np.array([14, 2]), x)       # all padding: not called
  assert z.shape == (2, 2) and len(rec.calls) == 1


def test_public_callbacks_work_on_integer_and_bool_data():
  x = np.arange(6, dtype=np.int32).reshape(3, 2)
  y = jax.jit(lambda x: bp.pure_callback(lambda x: x > 2, S((3, 2), np.bool_), x,
                                         num_batch_dims=1))(x)
  np.testing.assert_array_equal(y, x > 2)
  assert jnp.asarray(y).dtype == jnp.bool_


def test_cuda_lowering_targets_jax_gpu_callback():
  """Lowered for CUDA (no GPU needed): jax's GPU callback target, same index
  and block vector; running it needs a GPU."""
  f = jax.jit(lambda x: bp.pure_callback(np.sin, S((4,), np.float32), x, num_batch_dims=1))
  text = f.trace(np.ones(4, np.float32)).lower(lowering_platforms=("cuda",)).as_text()
  assert "custom_call @xla_ffi_python_gpu_callback(" in text
  assert "index = 0 : ui64" in text


@pytest.mark.skipif(not any(d.platform == "gpu" for d in jax.devices()), reason="no GPU")
def test_cuda_callback_runs():
  x = np.linspace(0, 1, 8).astype(np.float32)
  y = jax.jit(lambda x: bp.pure_callback(np.sin, S((8,), np.float32), x,
                                         num_batch_dims=1))(jax.device_put(x, jax.devices()[0]))
  np.testing.assert_allclose(y, np.sin(x), rtol=1e-6)


def test_batch_dims_in_the_middle_reach_the_callback_in_its_layout():
  """'(a,...,n)->(...,a)': the callback gets (a, block, n) blocks and returns
  (block, a); the call's arrays keep the user's layout."""
  seen = []

  def per_antenna_sum(x, y):   # x: (a, batch..., n), y: (n,) shared
    seen.append(x.shape)
    return np.moveaxis((x * y).sum(-1), 0, -1)

  x = np.random.default_rng(0).standard_normal((3, 5, 4, 6)).astype(np.float32)
  y = np.arange(6, dtype=np.float32)
  f = jax.jit(lambda x, y: bp.pure_callback(per_antenna_sum, S((5, 4, 3), np.float32), x, y,
                                            signature="(a,...,n),(n)->(...,a)"))
  np.testing.assert_allclose(f(x, y), np.moveaxis((x * y).sum(-1), 0, -1), rtol=1e-5)
  assert seen == [(3, 5, 4, 6)]
  # vmap: the new dim joins the batch dims at '...'
  seen.clear()
  xs = np.stack([x, 2 * x])
  got = jax.jit(jax.vmap(lambda x: bp.pure_callback(
      per_antenna_sum, S((5, 4, 3), np.float32), x, y,
      signature="(a,...,n),(n)->(...,a)")))(xs)
  np.testing.assert_allclose(got, np.stack([np.moveaxis((v * y).sum(-1), 0, -1)
                                            for v in xs]), rtol=1e-5)
  assert seen == [(3, 2, 5, 4, 6)]


# What the callback gets: arrays="numpy" (default) or "jax".

def _types_seen(arrays, *args, **kwargs):
  seen = []

  def fn(*a, **k):
    seen.extend(type(v) for v in (*a, *k.values()))
    return a[0] * 2

  x = np.arange(6, dtype=np.float32).reshape(3, 2)
  y = jax.jit(lambda x: bp.pure_callback(fn, S((3, 2), np.float32), x, *args,
                                         num_batch_dims=1, arrays=arrays, **kwargs))(x)
  np.testing.assert_array_equal(y, 2 * x)
  return seen


def test_arrays_numpy_is_the_default_and_hands_numpy_arrays():
  assert _types_seen("numpy") == [np.ndarray]
  seen = []
  bp.pure_callback(lambda x: seen.append(type(x)) or x, S((2,), np.float32),
                   np.ones(2, np.float32), num_batch_dims=1)
  assert seen == [np.ndarray]


def test_arrays_jax_hands_jax_arrays_on_the_cpu_device():
  seen = []

  def fn(x, *, scale):
    seen.append((type(x), x.devices(), type(scale)))
    return x * scale

  x = np.arange(6, dtype=np.float32).reshape(3, 2)
  y = jax.jit(lambda x: bp.pure_callback(fn, S((3, 2), np.float32), x, num_batch_dims=1,
                                         arrays="jax", scale=3 * x))(x)
  np.testing.assert_array_equal(y, 3 * x * x)
  (t, devices, t_scale), = seen
  assert issubclass(t, jax.Array) and issubclass(t_scale, jax.Array)
  assert devices == {jax.local_devices(backend="cpu")[0]}


def test_arrays_jax_supports_at_and_jnp_inside_the_callback():
  def fn(x):
    assert isinstance(x, jax.Array)
    return jnp.sin(x.at[0].set(0.0))

  x = np.linspace(1, 2, 8, dtype=np.float32)
  for kind in (bp.pure_callback, bp.io_callback):
    y = jax.jit(functools.partial(kind, fn, S((8,), np.float32), num_batch_dims=1,
                                  arrays="jax"))(x)
    want = np.sin(x)
    want[0] = 0
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_arrays_jax_with_pytrees_unit_calls_and_layouts():
  seen = []

  def fn(pair, w):
    a, b = pair
    seen.append(tuple(type(v).__name__ == "ArrayImpl" for v in (a, b, w)))
    return {"s": (a + b).sum(-1) * w}

  x = np.arange(8, dtype=np.float32).reshape(4, 2)
  out = jax.jit(lambda x: bp.pure_callback(fn, {"s": S((4,), np.float32)}, (x, x),
                                           np.float32(2), signature="(n),(n),()->()",
                                           arrays="jax"))(x)
  np.testing.assert_allclose(out["s"], 4 * x.sum(-1))
  assert seen == [(True, True, True)]
  # No batch dims: a 0-d jax.Array.
  got = []
  bp.pure_callback(lambda s: got.append((type(s).__name__, s.shape)) or s,
                   S((), np.float32), np.float32(3), signature="()->()", arrays="jax")
  assert got == [("ArrayImpl", ())]
  # '...' after a core dim: the block in the user's layout (a transposed,
  # non-contiguous view, imported through an aligned copy).
  z = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  w = jax.jit(lambda z: bp.pure_callback(lambda v: jnp.moveaxis(v.sum(-1), 0, -1),
                                         S((3, 2), np.float32), z,
                                         signature="(a,...,n)->(...,a)", arrays="jax"))(z)
  np.testing.assert_allclose(w, np.moveaxis(z.sum(-1), 0, -1))


def test_bad_arrays_value_names_the_callback():
  def my_cb(x):
    return x

  for kind in (bp.pure_callback, bp.io_callback):
    with pytest.raises(ValueError, match=r"my_cb\): arrays='torch'"):
      kind(my_cb, S((2,), np.float32), np.ones(2, np.float32), num_batch_dims=1,
           arrays="torch")


def test_arrays_is_part_of_the_callbacks_identity():
  flat = functools.partial(host.FlatCallback, np.sin, jax.tree_util.tree_structure(((0,), {})),
                           jax.tree_util.tree_structure(0), with_index=False,
                           kind="pure_callback")
  assert flat(arrays="jax") == flat(arrays="jax")
  assert flat(arrays="jax") != flat(arrays="numpy")
  assert flat().arrays == "numpy"


@pytest.mark.parametrize("make", [
    lambda: np.arange(1000, dtype=np.float32),                       # maybe aligned
    lambda: np.arange(1001, dtype=np.int32)[1:],                     # 4 bytes off
    lambda: np.arange(24, dtype=np.float32).reshape(4, 6).T,         # not contiguous
    lambda: np.arange(6, dtype=np.int8)[1:],
    lambda: np.zeros((0, 3), np.float32),
])
def test_imported_operands_alias_host_memory_never_a_transfer(make):
  """arrays='jax' makes the jax.Array over the block's own (or an aligned
  copy's) memory: nothing is copied by the CPU client, whose large copies
  run on the thread pool that devices blocked in a collective hold."""
  from batchpart import _compat as compat
  x = make()
  a = host._aligned(x)
  np.testing.assert_array_equal(a, x)
  assert a.flags.c_contiguous
  assert a.ctypes.data % compat.HOST_ARRAY_ALIGNMENT == 0 or not a.size
  if x.flags.c_contiguous and x.ctypes.data % compat.HOST_ARRAY_ALIGNMENT == 0:
    assert a is x
  y = compat.import_host_array(a, compat.callback_cpu_device())
  np.testing.assert_array_equal(np.asarray(y), x)
  if a.size:
    assert y.addressable_data(0).unsafe_buffer_pointer() == a.ctypes.data


# The call path: per-block work done once, no-op work skipped, results checked.

def _host_call(fn, *, batch, operand_shapes, operand_batch_ranks, result_shapes,
               unit=False, with_index=True, n_in=1, out_tree=None):
  flat = host.FlatCallback(fn, jax.tree_util.tree_structure((tuple(range(n_in)), {})),
                           out_tree or jax.tree_util.tree_structure(0),
                           with_index=with_index, kind="pure_callback")
  return host.HostCall(flat, batch=batch, operand_shapes=operand_shapes,
                       operand_batch_ranks=operand_batch_ranks,
                       result_shapes=result_shapes,
                       result_dtypes=[np.float32] * len(result_shapes), unit=unit)


def test_even_block_passes_the_operand_itself_and_returns_the_result_as_is():
  got = []
  call = _host_call(lambda x, index: got.append((x, index)) or x + 1, batch=(16,),
                    operand_shapes=[(16, 2)], operand_batch_ranks=(1,),
                    result_shapes=[(16, 2)])
  x = np.ones((2, 2), np.float32)
  (y,) = call(np.array([4, 2]), x)
  assert got[0][0] is x and got[0][1] == (slice(4, 6),)
  np.testing.assert_array_equal(y, 2)
  call(np.array([4, 2]), x)
  call(np.array([6, 2]), x)
  assert len(call._blocks) == 2      # one entry per distinct block vector


def test_broadcast_operand_is_never_trimmed_on_a_short_block():
  got = []
  call = _host_call(lambda x, w, index: got.append((x.shape, w.shape)) or x * w,
                    batch=(13,), operand_shapes=[(13, 2), (1, 2)],
                    operand_batch_ranks=(1, 1), result_shapes=[(13, 2)], n_in=2)
  (y,) = call(np.array([12, 2]), np.ones((2, 2), np.float32), np.full((1, 2), 3, np.float32))
  assert got == [((1, 2), (1, 2))]
  np.testing.assert_array_equal(y, [[3, 3], [0, 0]])   # padded back


def test_unit_call_gets_and_returns_no_batch_dim():
  # The unit batch dim is the block vector's alone: XLA's buffers, the
  # user's arrays and the padding device's zeros all have the user's shapes.
  got = []
  call = _host_call(lambda x, index: got.append((x.shape, index)) or x * 2, batch=(1,),
                    operand_shapes=[(1, 3)], operand_batch_ranks=(1,),
                    result_shapes=[(1, 3)], unit=True)
  (y,) = call(np.array([0, 1]), np.ones((3,), np.float32))
  assert got == [((3,), ())]
  np.testing.assert_array_equal(y, [2, 2, 2])
  (z,) = call(np.array([1, 1]), np.ones((3,), np.float32))   # the padding device
  assert z.shape == (3,) and len(got) == 1
  with pytest.raises(host.CallbackError, match=r"result 0 has shape \(1, 3\).*needs shape "
                     r"\(3,\)"):
    _host_call(lambda x, index: x[None], batch=(1,), operand_shapes=[(1, 3)],
               operand_batch_ranks=(1,), result_shapes=[(1, 3)], unit=True)(
                   np.array([0, 1]), np.ones((3,), np.float32))


@pytest.mark.parametrize("fn, match", [
    (lambda x, index: x[:1], r"result 0 has shape \(1, 2\).*block \[4:6\].*needs shape "
                             r"\(2, 2\)"),
    (lambda x, index: x.astype(np.int32), "dtype int32.*dtype float32"),
    (lambda x, index: (x,), "structure"),
    (lambda x, index: [x], "structure"),
    (lambda x, index: None, "structure"),
    (lambda x, index: 1.5, r"result 0 has shape \(\)"),
])
def test_wrong_results_are_caught_on_the_fast_path(fn, match):
  call = _host_call(fn, batch=(16,), operand_shapes=[(16, 2)], operand_batch_ranks=(1,),
                    result_shapes=[(16, 2)])
  with pytest.raises(host.CallbackError, match=match) as info:
    call(np.array([4, 2]), np.ones((2, 2), np.float32))
  assert "batchpart.pure_callback(" in str(info.value)


def test_tuple_results_fast_path_checks_count_and_shapes():
  tree = jax.tree_util.tree_structure((0, 0))
  ok = _host_call(lambda x, index: (x, x * 2), batch=(4,), operand_shapes=[(4,)],
                  operand_batch_ranks=(1,), result_shapes=[(4,), (4,)], out_tree=tree)
  a, b = ok(np.array([0, 4]), np.ones(4, np.float32))
  np.testing.assert_array_equal(b, 2)
  short = _host_call(lambda x, index: (x,), batch=(4,), operand_shapes=[(4,)],
                     operand_batch_ranks=(1,), result_shapes=[(4,), (4,)], out_tree=tree)
  with pytest.raises(host.CallbackError, match="structure"):
    short(np.array([0, 4]), np.ones(4, np.float32))


# ---- devices holding only padding fail with the devices that called --------

def _on_devices(call, blocks, *args):
  """``call(block, *args)`` on one thread per block vector, as XLA's devices
  call it: each one's results, or the exception it raised."""
  out = [None] * len(blocks)

  def device(i):
    try:
      out[i] = call(np.asarray(blocks[i], np.int64), *args)
    except Exception as e:   # what the device reports to XLA
      out[i] = e

  threads = [threading.Thread(target=device, args=(i,)) for i in range(len(blocks))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  assert not any(t.is_alive() for t in threads), "a device call is still waiting"
  return out


UNEVEN = [[2 * d, 2] for d in range(8)]   # 13 rows over 8 devices: the last all padding


def _agreed_call(fn, *, batch=(13,), stall_seconds=30.0):
  call = _host_call(fn, batch=batch, operand_shapes=[(batch[0], 2)], operand_batch_ranks=(1,),
                    result_shapes=[(batch[0], 2)])
  call._agreement = Agreement(8, keyed=True, stall_seconds=stall_seconds)
  return call


def test_padding_device_fails_with_the_devices_that_called():
  def broken(x, index):
    raise ValueError(f"bad rows {index[0].start}")

  out = _on_devices(_agreed_call(broken), UNEVEN, np.ones((2, 2), np.float32))
  assert all(isinstance(e, host.CallbackError) for e in out), out
  assert "bad rows 4 (on the block [4:6]" in str(out[2])           # its own error
  # The padding device reports the first failing block's.
  assert str(out[7]) == ("batchpart.pure_callback(test_padding_device_fails_with_the_devices_"
                         "that_called.<locals>.broken) raised ValueError: bad rows 0 (on the "
                         "block [0:2] of the batch)")


def test_padding_device_returns_zeros_where_every_call_succeeds():
  call = _agreed_call(lambda x, index: x * 2)
  for _ in range(3):   # one round per execution
    out = _on_devices(call, UNEVEN, np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(out[0][0], 2)
    np.testing.assert_array_equal(out[7][0], 0)
  assert call._agreement.needed


def test_wrong_results_on_every_block_fail_the_padding_device_too():
  out = _on_devices(_agreed_call(lambda x, index: x[:, :1]), UNEVEN,
                    np.ones((2, 2), np.float32))
  assert all(isinstance(e, host.CallbackError) for e in out), out
  assert "result 0 has shape (2, 1)" in str(out[7]) and "block [0:2]" in str(out[7])
  assert "block [12:13]" in str(out[6])   # its own


def test_without_padding_devices_calls_stop_agreeing_after_one_round():
  call = _agreed_call(lambda x, index: x, batch=(16,))
  _on_devices(call, [[2 * d, 2] for d in range(8)], np.ones((2, 2), np.float32))
  assert not call._agreement.needed


def test_a_round_missing_a_device_gives_up_and_later_rounds_line_up():
  a = Agreement(3, keyed=True, stall_seconds=0.3)
  boom = host.CallbackError("boom")
  assert a.settle(b"a", boom, (0,), wait=False) is boom
  start = time.monotonic()
  # Device b never comes (its program stopped before the callback).
  assert a.settle(b"c", None, (4,), wait=True) is boom
  assert 0.25 < time.monotonic() - start < 5
  # The next execution: b's first call joins it, and nobody waits in vain.
  start = time.monotonic()
  assert a.settle(b"a", None, wait=False) is None
  assert a.settle(b"b", None, wait=False) is None
  assert a.settle(b"c", None, wait=True) is None
  assert time.monotonic() - start < 0.2


def test_only_one_round_in_the_process_waits():
  first, second = Agreement(2, keyed=True), Agreement(2, keyed=True)
  done = threading.Event()
  waiter = threading.Thread(target=lambda: done.set() if first.settle(
      b"pad", None, wait=True) is None else None)
  waiter.start()
  time.sleep(0.1)
  # A second round would hold one more of XLA's threads: it returns at once.
  assert second.settle(b"pad", None, wait=True) is None
  assert not done.is_set()
  first.settle(b"dev", None, wait=False)
  waiter.join(timeout=10)
  assert done.is_set()
