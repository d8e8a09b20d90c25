"""Property suite for batch dims anywhere: random signatures with ``...`` at
random positions, against NumPy.

Every example draws
- a mesh over the 8 devices ((8,), (2,4), (4,2), (2,2,2); Auto axes),
- a call of ``batchpart_test_core_sum`` (``(a..,...,t..),(c..,...,d..) ->
  (e..,...,f..)``) whose operands and result have 0-2 core dims before the
  ``...`` and 0-2 after it, named uniquely in the signature,
- a batch shape of rank 1-2 (sizes the mesh mostly does not divide) with
  broadcasting in the operands (missing leading batch dims, size-1 dims),
- a PartitionSpec for every operand dim (core dims included) and sometimes
  for the result, and sometimes a ``jax.vmap`` over one more dim of x,
- the partitioner (Shardy or GSPMD),

compiles the call under ``jax.jit`` and checks the result against NumPy.

Examples: 300 by default (``BATCHPART_ANYWHERE_EXAMPLES``).
"""

from __future__ import annotations

import collections
import os

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax._src.sharding import IndivisibleError  # not public in jax 0.10.2
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp

from helpers import divides, draw_auto_mesh, known_bug_report, property_settings, random_spec

EXAMPLES = int(os.environ.get("BATCHPART_ANYWHERE_EXAMPLES", "300"))
CORE_SUM = "batchpart_test_core_sum"
MESH_SHAPES = [(8,), (2, 4), (4, 2), (2, 2, 2)]
BATCH_SIZES = [1, 2, 3, 4, 6, 8, 16]
CORE_SIZES = [1, 2, 3, 4, 8]
KNOWN_BUG_HITS: collections.Counter = collections.Counter()


def _core_shape(data, label):
  lead = data.draw(st.integers(0, 2), label=f"{label}: core dims before '...'")
  trail = data.draw(st.integers(0, 2), label=f"{label}: core dims after '...'")
  sizes = [data.draw(st.sampled_from(CORE_SIZES), label=f"{label}: core size")
           for _ in range(lead + trail)]
  return sizes[:lead], sizes[lead:]


def _operand_batch(data, batch, label):
  """The operand's batch shape: the broadcast batch shape with leading dims
  dropped or dims set to 1."""
  drop = data.draw(st.integers(0, len(batch)), label=f"{label}: missing batch dims")
  shape = list(batch[drop:])
  for m in range(len(shape)):
    if data.draw(st.booleans(), label=f"{label}: broadcast dim {m}") and \
        data.draw(st.booleans(), label=f"{label}: really"):
      shape[m] = 1
  return shape


def _group(prefix, lead, trail):
  names = [f"{prefix}{i}" for i in range(len(lead) + len(trail))]
  return "(" + ",".join([*names[:len(lead)], "...", *names[len(lead):]]) + ")"


def _per_batch(a, lead, trail):
  return a.sum(axis=(*range(lead), *range(a.ndim - trail, a.ndim)), dtype=np.float64)


def _reference(x, y, xl, xt, yl, yt, out_shape, ol, ot):
  s = _per_batch(x, xl, xt) + _per_batch(y, yl, yt)
  rank = len(out_shape) - ol - ot
  s = s.reshape((1,) * (rank - s.ndim) + s.shape)
  return np.broadcast_to(s.reshape((1,) * ol + s.shape + (1,) * ot), out_shape)


_report_known_bug_hits = known_bug_report("batch-dims-anywhere properties", EXAMPLES,
                                          KNOWN_BUG_HITS)


@pytest.mark.timeout(max(600, 2 * EXAMPLES))
@property_settings(EXAMPLES)
@given(data=st.data())
def test_signatures_with_ellipsis_equal_numpy(data):
  partitioner = data.draw(st.sampled_from(["shardy", "gspmd"]), label="partitioner")
  mesh = draw_auto_mesh(data, MESH_SHAPES)
  rank = data.draw(st.integers(1, 2), label="batch rank")
  batch = [data.draw(st.sampled_from(BATCH_SIZES), label="batch size") for _ in range(rank)]
  (xl, xt), (yl, yt), (ol, ot) = (_core_shape(data, w) for w in ("x", "y", "out"))
  x_batch = _operand_batch(data, batch, "x")
  y_batch = _operand_batch(data, batch, "y")
  # The broadcast batch shape is what the operands give (a dim every operand
  # has as 1 stays 1, one no operand has is not there).
  full = list(np.broadcast_shapes(tuple(x_batch), tuple(y_batch)))
  x_shape, y_shape = (*xl, *x_batch, *xt), (*yl, *y_batch, *yt)
  out_shape = (*ol, *full, *ot)
  signature = (f"{_group('x', xl, xt)},{_group('y', yl, yt)}->{_group('o', ol, ot)}")
  rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="values seed"))
  x = rng.standard_normal(x_shape).astype(np.float32)
  y = rng.standard_normal(y_shape).astype(np.float32)
  attrs = {k: np.int64(v) for k, v in dict(
      x_lead=len(xl), x_trail=len(xt), y_lead=len(yl), y_trail=len(yt),
      out_lead=len(ol), out_trail=len(ot)).items()}

  def call(x, y):
    return bp.ffi_call(CORE_SUM, jax.ShapeDtypeStruct(out_shape, x.dtype),
                       signature=signature)(x, y, **attrs)

  def reference(x):
    return _reference(x, y, len(xl), len(xt), len(yl), len(yt), out_shape, len(ol),
                      len(ot))

  fn, ref = call, reference(x)
  if data.draw(st.booleans(), label="vmap") and data.draw(st.booleans(), label="really"):
    axis = data.draw(st.integers(0, x.ndim), label="vmapped dim of x")
    size = data.draw(st.sampled_from([2, 3, 4]), label="vmapped size")
    scale = np.arange(1, size + 1, dtype=np.float32)
    x = np.stack([s * x for s in scale], axis=axis)
    fn = jax.vmap(call, in_axes=(axis, None))
    ref = np.stack([reference(s * np.take(x, 0, axis=axis)) for s in scale])
  operands = [x, y]
  specs = [random_spec(data, mesh, a.ndim, f"operand {i}") for i, a in enumerate(operands)]
  result_spec = None
  if data.draw(st.booleans(), label="constrain the result"):
    result_spec = random_spec(data, mesh, ref.ndim, "result")

  def program(*operands):
    operands = [jax.lax.with_sharding_constraint(a, NamedSharding(mesh, s))
                for a, s in zip(operands, specs)]
    out = fn(*operands)
    if result_spec is not None:
      out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, result_spec))
    return out

  args = [jax.device_put(a, NamedSharding(mesh, s if divides(mesh, s, a.shape) else P()))
          for a, s in zip(operands, specs)]
  previous = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
  try:
    try:
      out = np.asarray(jax.jit(program)(*args))
    except IndivisibleError:
      # As in test_properties: GSPMD's re-batched output sharding may split
      # a mesh axis, which jax cannot write as the output's NamedSharding.
      KNOWN_BUG_HITS[f"{partitioner}: output sharding splits a mesh axis"] += 1
      out = np.asarray(jax.jit(program, out_shardings=NamedSharding(mesh, P()))(*args))
  finally:
    jax.config.update("jax_use_shardy_partitioner", previous)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4,
                             err_msg=f"signature {signature}, specs {specs}")
