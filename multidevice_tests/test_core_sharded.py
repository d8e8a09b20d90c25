"""Core-sharded inputs: the work is split over the devices, the result keeps
a sharding (never replicated), and no all-gather appears, under Shardy,
GSPMD and Explicit mode."""

import jax
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import AxisType, PartitionSpec as P

import batchpart as bp
from batchpart import testing as kernels

from helpers import collective_kinds, put

r = np.random.default_rng(0)
_M = r.standard_normal((64, 16, 16))
SPD = (_M @ np.swapaxes(_M, -1, -2) + 16 * np.eye(16)).astype(np.float32)
ROWS = r.standard_normal((16, 64)).astype(np.float32)

OPS = {
    "softmax": (lambda x: kernels.softmax(x)[0], ROWS,
                lambda x: kernels.softmax_reference(x)[0]),
    "cholesky": (bp.linalg.cholesky, SPD, np.linalg.cholesky),
    "eigh": (lambda a: bp.linalg.eigh(a)[0], SPD, np.linalg.eigvalsh),
    "qr": (lambda a: bp.linalg.qr(a)[1], SPD, lambda a: np.linalg.qr(a)[1]),
    "svd": (lambda a: bp.linalg.svd(a, compute_uv=False), SPD,
            lambda a: np.linalg.svd(a, compute_uv=False)),
    "lu": (lambda a: bp.linalg.lu(a)[0], SPD,
           lambda a: np.stack([scipy.linalg.lu_factor(m)[0] for m in a])),
    "solve": (lambda a: bp.linalg.solve(a, a), SPD,
              lambda a: np.broadcast_to(np.eye(16, dtype=np.float32), a.shape)),
    "triangular_solve": (lambda a: bp.linalg.triangular_solve(bp.linalg.cholesky(a), a),
                         SPD, lambda a: np.linalg.solve(np.linalg.cholesky(a), a)),
}


def _check(name, out, text, x):
  f, _, ref = OPS[name]
  assert "all-gather" not in collective_kinds(text), collective_kinds(text)
  assert not out.sharding.is_fully_replicated
  np.testing.assert_allclose(np.asarray(out), ref(x), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("name", sorted(OPS))
def test_core_sharded_auto(partitioner, mesh8, name):
  f, x, _ = OPS[name]
  xs = put(x, mesh8, P(None, "x"))
  text = jax.jit(f).lower(xs).compile().as_text()
  assert "all-to-all" in collective_kinds(text)   # the work moved onto batch shards
  _check(name, jax.jit(f)(xs), text, x)


@pytest.mark.parametrize("name", sorted(OPS))
def test_core_sharded_explicit(name):
  f, x, _ = OPS[name]
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    xs = jax.device_put(x, P(None, "x"))
    out = jax.jit(f)(xs)
    text = jax.jit(f).lower(xs).compile().as_text()
    assert jax.typeof(out).sharding.spec[0] == "x"   # typed with the batch sharding
  _check(name, out, text, x)


def _ops_of(text):
  """The compiled entry computation's work: opcode and result types per
  instruction (no parameters, tuples or bitcasts)."""
  from batchpart import _hlo
  entry = text[text.find("ENTRY"):]
  return sorted((i.opcode, tuple(map(str, i.result_types)))
                for i in _hlo.instructions(entry)
                if i.opcode not in ("parameter", "get-tuple-element", "tuple", "constant",
                                    "bitcast", "custom-call"))


@pytest.mark.parametrize("name", [
    "cholesky", "lu", "qr", "svd", "solve",
    pytest.param("eigh", marks=pytest.mark.xfail(strict=True, reason=(
        "eigh's symmetrize_input transposes in jax, so a matrix-dim-sharded input "
        "crosses devices twice (potrf symmetrizes on the device; syevd does not yet)"))),
])
def test_same_program_as_a_hand_written_shard_map(partitioner, mesh8, name):
  """With the batch sharding asked for, batchpart compiles to the program a
  careful user writes by hand: one reshard onto the batch dim, then the
  kernels per shard (no extra copy, relayout or collective)."""
  f, x, _ = OPS[name]
  xs = put(x, mesh8, P(None, "x"))
  out = jax.sharding.NamedSharding(mesh8, P("x"))
  by_hand = jax.shard_map(f, mesh=mesh8, in_specs=P("x"), out_specs=P("x"))
  ours = jax.jit(f, out_shardings=out).lower(xs).compile().as_text()
  theirs = jax.jit(lambda a: by_hand(jax.lax.with_sharding_constraint(a, out)),
                   out_shardings=out).lower(xs).compile().as_text()
  assert _ops_of(ours) == _ops_of(theirs)
