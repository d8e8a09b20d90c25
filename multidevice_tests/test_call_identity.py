"""Each call is partitioned from what it carries.

Calls to one target with equal operand/result types and attributes that
differ in layouts, batch ranks, aliases or side effects are partitioned each
by its own description, whatever the order of lowering and compiling and
whichever threads do it. Plain ``jax.ffi.ffi_call``s to a marked target are
untouched by batchpart.
"""

from __future__ import annotations

import concurrent.futures
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax.sharding import PartitionSpec as P

import batchpart as bp
from batchpart import _core, _hlo

from helpers import collective_kinds, local_shapes, put, the_custom_call

S = jax.ShapeDtypeStruct
COPY = "batchpart_test_copy_bytes"
AXPY = "batchpart_test_axpy"
SHAPE = (8, 8, 8)   # square core dims: a transposing layout keeps the types


def _copy(layout, *, num_batch_dims=None, side_effect=False):
  """copy_bytes on (..., n, n): memory as laid out, so a column-major operand
  layout (``layout=(0, 2, 1)``, major-to-minor) transposes each matrix."""
  kw = ({"signature": "(m,n)->(m,n)"} if num_batch_dims is None
        else {"num_batch_dims": num_batch_dims})

  def f(x):
    layouts = None
    if layout is not None:
      layouts = [(*range(x.ndim - 2), x.ndim - 1, x.ndim - 2)]
    return bp.ffi_call(COPY, S(x.shape, x.dtype), has_side_effect=side_effect,
                       input_layouts=layouts, **kw)(x)
  return f


def _expected(x, layout):
  return np.swapaxes(x, -1, -2) if layout == (0, 2, 1) else x


@pytest.fixture
def x():
  return np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)


def test_sequential_variants_keep_their_layouts(partitioner, mesh8, x):
  xs = put(x, mesh8, P("x"))
  for layout in [(0, 2, 1), None, (0, 2, 1), None]:
    out = jax.jit(_copy(layout))(xs)   # a fresh jit each time
    np.testing.assert_array_equal(out, _expected(x, layout))


def test_lowered_on_one_thread_compiled_after_another_lowers(partitioner, mesh8, x):
  xs = put(x, mesh8, P("x"))
  lowered_a = jax.jit(_copy((0, 2, 1))).lower(xs)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    lowered_b = pool.submit(lambda: jax.jit(_copy(None)).lower(xs)).result()
  np.testing.assert_array_equal(lowered_a.compile()(xs), np.swapaxes(x, -1, -2))
  np.testing.assert_array_equal(lowered_b.compile()(xs), x)


@pytest.mark.timeout(240)
def test_threads_compiling_same_typed_variants(partitioner, mesh8, x):
  xs = put(x, mesh8, P("x"))
  barrier = threading.Barrier(4)
  wrong, errors = [], []

  def worker(t):
    try:
      barrier.wait(timeout=60)
      for k in range(8):
        layout = (0, 2, 1) if (t + k) % 2 else None
        out = np.asarray(jax.jit(_copy(layout))(xs))
        if not np.array_equal(out, _expected(x, layout)):
          wrong.append((t, k, layout))
    except BaseException as e:  # noqa: BLE001 - reported below
      errors.append(f"thread {t}: {type(e).__name__}: {e}")

  threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=200)
  assert not errors, errors
  assert wrong == []


def test_batch_ranks_differ_on_equal_types(partitioner, mesh8):
  x = np.arange(2 * 8 * 4 * 4, dtype=np.float32).reshape(2, 8, 4, 4)
  xs = put(x, mesh8, P(None, "x"))
  one = _copy(None, num_batch_dims=1)
  two = _copy(None, num_batch_dims=2)
  for f in (one, two, one, two):
    jax.jit(f).lower(xs)   # interleave the lowerings
  text_two = jax.jit(two).lower(xs).compile().as_text()
  assert collective_kinds(text_two) == set()   # dim 1 is a batch dim: nothing moves
  assert local_shapes(the_custom_call(text_two, COPY)) == [(2, 1, 4, 4)]
  np.testing.assert_array_equal(jax.jit(two)(xs), x)
  np.testing.assert_array_equal(jax.jit(one)(xs), x)


def test_aliases_and_side_effects_differ_on_equal_types(partitioner, mesh8):
  r = np.random.default_rng(0)
  a, b = (r.standard_normal((16, 5)).astype(np.float32) for _ in range(2))
  sa, sb = put(a, mesh8, P("x")), put(b, mesh8, P("x"))

  def axpy(aliases, side_effect):
    return lambda x, y: bp.ffi_call(
        AXPY, S(x.shape, x.dtype), signature="(n),(n)->(n)",
        input_output_aliases=aliases, has_side_effect=side_effect)(
            x, y, alpha=np.float64(2.0))

  variants = [({}, False), ({1: 0}, False), ({}, True), ({1: 0}, True)]
  lowered = [jax.jit(axpy(*v)).lower(sa, sb) for v in variants]
  for low in reversed(lowered):
    np.testing.assert_allclose(low.compile()(sa, sb), 2 * a + b, rtol=1e-6)


def _program(text):
  """A compiled program's instructions without source locations."""
  return [(i.opcode, i.result_types, i.operand_types, i.target)
          for i in _hlo.instructions(text)]


def _plain_softmax(target):
  return lambda x: jax.ffi.ffi_call(target, (S(x.shape, x.dtype),
                                             S(x.shape[:-1], x.dtype)))(x)


def test_plain_ffi_call_to_marked_target_is_untouched(partitioner, mesh8):
  name = f"identity_plain_{partitioner}"
  jax.ffi.register_ffi_target(name, _core.testing.handlers()["softmax"])
  x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
  xs = put(x, mesh8, P("x"))
  before = jax.jit(_plain_softmax(name)).lower(xs).compile().as_text()
  bp.mark_batch_partitionable(name)
  jax.jit(lambda x: bp.ffi_call(name, (S(x.shape, x.dtype), S(x.shape[:-1], x.dtype)),
                                signature="(n)->(n),()")(x))(xs)
  after = jax.jit(_plain_softmax(name)).lower(xs).compile().as_text()
  # What XLA does by default: gather the batch and run it whole everywhere.
  assert _program(after) == _program(before)
  assert local_shapes(the_custom_call(after, name)) == [(16, 8)]
  y, _ = jax.jit(_plain_softmax(name))(xs)
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_unmarked_target_through_batchpart_is_partitioned(partitioner, mesh8):
  name = f"identity_unmarked_{partitioner}"
  jax.ffi.register_ffi_target(name, _core.testing.handlers()["softmax"])
  assert not bp.is_batch_partitionable(name)
  f = lambda x: bp.ffi_call(name, (S(x.shape, x.dtype), S(x.shape[:-1], x.dtype)),
                            signature="(n)->(n),()")(x)
  xs = put(np.ones((16, 8), np.float32), mesh8, P("x"))
  text = jax.jit(f).lower(xs).compile().as_text()
  assert collective_kinds(text) == set()
  assert local_shapes(the_custom_call(text, name)) == [(2, 8)]
  assert bp.is_batch_partitionable(name)


def test_marking_jaxlib_lapack_changes_nothing_for_jnp(partitioner, mesh8):
  r = np.random.default_rng(2)
  m = r.standard_normal((16, 4, 4))
  a = put(m @ np.swapaxes(m, -1, -2) + 4 * np.eye(4), mesh8, P("x"))
  f = jax.jit(jnp.linalg.cholesky)
  before = f.lower(a).compile().as_text()
  want = np.asarray(f(a))
  bp.mark_batch_partitionable("lapack_dpotrf_ffi")
  after = jax.jit(jnp.linalg.cholesky).lower(a).compile().as_text()
  assert _program(after) == _program(before)
  np.testing.assert_array_equal(jax.jit(jnp.linalg.cholesky)(a), want)


# ---- random interleavings ---------------------------------------------------------

_VARIANTS = {
    "copy_t": (_copy((0, 2, 1)), lambda x: np.swapaxes(x, -1, -2)),
    "copy": (_copy(None), lambda x: x),
    "copy_nbd2": (_copy(None, num_batch_dims=2), lambda x: x),
    "copy_nbd1": (_copy(None, num_batch_dims=1), lambda x: x),
    "copy_side": (_copy(None, side_effect=True), lambda x: x),
    "copy_t_side": (_copy((0, 2, 1), side_effect=True), lambda x: np.swapaxes(x, -1, -2)),
}
_SPECS = [P("x"), P(None, "x"), P(), P(None, None, "x")]  # batch, mixed, none, core


@st.composite
def _schedules(draw):
  """Programs (variant, input sharding), and an order of lower/compile steps
  each on one of two threads; a program compiles after it lowers."""
  n = draw(st.integers(2, 4))
  programs = [(draw(st.sampled_from(sorted(_VARIANTS))), draw(st.sampled_from(range(4))))
              for _ in range(n)]
  steps = [("lower", i) for i in range(n)]
  pending = list(range(n))
  order = []
  while steps or pending:
    choices = steps + [("compile", i) for i in pending
                       if ("lower", i) not in steps]
    step = draw(st.sampled_from(choices))
    order.append((step, draw(st.integers(0, 1))))
    if step[0] == "lower":
      steps.remove(step)
    else:
      pending.remove(step[1])
  return programs, order


@pytest.mark.timeout(900)
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(schedule=_schedules(), shardy=st.booleans())
def test_random_interleavings_give_right_values(mesh8, schedule, shardy):
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", shardy)
  try:
    programs, order = schedule
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    inputs = [put(x, mesh8, _SPECS[s]) for _, s in programs]
    lowered, compiled = {}, {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      threads = [concurrent.futures.ThreadPoolExecutor(1) for _ in range(2)]
      try:
        for (kind, i), t in order:
          fn = _VARIANTS[programs[i][0]][0]
          if kind == "lower":
            lowered[i] = threads[t].submit(
                lambda fn=fn, i=i: jax.jit(fn).lower(inputs[i])).result()
          else:
            compiled[i] = threads[t].submit(lowered[i].compile).result()
      finally:
        for t in threads:
          t.shutdown()
    del pool
    for i, (variant, _) in enumerate(programs):
      np.testing.assert_array_equal(compiled[i](inputs[i]), _VARIANTS[variant][1](x),
                                    err_msg=f"{variant} in {programs} / {order}")
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
