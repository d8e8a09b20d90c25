"""bp.buffer_callback on one device: values against NumPy and jax's own
buffer_callback, the calling convention (buffers written in place, read-only
operands, aliases), vmap, a signature's '...', errors naming the callback,
the CUDA lowering, and the buffer views' protocols without a GPU."""

import ctypes
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import buffer_callback as jax_buffer_callback

import batchpart as bp
from batchpart._callback import buffer_host

S = jax.ShapeDtypeStruct
rng = np.random.default_rng(0)


class Recorder:
  """A buffer callback that records what each call gets, then runs ``fn``."""

  def __init__(self, fn):
    self.fn, self.calls, self.lock = fn, [], threading.Lock()

  def __call__(self, ctx, out, *args, **kwargs):
    with self.lock:
      self.calls.append({"ctx": ctx, "out": jax.tree_util.tree_map(_describe, out),
                         "args": [_describe(a) for a in jax.tree_util.tree_leaves(args)],
                         "index": kwargs.get("index")})
    kwargs.pop("index", None)
    return self.fn(ctx, out, *args, **kwargs)


def _describe(b):
  return (type(b).__name__, tuple(b.shape), np.dtype(b.dtype), b.writeable)


def _add_rows(ctx, out, x, y):
  np.asarray(out)[...] = np.asarray(x) * 2 + np.asarray(y)


def test_values_eager_and_jit_match_numpy_and_jax():
  x = rng.standard_normal((6, 3)).astype(np.float32)
  y = rng.standard_normal((6, 3)).astype(np.float32)
  rec = Recorder(_add_rows)
  f = bp.buffer_callback(rec, S((6, 3), np.float32), num_batch_dims=1)
  stock = jax_buffer_callback.buffer_callback(_add_rows, S((6, 3), np.float32))
  for g in (f, jax.jit(f)):
    np.testing.assert_array_equal(g(x, y), x * 2 + y)
  np.testing.assert_array_equal(jax.jit(f)(x, y), jax.jit(stock)(x, y))
  call = rec.calls[-1]
  assert isinstance(call["ctx"], jax_buffer_callback.ExecutionContext)
  assert call["out"] == ("BlockBuffer", (6, 3), np.float32, True)
  assert call["args"] == [("BlockBuffer", (6, 3), np.float32, False)] * 2


def test_pytrees_kwargs_and_several_results():
  x = rng.standard_normal((4, 5)).astype(np.float32)

  def fn(ctx, out, pair, *, scale):
    a, b = pair
    np.asarray(out["sum"])[...] = (np.asarray(a) + np.asarray(b)).sum(-1) * np.asarray(scale)
    np.asarray(out["max"])[...] = np.asarray(a).max(-1)

  out_type = {"sum": S((4,), np.float32), "max": S((4,), np.float32)}
  f = bp.buffer_callback(fn, out_type, signature="(n),(n),()->(),()")
  got = jax.jit(f)((x, 2 * x), scale=np.float32(3))
  np.testing.assert_allclose(got["sum"], 9 * x.sum(-1), rtol=1e-5)
  np.testing.assert_array_equal(got["max"], x.max(-1))


def test_operands_are_read_only_views_and_results_are_written_in_place():
  x = np.arange(12, dtype=np.float32).reshape(4, 3)
  seen = {}

  def fn(ctx, out, x):
    a, o = np.asarray(x), np.asarray(out)
    seen["operand writeable"] = a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
      a[0, 0] = 1
    o[...] = 0
    o[1] = a[1] * 10           # a partial write is kept: nothing is copied back
    seen["same memory"] = np.shares_memory(o, np.asarray(out))

  y = jax.jit(bp.buffer_callback(fn, S((4, 3), np.float32), num_batch_dims=1))(x)
  assert seen == {"operand writeable": False, "same memory": True}
  np.testing.assert_array_equal(y, np.where(np.arange(4)[:, None] == 1, x * 10, 0))


def test_input_output_aliases_share_the_buffer():
  x = np.arange(12, dtype=np.float32).reshape(4, 3)
  shared = []

  def inc(ctx, out, x, scale):
    shared.append(np.shares_memory(np.asarray(out), np.asarray(x)))
    np.asarray(out)[...] += np.asarray(scale)

  f = bp.buffer_callback(inc, S((4, 3), np.float32), signature="(n),()->(n)",
                         input_output_aliases={0: 0})
  g = jax.jit(f, donate_argnums=0)
  np.testing.assert_array_equal(g(jnp.asarray(x), np.float32(2)), x + 2)
  assert shared == [True]
  text = jax.jit(f).lower(x, np.float32(2)).as_text()
  # Operand 0 of the custom call is the block vector: the user's operand 0
  # is the call's operand 1.
  assert "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], " \
         "operand_index = 1, operand_tuple_indices = []>]" in text


def test_vmap_is_one_call_with_one_more_batch_dim():
  x = rng.standard_normal((2, 5, 3)).astype(np.float32)
  rec = Recorder(_add_rows)
  f = bp.buffer_callback(rec, S((5, 3), np.float32), num_batch_dims=1)
  got = jax.jit(jax.vmap(f))(x, x)
  np.testing.assert_allclose(got, 3 * x, rtol=1e-6)
  assert len(rec.calls) == 1 and rec.calls[0]["out"][1] == (2, 5, 3)


def test_vmap_of_an_aliased_operand_shared_by_the_batch():
  """An aliased operand that vmap leaves unmapped is materialised: it must
  have its result's (now batched) shape."""
  base = np.arange(3, dtype=np.float32)
  offsets = np.arange(4, dtype=np.float32)

  def add(ctx, out, x, k):
    np.asarray(out)[...] += np.asarray(k)[..., None]

  f = bp.buffer_callback(add, S((3,), np.float32), signature="(n),()->(n)",
                         input_output_aliases={0: 0})
  got = jax.jit(jax.vmap(f, in_axes=(None, 0)))(base, offsets)
  np.testing.assert_array_equal(got, base + offsets[:, None])


def test_signature_ellipsis_hands_the_user_layout_in_place():
  """'(a,...,n),(n)->(...,a)': the callback gets (a, batch, n) and writes
  (batch, a) views of XLA's batch-first buffers (strided, no copy)."""
  x = rng.standard_normal((3, 5, 4)).astype(np.float32)
  w = np.arange(4, dtype=np.float32)
  rec = Recorder(lambda ctx, out, x, w: np.copyto(
      np.asarray(out), np.moveaxis((np.asarray(x) * np.asarray(w)).sum(-1), 0, -1)))
  f = bp.buffer_callback(rec, S((5, 3), np.float32), signature="(a,...,n),(n)->(...,a)")
  want = np.moveaxis((x * w).sum(-1), 0, -1)
  np.testing.assert_allclose(jax.jit(f)(x, w), want, rtol=1e-5)
  assert rec.calls[-1]["args"][0][1] == (3, 5, 4)
  assert rec.calls[-1]["out"][1] == (5, 3)
  xs = np.stack([x, 2 * x])
  got = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, w)
  np.testing.assert_allclose(got, np.stack([want, 2 * want]), rtol=1e-5)
  assert rec.calls[-1]["args"][0][1] == (3, 2, 5, 4)


def test_no_batch_dims_and_with_index():
  x = np.arange(4, dtype=np.float32)
  rec = Recorder(lambda ctx, out, x: np.copyto(np.asarray(out), np.asarray(x)[::-1]))
  f = bp.buffer_callback(rec, S((4,), np.float32), signature="(n)->(n)", with_index=True)
  np.testing.assert_array_equal(jax.jit(f)(x), x[::-1])
  assert rec.calls[-1]["args"][0][1] == (4,) and rec.calls[-1]["index"] == ()
  g = bp.buffer_callback(rec, S((3, 4), np.float32), num_batch_dims=1, with_index=True)
  jax.jit(g)(np.ones((3, 4), np.float32))
  assert rec.calls[-1]["index"] == (slice(0, 3),)


def test_has_side_effect_keeps_a_call_whose_results_are_unused():
  count = []

  def note(ctx, out, x):
    count.append(1)
    np.asarray(out)[...] = 0

  kept = bp.buffer_callback(note, S((2,), np.float32), num_batch_dims=1, has_side_effect=True)

  @jax.jit
  def f(x):
    kept(x)
    return x + 1

  f(np.ones(2, np.float32)).block_until_ready()
  assert count == [1]
  assert "has_side_effect = true" in jax.jit(f).lower(np.ones(2, np.float32)).as_text()


def test_cuda_lowering_targets_jax_gpu_buffer_callback():
  """Lowered for CUDA (no GPU needed): jax's GPU in-place target with the
  block vector, index and shifted aliases."""
  f = jax.jit(bp.buffer_callback(_add_rows, S((8, 2), np.float32), num_batch_dims=1,
                                 input_output_aliases={1: 0}))
  x = np.ones((8, 2), np.float32)
  text = f.trace(x, x).lower(lowering_platforms=("cuda",)).as_text()
  assert "custom_call @xla_buffer_python_gpu_callback(%c, %arg0, %arg1)" in text
  assert "index = 0 : ui64" in text
  assert "operand_index = 2" in text
  assert "xla_buffer_python_cpu_callback" not in text


@pytest.mark.skipif(not any(d.platform == "gpu" for d in jax.devices()), reason="no GPU")
def test_cuda_buffer_callback_gets_device_views():
  seen = []

  def note(ctx, out, x):
    seen.append((x.shape, x.__cuda_array_interface__["shape"], out.writeable))

  f = bp.buffer_callback(note, S((8,), np.float32), num_batch_dims=1, has_side_effect=True)
  jax.jit(f)(jax.device_put(np.ones(8, np.float32), jax.devices()[0])).block_until_ready()
  assert seen == [((8,), (8,), True)]


@pytest.mark.parametrize("kwargs, match", [
    ({}, "exactly one of num_batch_dims and signature"),
    ({"num_batch_dims": 1, "signature": "(n)->(n)"}, "exactly one"),
    ({"num_batch_dims": 1, "vmap_method": "bogus"}, "vmap_method='bogus'"),
    ({"num_batch_dims": 1, "input_output_aliases": {0: 3}}, "0:3 is out of range"),
])
def test_bad_declarations_raise_naming_the_callback(kwargs, match):
  with pytest.raises(ValueError, match=match) as info:
    bp.buffer_callback(_add_rows, S((4,), np.float32), **kwargs)
  assert "batchpart.buffer_callback(_add_rows)" in str(info.value)


def test_declarations_that_do_not_fit_the_operands_raise_naming_the_callback():
  x = np.ones((4, 3), np.float32)
  bad_batch = bp.buffer_callback(_add_rows, S((5, 3), np.float32), num_batch_dims=1)
  with pytest.raises(ValueError, match=r"batchpart.buffer_callback\(_add_rows\)"):
    jax.jit(bad_batch)(x, x)
  bad_sig = bp.buffer_callback(_add_rows, S((4, 3), np.float32), signature="(n,n),(n)->(n)")
  with pytest.raises(ValueError, match=r"batchpart.buffer_callback\(_add_rows\)"):
    jax.jit(bad_sig)(x, x)
  bad_alias = bp.buffer_callback(_add_rows, S((4, 3), np.int32), num_batch_dims=1,
                                 input_output_aliases={0: 0})
  with pytest.raises(ValueError, match=r"_add_rows\).*0:0: operand 0 is \(4, 3\) float32"):
    jax.jit(bad_alias)(x, x)
  moved = bp.buffer_callback(_add_rows, S((3, 3), np.float32),
                             signature="(n,...),(...,n)->(...,n)", input_output_aliases={0: 0})
  # Same shape and dtype, but the batch dims sit elsewhere: no shared buffer.
  with pytest.raises(ValueError, match="places the batch dims"):
    jax.jit(moved)(np.ones((3, 3), np.float32), np.ones((3, 3), np.float32))


def test_callback_errors_reach_the_user_naming_the_callback_and_block():
  def boom(ctx, out, x):
    raise KeyError("x")

  def returns(ctx, out, x):
    return 1

  x = np.ones((4,), np.float32)
  with pytest.raises(Exception, match=r"buffer_callback\(.*boom\) raised KeyError: 'x' "
                                      r"\(on the block \[0:4\] of the batch\)"):
    jax.jit(bp.buffer_callback(boom, S((4,), np.float32), num_batch_dims=1))(x)
  with pytest.raises(Exception, match=r"returns\) returned a value.*must return None"):
    jax.jit(bp.buffer_callback(returns, S((4,), np.float32), num_batch_dims=1))(x)
  # The process keeps working.
  np.testing.assert_array_equal(
      jax.jit(bp.buffer_callback(_add_rows, S((4,), np.float32), num_batch_dims=1))(x, x), 3)


def test_differentiation_is_refused_naming_the_callback():
  f = bp.buffer_callback(_add_rows, S((4,), np.float32), num_batch_dims=1)
  with pytest.raises(ValueError, match=r"buffer_callback\(_add_rows\) cannot be differentiated"):
    jax.grad(lambda x: f(x, x).sum())(np.ones(4, np.float32))


def test_the_same_function_compiles_once():
  f = bp.buffer_callback(_add_rows, S((4,), np.float32), num_batch_dims=1)
  g = jax.jit(lambda x: f(x, x))
  g(np.ones(4, np.float32))
  g(np.zeros(4, np.float32))
  assert g._cache_size() == 1


# -- the views, without running a program ---------------------------------


def test_view_layout_trims_and_permutes():
  strides = buffer_host.c_strides((4, 5, 6), 4)
  assert strides == (120, 24, 4)
  assert buffer_host.view_layout((4, 5, 6), strides, [3]) == (
      (3, 5, 6), (120, 24, 4))
  assert buffer_host.view_layout((4, 5, 6), strides, [None, 2],
                                 order=[1, 0, 2]) == ((2, 4, 6), (24, 120, 4))


def test_block_buffer_on_cpu_is_a_numpy_view_and_exports_dlpack():
  base = np.arange(24, dtype=np.float32).reshape(4, 6)
  shape, strides = buffer_host.view_layout(base.shape, base.strides, [3],
                                           order=[1, 0])
  view = buffer_host.BlockBuffer(base, shape, strides, writeable=True)
  a = np.asarray(view)
  np.testing.assert_array_equal(a, base[:3].T)
  a[0, 0] = -1
  assert base[0, 0] == -1                       # in place
  np.testing.assert_array_equal(np.from_dlpack(view), base[:3].T)
  assert view.__dlpack_device__() == (1, 0)
  assert not hasattr(view, "__cuda_array_interface__")
  ro = buffer_host.BlockBuffer(base, (2, 6), base.strides, writeable=False)
  assert not np.asarray(ro).flags.writeable and ro.ndim == 2 and ro.size == 12
  assert np.asarray(ro, dtype=np.float64).dtype == np.float64
  with pytest.raises(ValueError, match="without a copy"):
    ro.__array__(np.float64, copy=False)


class _FakeCudaBuffer:
  """What jax's Buffer shows on a CUDA device: shape, dtype, DLPack device
  and the array interface; no memory behind it."""

  def __init__(self, shape, dtype, pointer, device_type=2):
    self.shape, self.dtype, self.pointer, self.device_type = shape, np.dtype(dtype), pointer, \
        device_type
    self.exported = 0

  def __dlpack_device__(self):
    return (self.device_type, 0)

  @property
  def __cuda_array_interface__(self):
    return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False),
            "strides": None, "version": 3, "stream": 1}

  def __dlpack__(self, **kwargs):
    self.exported += 1
    return "capsule"


def test_cuda_array_interface_of_a_trimmed_and_permuted_view():
  base = _FakeCudaBuffer((4, 5, 6), np.float32, 0x7000)
  shape, strides = buffer_host.view_layout(base.shape, buffer_host.c_strides(base.shape, 4),
                                           [3])
  view = buffer_host.BlockBuffer(base, shape, strides, writeable=True)
  cai = view.__cuda_array_interface__
  assert cai == {"shape": (3, 5, 6), "typestr": "<f4", "data": (0x7000, False),
                 "strides": None, "version": 3, "stream": 1}
  shape, strides = buffer_host.view_layout(base.shape, buffer_host.c_strides(base.shape, 4),
                                           [None, 2], order=[2, 0, 1])
  ro = buffer_host.BlockBuffer(base, shape, strides, writeable=False)
  assert ro.__cuda_array_interface__["shape"] == (6, 4, 2)
  assert ro.__cuda_array_interface__["strides"] == (4, 120, 24)
  assert ro.__cuda_array_interface__["data"] == (0x7000, True)
  assert view.__dlpack_device__() == (2, 0)
  with pytest.raises(TypeError, match="CUDA buffer has no NumPy view"):
    np.asarray(view)
  with pytest.raises(BufferError, match="__cuda_array_interface__"):
    view.__dlpack__()
  whole = buffer_host.BlockBuffer(base, base.shape, buffer_host.c_strides(base.shape, 4),
                                  writeable=True)
  assert whole.__dlpack__(stream=1) == "capsule" and base.exported == 1


class _HostMemoryDriver:
  """Stands in for the CUDA driver: 'device' addresses are host addresses."""

  def __init__(self):
    self.streams = []

  def copy(self, dst, src, nbytes, stream):
    ctypes.memmove(dst, src, nbytes)
    self.streams.append(stream)
    return 0

  def sync(self, stream):
    self.streams.append(("sync", stream))
    return 0


def test_block_vector_is_read_on_the_call_stream():
  vector = np.asarray([8, 0, 2, 3], np.int64)
  driver = _HostMemoryDriver()
  got = buffer_host.device_to_host(vector.ctypes.data, 4, 77, driver)
  np.testing.assert_array_equal(got, vector)
  assert driver.streams == [77, ("sync", 77)]

  class Failing(_HostMemoryDriver):
    def sync(self, stream):
      return 700

  with pytest.raises(buffer_host.CallbackError, match="status 700"):
    buffer_host.device_to_host(vector.ctypes.data, 4, 0, Failing())


def test_export_is_refused_as_for_jax_callbacks():
  f = bp.buffer_callback(_add_rows, S((4,), np.float32), num_batch_dims=1)
  x = np.ones(4, np.float32)
  with pytest.raises(NotImplementedError, match="serialization of host_callbacks"):
    jax.export.export(jax.jit(lambda x: f(x, x)))(x)


def test_a_whole_batch_on_one_device_is_not_read_from_the_block_vector(monkeypatch):
  """On a GPU reading the block vector is a copy and a stream wait; a device
  whose buffers hold the whole batch (each batch dim at its global extent,
  at least 2) knows its block without it. Extent 1 may be padding: read."""
  reads = []
  read = buffer_host.read_block_vector
  monkeypatch.setattr(buffer_host, "read_block_vector",
                      lambda block, ctx: reads.append(1) or read(block, ctx))
  x = np.arange(12, dtype=np.float32).reshape(4, 3)
  f = jax.jit(bp.buffer_callback(_add_rows, S((4, 3), np.float32), num_batch_dims=1))
  np.testing.assert_array_equal(f(x, x), 3 * x)
  assert reads == []
  g = jax.jit(bp.buffer_callback(_add_rows, S((1, 3), np.float32), num_batch_dims=1))
  np.testing.assert_array_equal(g(x[:1], x[:1]), 3 * x[:1])
  assert reads == [1]
