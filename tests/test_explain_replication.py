"""The replication rule: how many devices compute each batch element."""

import pytest

from batchpart._explain.replication import replication


@pytest.mark.parametrize("g, l, k, expected", [
    ((64, 16), (8, 16), 1, 1),      # batch split 8 ways
    ((64, 16), (64, 16), 1, 8),     # every device does everything
    ((64, 16), (16, 16), 1, 2),     # 4 ways, each block on 2 devices
    ((64, 16), (64, 16), None, 8),  # plain call: all dims considered
    ((64, 16), (8, 16), None, 1),
    ((10, 3), (2, 3), 1, 1),        # uneven: padded to 16 rows over 8
    ((10, 3), (3, 3), 1, 2),        # uneven: 4 shards of 3 (padded to 12)
    ((4, 4, 5), (2, 1, 5), 2, 1),   # two batch dims over a 2x4 mesh
    ((4, 4, 5), (2, 4, 5), 2, 4),
    ((64, 16), (64, 16), 0, 8),     # no batch dims: one problem everywhere
    ((64, 16), (8, 16), 0, 8),
])
def test_replication_rule(g, l, k, expected):
  assert replication(8, ((g,),), (g,), ((l,),), (l,), k) == expected
  assert replication(8, (g,), (g,), (l,), (l,), k) == expected


def test_replication_uses_the_largest_result_then_operands():
  # results (64, 16) and (64,): the (64, 16) one decides
  assert replication(8, ((64, 16),), ((64, 16), (64,)),
                     ((8, 16),), ((8, 16), (8,)), 1) == 1
  # no results: the operands decide
  assert replication(8, ((64, 16),), (), ((64, 16),), (), 1) == 8


def test_replication_unknown_when_shapes_do_not_fit():
  assert replication(8, ((8,),), ((8,),), ((9,),), ((9,),), 1) is None
  assert replication(8, ((8,),), ((8,),), ((3,),), ((3,),), 1) is None
