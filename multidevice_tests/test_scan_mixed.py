"""A scan call among other kinds of dims in one program, on 8 devices under
Shardy and GSPMD, and the scan's errors at lowering and at loading.

One jitted program chains a parallel scan (the linear recurrence over t), a
halo call on its per-step result (``batchpart_test_stencil`` along t), a
reduce= call on that (``batchpart_test_reduce_rows``, t reduced by a sum) and
a sequential scan (the tanh RNN) entered with a state computed from the
reduction, every one with t split 8 ways: values against NumPy (float64,
within the fold's reassociation), and the compiled program never moves more
than a summary-sized array or a halo slab between devices. The same steps in
a ``jax.lax.fori_loop`` carry the scan's final state from step to step; under
``jax.vmap`` the vmapped dim is sharded too. A Scan whose merge or apply
closes over a value traced in the jitted function is refused when lowered;
an exported parallel scan that does not carry its merge, loaded in a
process that never declared it, raises ValueError naming it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import batchpart as bp
import batchpart.testing as bt
from batchpart import _hlo
from batchpart._partition import export
from batchpart._vocab.dims import scan as scan_dim

from helpers import local_shapes, put, the_custom_call

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("x64")]
S = jax.ShapeDtypeStruct
LINEAR = "batchpart_test_linear_scan"
STENCIL = "batchpart_test_stencil"
ROWS = "batchpart_test_reduce_rows"
RNN = "batchpart_test_tanh_rnn"
LO, HI = 2, 1          # the stencil's window along t
B, T, K = 4, 64, 3
WEIGHTS = np.array([1.0, -0.5, 0.25])   # the k columns the reduction sums t into
TOL = 1e-11


# ---- the calls, and NumPy's versions of them ---------------------------------

def linear(a, x, h):
  """(y, h_T, prod a) of h[t] = a[t] h[t-1] + x[t]: a parallel scan over t."""
  return bt.linear_scan(a.shape, a.dtype)(a, x, h, reverse=np.int64(0))


def stencil(y):
  """sum over d in [-LO, HI] of (1 + d + LO) y[t + d], zero outside: a halo
  call along t."""
  return bp.ffi_call(STENCIL, S(y.shape, y.dtype), signature="(n)->(n)",
                     halo={"n": bp.Halo(LO, HI)})(
      y, rank=np.int64(1), lo=np.int64(LO), hi=np.int64(HI),
      mode=np.int64(bt.HALO_MODES["zero"]))


def rows(z, w):
  """sum over t of w[t] z[t] WEIGHTS[k]: t reduced by a sum."""
  return bt.reduce_rows(z[..., None] * WEIGHTS, w, "sum")


def rnn(x, h):
  """(y, h_T) of h[t] = tanh(0.5 h[t-1] + x[t]): a sequential scan over t."""
  return bp.ffi_call(RNN, (S(x.shape, x.dtype), S(h.shape, h.dtype)),
                     signature="(t),()->(t),()", scan={"t": bp.Scan((1, 1))})(
      x, h, w=0.5, reverse=np.int64(0))


def program(a, x, h0, w):
  """Each call fed by the one before: the RNN's input is the stencil's
  result and its initial state comes from the reduction."""
  y, h_T, _ = linear(a, x, h0)
  z = stencil(y)
  r = rows(z, w)
  g, g_T = rnn(0.1 * z, jnp.tanh(r[..., 0]))
  return y, h_T, z, r, g, g_T


def linear_ref(a, x, h):
  y = np.zeros_like(x)
  for t in range(x.shape[-1]):
    h = a[..., t] * h + x[..., t]
    y[..., t] = h
  return y, h


def stencil_ref(y):
  padded = np.pad(y, [(0, 0)] * (y.ndim - 1) + [(LO, HI)])
  n = y.shape[-1]
  return sum((1 + d + LO) * padded[..., LO + d:LO + d + n] for d in range(-LO, HI + 1))


def rnn_ref(x, h):
  y = np.zeros_like(x)
  for t in range(x.shape[-1]):
    h = np.tanh(0.5 * h + x[..., t])
    y[..., t] = h
  return y, h


def program_ref(a, x, h0, w):
  y, h_T = linear_ref(a, x, h0)
  z = stencil_ref(y)
  r = (w * z).sum(-1)[..., None] * WEIGHTS
  g, g_T = rnn_ref(0.1 * z, np.tanh(r[..., 0]))
  return y, h_T, z, r, g, g_T


def data(batch=(B,), seed=0):
  rng = np.random.default_rng(seed)
  a = rng.uniform(0.8, 1.0, (*batch, T))
  x = rng.standard_normal((*batch, T))
  h0 = rng.standard_normal(batch)
  w = rng.standard_normal((*batch, T)) / T
  return a, x, h0, w


def check(got, want):
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, rtol=TOL, atol=TOL)


def largest_collective(text) -> int:
  """The most elements any collective in ``text`` yields."""
  return max(int(np.prod(t.shape)) for c in _hlo.collectives(text) for t in c.result_types)


# ---- one program -------------------------------------------------------------

def test_scan_halo_reduce_and_sequential_scan_feed_one_another(partitioner, mesh8):
  a, x, h0, w = data()
  seq = P(None, "x")
  args = [put(a, mesh8, seq), put(x, mesh8, seq), put(h0, mesh8, P()), put(w, mesh8, seq)]
  f = jax.jit(program)
  got = f(*args)
  check(got, program_ref(a, x, h0, w))
  y, _, z, _, g, _ = got
  assert y.sharding.spec == z.sharding.spec == g.sharding.spec == seq
  text = f.lower(*args).compile().as_text()
  # Each call runs on its device's part of t: the two passes of the linear
  # scan and each of the RNN's stages on 8 steps, the stencil on them and its
  # LO + HI halo, the reduction on 8 rows.
  passes = _hlo.custom_calls(text, LINEAR)
  assert len(passes) == 2 and all(local_shapes(c)[:2] == [(B, 8)] * 2 for c in passes)
  assert local_shapes(the_custom_call(text, STENCIL)) == [(B, 8 + LO + HI)]
  assert local_shapes(the_custom_call(text, ROWS)) == [(B, 8, K), (B, 8)]
  assert all(local_shapes(c)[0] == (B, 8) for c in _hlo.custom_calls(text, RNN))
  # Nothing gathers the sequence: the largest thing moved is the 8 parts'
  # (h_T, prod a) or final states (8 x B), not B x T.
  assert largest_collective(text) <= 8 * B, _hlo.collectives(text)
  kinds = {c.opcode for c in _hlo.collectives(text)}
  assert {"all-gather", "collective-permute", "all-reduce"} <= kinds, kinds
  # The RNN's 7 hand-offs of its B-element state, part to part (its parts
  # are too short to pipeline over the batch).
  handoffs = [c for c in _hlo.collectives(text) if c.opcode == "collective-permute" and
              [t.shape for t in c.result_types] == [(B,)]]
  assert len(handoffs) == 7, _hlo.collectives(text)


def test_in_a_fori_loop_the_scan_state_is_carried(partitioner, mesh8):
  a, x, h0, w = data(seed=1)
  steps = 4

  def loop(a, x, h, w):
    def step(_, carry):
      h, total = carry
      y, h_T, _ = linear(a, x, h)
      r = rows(stencil(y), w)
      # The scan's final state goes on to the next step, nudged by the
      # reduction of the halo call's result.
      return 0.5 * h_T + 0.1 * r[..., 0], total + r
    return jax.lax.fori_loop(0, steps, step, (h, jnp.zeros((B, K), h.dtype)))

  seq = P(None, "x")
  args = [put(a, mesh8, seq), put(x, mesh8, seq), put(h0, mesh8, P()), put(w, mesh8, seq)]
  f = jax.jit(loop)
  h_got, total_got = f(*args)
  h, total = h0, np.zeros((B, K))
  for _ in range(steps):
    y, h_T = linear_ref(a, x, h)
    r = (w * stencil_ref(y)).sum(-1)[..., None] * WEIGHTS
    h, total = 0.5 * h_T + 0.1 * r[..., 0], total + r
  check((h_got, total_got), (h, total))
  text = f.lower(*args).compile().as_text()
  assert "while" in text
  assert largest_collective(text) <= 8 * B, _hlo.collectives(text)


def test_under_vmap_with_the_vmapped_dim_sharded_too(partitioner, mesh2x4):
  """The vmapped dim on the mesh's first axis and t on its second (4
  parts): each call keeps both splits, and the sequential scan runs its 4
  stages within each row of the mesh."""
  a, x, h0, w = data(batch=(2, B), seed=2)
  seq = P("a", None, "b")
  args = [put(a, mesh2x4, seq), put(x, mesh2x4, seq), put(h0, mesh2x4, P("a")),
          put(w, mesh2x4, seq)]
  f = jax.jit(jax.vmap(program))
  got = f(*args)
  check(got, program_ref(a, x, h0, w))
  assert got[4].sharding.spec == seq
  text = f.lower(*args).compile().as_text()
  assert local_shapes(the_custom_call(text, STENCIL)) == [(1, B, 16 + LO + HI)]
  assert all(local_shapes(c)[0] == (1, B, 16) for c in _hlo.custom_calls(text, RNN))
  assert largest_collective(text) <= 4 * B, _hlo.collectives(text)


# ---- errors ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["merge", "apply"])
def test_a_scan_closing_over_a_traced_value_is_refused(partitioner, mesh8, where):
  a, x, h0, _ = data()
  seq = P(None, "x")

  def f(a, x, h, scale):
    # scale is traced in this jit: the per-device module where merge and
    # apply run has no such value.
    def merge(p, q):
      k = scale if where == "merge" else 1.0
      return bt.linear_merge((p[0] * k, p[1]), q)

    def apply(summary, state):
      k = scale if where == "apply" else 1.0
      return bt.linear_apply(summary, state * k)

    call = bp.ffi_call(LINEAR, (S(a.shape, a.dtype), S(h.shape, h.dtype), S(h.shape, h.dtype)),
                       signature="(t),(t),()->(t),(),()",
                       scan={"t": bp.Scan((2, 1), merge=merge, apply=apply)})
    return call(a, x, h, reverse=np.int64(0))

  with pytest.raises(ValueError, match=rf"{LINEAR}.*the Scan's {where} closes over 1 traced"):
    jax.jit(f).lower(put(a, mesh8, seq), put(x, mesh8, seq), h0, 2.0)


def test_an_exported_scan_that_does_not_carry_its_merge_raises(partitioner, mesh8,
                                                                monkeypatch):
  """An artifact without the Scan's functions (as a batchpart that did not
  carry them wrote it), loaded where they were never declared."""
  # A shape no other test uses: a program compiled before in this process
  # would be taken from jax's cache without being partitioned again.
  a, x, h0, _ = data(batch=(3,), seed=3)
  a, x = a[:, :56], x[:, :56]
  seq = NamedSharding(mesh8, P(None, "x"))
  monkeypatch.setattr(export, "carried_functions", lambda ctx, d: {})
  exported = jax.export.export(
      jax.jit(lambda a, x, h: linear(a, x, h)),
      disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(LINEAR)])(
      S(a.shape, a.dtype, sharding=seq), S(x.shape, x.dtype, sharding=seq),
      S(h0.shape, h0.dtype, sharding=NamedSharding(mesh8, P())))
  loaded = jax.export.deserialize(exported.serialize())
  # A process that never declared the merge: its registry is empty.
  monkeypatch.setattr(scan_dim.SCANS, "_by_name", {})
  with pytest.raises(ValueError, match=rf"the call to '{LINEAR}' scans with the merge "
                                       r"'scan_[0-9a-f]+', which this process has not "
                                       r"declared and the program does not carry"):
    jax.jit(loaded.call)(jax.device_put(a, seq), jax.device_put(x, seq), h0)
