"""A matrix's results do not depend on the batch it is in: every bp.linalg
function, every dtype, on both sides of every small-matrix switch point,
gives a batch element the same bits when it is called on the whole batch as
when it is called on a slice holding that element, which is what a device's
shard is. The small-matrix kernels (docs/kernels.md) choose their algorithm
by size and dtype alone, and a group too small to repay its padding runs the
one-matrix twins of the interleaved kernels, which compute the same bits;
LAPACK never runs on BLAS threads, whose results differ from one thread's.
multidevice_tests/test_batch_split.py checks the same across device counts."""

from __future__ import annotations

import jax
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from batchpart.testing import SPLIT_OPS, assert_same_bits, split_case

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("x64")]

# Each example compiles a call per slice shape: few examples, in a fixed
# sequence, no shrinking (a failure names what it drew).
EXAMPLES = 8


@st.composite
def splits(draw, largest: int = 40):
  """A batch size and the contiguous slices, as shards, that cover it: one
  holds a single element (a lone matrix on a device), cut at up to two
  more points."""
  batch = draw(st.integers(1, largest), label="batch")
  lone = draw(st.integers(0, batch - 1), label="lone element")
  cuts = draw(st.lists(st.integers(1, batch), max_size=2), label="cuts")
  bounds = sorted({0, lone, lone + 1, batch, *cuts})
  return batch, list(zip(bounds, bounds[1:]))


@pytest.mark.parametrize("name", SPLIT_OPS)
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_slices_get_the_batch_bits(name, data):
  # A large matrix is a chunk of its own on the thread pool: a few show it.
  (batch, slices), f, operands, what = split_case(
      data.draw, name, lambda n: data.draw(splits(5 if n > 64 else 40), label="batch, slices"))
  whole = f(*operands)
  for lo, hi in slices:
    part = f(*(x[lo:hi] for x in operands))
    assert_same_bits(part, jax.tree.map(lambda r, lo=lo, hi=hi: r[lo:hi], whole),
                     f"{what}: batch elements [{lo}, {hi}) of {batch}")
