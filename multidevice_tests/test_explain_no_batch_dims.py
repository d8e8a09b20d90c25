"""Calls whose signature has no batch dims (only reduced or halo dims), under
Shardy and GSPMD: ``bp.explain`` reports the shapes and batch dims the user
declared ("batch dims: none"), and the user's call in the compiled program
(the kernel's custom call, or jax's host-callback target) has the user's
shapes: a host callback's unit batch dim, which batchpart adds so that XLA
gives a replicated call to one device, is XLA's partitioner's only."""

import jax
import numpy as np
import scipy.ndimage as ndi
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _hlo, testing as kernels

from helpers import compiled_text, put, rng

S = jax.ShapeDtypeStruct
CALLBACK = "xla_ffi_python_cpu_callback"


def _user_shapes(call, hidden=0):
  """A compiled custom call's operand and result shapes, its first
  ``hidden`` operands (a callback's block vector) left out."""
  return ([t.shape for t in call.operand_types][hidden:], [t.shape for t in call.result_types])


def _only(report):
  (call,) = report.calls
  return call


def _knn(xq, xb, k):
  d2 = ((xq[:, None, :] - xb[None, :, :]) ** 2).sum(-1)
  at = np.argsort(d2, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(d2, at, 1).astype(np.float32), at.astype(np.int32)


def test_callback_with_reduce_and_no_batch_dims(partitioner, mesh8):
  nq, nb, d, k = 6, 64, 4, 3
  xq = rng(0).standard_normal((nq, d)).astype(np.float32)
  xb = rng(1).standard_normal((nb, d)).astype(np.float32)
  out = (S((nq, k), np.float32), S((nq, k), np.int32))
  f = lambda xq, xb: bp.pure_callback(lambda q, b: _knn(q, b, k), out, xq, xb,
                                      signature="(q,d),(n,d)->(q,k),(q,k)",
                                      reduce={"n": "min_k"})
  args = (put(xq, mesh8, P()), put(xb, mesh8, P("x")))
  dist, labels = jax.jit(f)(*args)
  want_dist, want_labels = _knn(xq, xb, k)
  np.testing.assert_allclose(np.asarray(dist), want_dist, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(labels), want_labels)

  report = bp.explain(f, *args)
  call = _only(report)
  assert call.num_batch_dims == 0
  assert call.global_operand_shapes == ((nq, d), (nb, d))
  assert call.global_result_shapes == ((nq, k), (nq, k))
  assert call.device_operand_shapes == ((nq, d), (nb // 8, d))
  assert call.device_result_shapes == ((nq, k), (nq, k))
  assert call.reduced_dims[0].parts == 8 and call.replication == 1
  text = str(report)
  assert "batch dims:  none" in text and "leading" not in text
  assert f"f32[{nb},{d}]" in text and f"f32[1,{nb}" not in text
  # The merge gathers each device's k candidates per query: no unit dim there either.
  (gather,) = call.collectives_after
  assert gather.kind == "all-gather" and gather.bytes == 8 * nq * k * 8

  (hlo_call,) = _hlo.custom_calls(compiled_text(f, *args), CALLBACK)
  assert _user_shapes(hlo_call, hidden=1) == ([(nq, d), (nb // 8, d)], [(nq, k), (nq, k)])


def test_callback_with_halo_and_no_batch_dims(partitioner, mesh8):
  x = rng(2).standard_normal((64,)).astype(np.float32)
  smooth = lambda x: ndi.uniform_filter1d(x, 3, mode="constant")
  f = lambda x: bp.pure_callback(smooth, S(x.shape, x.dtype), x, signature="(n)->(n)",
                                 halo={"n": 1})
  xs = put(x, mesh8, P("x"))
  np.testing.assert_allclose(np.asarray(jax.jit(f)(xs)), smooth(x), rtol=1e-6, atol=1e-6)

  report = bp.explain(f, xs)
  call = _only(report)
  assert call.num_batch_dims == 0
  assert call.global_operand_shapes == ((64,),) and call.global_result_shapes == ((64,),)
  assert call.device_operand_shapes == ((10,),) and call.device_result_shapes == ((10,),)
  assert call.halo_dims[0].parts == 8
  text = str(report)
  assert "batch dims:  none" in text and "f32[1," not in text

  (hlo_call,) = _hlo.custom_calls(compiled_text(f, xs), CALLBACK)
  assert _user_shapes(hlo_call, hidden=1) == ([(10,)], [(10,)])   # an 8-element part + 1 + 1


def test_replicated_callback_without_batch_dims_runs_once(partitioner, mesh8):
  calls = []

  def double(a):
    calls.append(a.shape)
    return a * 2

  x = rng(3).standard_normal((4, 5)).astype(np.float32)
  f = lambda x: bp.pure_callback(double, S(x.shape, x.dtype), x, signature="(a,b)->(a,b)")
  xs = put(x, mesh8, P())
  np.testing.assert_array_equal(np.asarray(jax.jit(f)(xs)), x * 2)
  assert calls == [(4, 5)]   # one device calls it, the others hold padding

  call = _only(bp.explain(f, xs))
  assert call.global_operand_shapes == ((4, 5),) and call.device_operand_shapes == ((4, 5),)
  assert call.num_batch_dims == 0 and call.replication == 1
  (hlo_call,) = _hlo.custom_calls(compiled_text(f, xs), CALLBACK)
  assert _user_shapes(hlo_call, hidden=1) == ([(4, 5)], [(4, 5)])


def test_callback_without_batch_dims_in_shard_map_has_the_user_s_shapes(partitioner, mesh8):
  x = rng(4).standard_normal((16, 3)).astype(np.float32)
  f = jax.jit(jax.shard_map(
      lambda x: jax.lax.psum(bp.pure_callback(np.sin, S(x.shape, x.dtype), x,
                                              signature="(a,b)->(a,b)"), "x"),
      mesh=mesh8, in_specs=P("x"), out_specs=P(), check_vma=False))
  xs = put(x, mesh8, P("x"))
  np.testing.assert_allclose(np.asarray(f(xs)), np.sin(x).reshape(8, 2, 3).sum(0), rtol=1e-5)
  call = _only(bp.explain(f, xs))
  assert call.global_operand_shapes == ((2, 3),) and call.num_batch_dims == 0
  (hlo_call,) = _hlo.custom_calls(compiled_text(f, xs), CALLBACK)
  assert _user_shapes(hlo_call, hidden=1) == ([(2, 3)], [(2, 3)])


def test_ffi_call_with_reduce_and_no_batch_dims(partitioner, mesh8):
  nq, nk, d, e = 4, 64, 8, 5
  r = rng(5)
  q = r.standard_normal((nq, d)).astype(np.float32)
  k = r.standard_normal((nk, d)).astype(np.float32)
  v = r.standard_normal((nk, e)).astype(np.float32)
  bias = np.zeros((nk,), np.float32)
  f = lambda *a: kernels.attention(*a)
  args = (put(q, mesh8, P()), *(put(a, mesh8, P("x")) for a in (k, v, bias)))
  o, lse = jax.jit(f)(*args)
  want_o, want_lse = kernels.attention_reference(q, k, v, bias)
  np.testing.assert_allclose(np.asarray(o), want_o, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)

  call = _only(bp.explain(f, *args))
  assert call.num_batch_dims == 0
  assert call.device_operand_shapes == ((nq, d), (8, d), (8, e), (8,))
  assert "batch dims:  none" in str(bp.explain(f, *args))
  (hlo_call,) = _hlo.custom_calls(compiled_text(f, *args), "batchpart_test_attention")
  assert _user_shapes(hlo_call) == ([(nq, d), (8, d), (8, e), (8,)], [(nq, e), (nq,)])


def test_ffi_call_with_halo_and_no_batch_dims(partitioner, mesh8):
  x = rng(6).standard_normal((64,)).astype(np.float32)
  attrs = dict(rank=np.int64(1), lo=np.int64(1), hi=np.int64(2),
               mode=np.int64(kernels.HALO_MODES["zero"]))
  f = lambda x: bp.ffi_call("batchpart_test_stencil", S(x.shape, x.dtype),
                            signature="(n)->(n)", halo={"n": bp.Halo(1, 2)})(x, **attrs)
  whole = np.asarray(jax.jit(lambda x: jax.ffi.ffi_call(
      "batchpart_test_stencil", S(x.shape, x.dtype))(x, **attrs))(x))
  xs = put(x, mesh8, P("x"))
  np.testing.assert_array_equal(np.asarray(jax.jit(f)(xs)), whole)

  call = _only(bp.explain(f, xs))
  assert call.num_batch_dims == 0 and call.global_operand_shapes == ((64,),)
  assert "batch dims:  none" in str(bp.explain(f, xs))
  (hlo_call,) = _hlo.custom_calls(compiled_text(f, xs), "batchpart_test_stencil")
  assert _user_shapes(hlo_call) == ([(11,)], [(11,)])   # an 8-element part + 1 + 2


def test_buffer_callback_without_batch_dims_gets_the_user_s_shapes(partitioner, mesh8):
  seen = []

  def add_one(ctx, out, x):
    seen.append((tuple(x.shape), tuple(out.shape)))
    np.asarray(out)[...] = np.asarray(x) + 1

  x = rng(7).standard_normal((4, 5)).astype(np.float32)
  f = bp.buffer_callback(add_one, S(x.shape, x.dtype), signature="(a,b)->(a,b)")
  xs = put(x, mesh8, P())
  np.testing.assert_array_equal(np.asarray(jax.jit(f)(xs)), x + 1)
  assert seen == [((4, 5), (4, 5))]   # one call, on one device
  (hlo_call,) = _hlo.custom_calls(compiled_text(f, xs), "xla_buffer_python_cpu_callback")
  assert _user_shapes(hlo_call, hidden=1) == ([(4, 5)], [(4, 5)])
