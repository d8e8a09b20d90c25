"""bp.linalg gives the same bits on 1, 2, 5 and 8 devices: every function
and dtype, over drawn batch sizes and matrix sizes on both sides of the
small-matrix switch points, with the batch sharded over meshes of the first
k simulated devices (uneven batches padded, as XLA shards them). Each
device's shard is a slice of the batch; tests/test_batch_split.py checks
slices on one device, where the reason is explained."""

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from batchpart.testing import SPLIT_OPS, assert_same_bits, split_case

from helpers import property_settings

pytestmark = pytest.mark.timeout(150)

DEVICE_COUNTS = (1, 2, 5, 8)
EXAMPLES = 4


def sharded(f, devices: int):
  """f jitted with its operands' batch dim sharded over the first
  ``devices`` devices."""
  mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))

  def run(*operands):
    spread = [jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("x"))) for x in operands]
    return f(*spread)

  return jax.jit(run)


@pytest.mark.parametrize("name", SPLIT_OPS)
@property_settings(EXAMPLES)
@given(data=st.data())
def test_device_counts_agree(name, data):
  batch, f, operands, what = split_case(
      data.draw, name, lambda n: data.draw(st.integers(1, 12 if n > 64 else 40), label="batch"))
  with jax.enable_x64(True):
    results = {k: jax.device_get(sharded(f, k)(*operands)) for k in DEVICE_COUNTS}
  for k in DEVICE_COUNTS[1:]:
    assert_same_bits(results[k], results[1], f"{what}, batch {batch}: {k} devices")
