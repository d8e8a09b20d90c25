"""Compile-and-inspect helpers for the multi-device tests."""

import jax
import numpy as np

from batchpart import _hlo


def compiled_text(f, *args) -> str:
  return jax.jit(f).lower(*args).compile().as_text()


def collective_kinds(text: str) -> set[str]:
  return {c.opcode for c in _hlo.collectives(text)}


def the_custom_call(text: str, target: str):
  calls = _hlo.custom_calls(text, target)
  assert len(calls) == 1, f"expected one call to {target}, found {len(calls)}"
  return calls[0]


def local_shapes(call) -> list[tuple[int, ...]]:
  return [t.shape for t in call.operand_types]


def put(x, mesh, spec):
  return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))


def rng(seed=0):
  return np.random.default_rng(seed)
