"""The collective walk around a compiled call: async pairs count once, and
the walk stops at instructions that compute across elements."""

from batchpart import _hlo
from batchpart._explain.collectives import collectives
from batchpart._explain.report import Collective

from hlo_sample import HLO


def test_collective_walk():
  m = _hlo.parse_module(HLO)
  call = m.by_name["custom-call.1"]
  before = collectives(m, call, forward=False)
  after = collectives(m, call, forward=True)
  # the async pair counts once, named after the start, sized by the done
  assert before == (Collective("all-gather", 8 * 16 * 4, "all-gather-start",
                                "jit(f)/ffi_call"),)
  # the all-reduce behind the dot belongs to the dot: the walk stops there
  assert [c.kind for c in after] == ["collective-permute"]
