"""The planner's reduced dims: a mesh axis that evenly tiles a reduced core
dim stays there, results are replicated over it, and the plan names the
device groups whose partial results one all-reduce combines.

Hypothesis checks, over drawn meshes and shardings, that each group holds
exactly the devices that share one batch block and differ in the part of
the reduced dim, so the all-reduce sums every part once.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_planner import problem, replicated, tiled

from batchpart import _core


def reduced_problem(operands, results, reduced, **kwargs):
  p = problem(operands, results, **kwargs)
  p.operand_reduced_dims = [list(r) for r in reduced]
  return p


def test_reduced_dim_stays_sharded_and_results_replicate_over_it():
  # x (B=4, n=64) on a 2x4 mesh: batch on the first axis, n on the second.
  plan = _core.make_plan(reduced_problem(
      [((4, 64), 1, tiled([2, 4]))], [((4, 6), 1)], [[-1, 0]]))
  assert plan.operand_local_shapes == [[2, 16]]
  assert plan.result_local_shapes == [[2, 6]]
  assert plan.reduce_tiles == 4 and plan.batch_tiles == [2]
  assert plan.replication == 1
  assert [list(g) for g in plan.reduce_groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert repr(plan.result_shardings[0]) == "{devices=[2,1,4]0,1,2,3,4,5,6,7 replicated}"


def test_operand_without_the_reduced_dim_is_replicated_over_its_axes():
  plan = _core.make_plan(reduced_problem(
      [((4, 64), 1, tiled([2, 4])), ((4, 3), 1, replicated())], [((4, 3), 1)],
      [[-1, 0], []]))
  assert plan.operand_local_shapes == [[2, 16], [2, 3]]
  assert repr(plan.operand_shardings[1]) == "{devices=[2,1,4]0,1,2,3,4,5,6,7 replicated}"


def test_every_operand_with_the_reduced_dim_is_split_alike():
  # w shares x's reduced dim n and arrives replicated: it is cut the same way.
  plan = _core.make_plan(reduced_problem(
      [((64,), 0, tiled([8])), ((64, 2), 0, replicated())], [((5,), 0)],
      [[0], [0, -1]]))
  assert plan.operand_local_shapes == [[8], [8, 2]]
  assert repr(plan.operand_shardings[1]) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
  assert [list(g) for g in plan.reduce_groups] == [list(range(8))]


def test_uneven_reduced_split_is_not_kept():
  plan = _core.make_plan(reduced_problem(
      [((8, 10), 1, tiled([1, 4], replicated=2))], [((8,), 1)], [[-1, 0]]))
  assert list(plan.uneven_reductions) == [0]
  assert plan.reduce_groups == [] and plan.reduce_tiles == 1
  assert plan.operand_local_shapes[0][1] == 10


@pytest.mark.parametrize("min_part, kept", [(16, True), (17, False)])
def test_parts_smaller_than_the_minimum_are_not_kept(min_part, kept):
  """A top-k needs k candidates from each part: a finer split keeps the dim
  as any core dim."""
  p = reduced_problem([((4, 64), 1, tiled([2, 4]))], [((4, 6), 1)], [[-1, 0]])
  p.reduced_min_parts = [min_part]
  plan = _core.make_plan(p)
  assert plan.reduce_tiles == (4 if kept else 1)
  assert list(plan.uneven_reductions) == ([] if kept else [0])
  assert plan.operand_local_shapes[0][1] == (16 if kept else 64)


def test_a_result_that_keeps_the_reduced_dim_is_split_along_it():
  """(n,k),(n) -> (k),(n): the (k) result is replicated over n's axis, the
  (n) result tiled along it like the operand."""
  p = reduced_problem([((4, 64, 3), 1, tiled([2, 4, 1]))], [((4, 3), 1), ((4, 64), 1)],
                      [[-1, 0, -1]])
  p.result_reduced_dims = [[], [-1, 0]]
  plan = _core.make_plan(p)
  assert plan.result_local_shapes == [[2, 3], [2, 16]]
  assert repr(plan.result_shardings[1]) == "{devices=[2,4]0,1,2,3,4,5,6,7}"


def test_unsharded_reduced_dim_changes_nothing():
  plan = _core.make_plan(reduced_problem(
      [((8, 16), 1, tiled([8, 1]))], [((8,), 1)], [[-1, 0]]))
  assert plan.reduce_groups == [] and plan.reduce_tiles == 1
  assert plan.batch_tiles == [8]


def test_more_parallelism_wins_over_a_batch_only_result_hint():
  p = reduced_problem([((4, 64), 1, tiled([2, 4]))], [((4,), 1)], [[-1, 0]],
                      result_shardings=[tiled([2], replicated=4)])
  plan = _core.make_plan(p)
  assert plan.reduce_tiles == 4


def test_reduced_dims_on_batch_dims_are_refused():
  with pytest.raises(ValueError, match="cannot be a reduced dim"):
    _core.make_plan(reduced_problem([((4, 64), 1, tiled([2, 4]))], [((4,), 1)], [[0, 0]]))


@st.composite
def sharded_reduction(draw):
  mesh = draw(st.sampled_from([(8,), (2, 4), (4, 2), (2, 2, 2)]))
  devices = draw(st.permutations(range(8)))
  # Each mesh axis goes to the batch dim, the reduced dim or replication.
  roles = draw(st.lists(st.sampled_from("bnr"), min_size=len(mesh), max_size=len(mesh)))
  tiles_b = math.prod(s for s, r in zip(mesh, roles) if r == "b")
  tiles_n = math.prod(s for s, r in zip(mesh, roles) if r == "n")
  batch = tiles_b * draw(st.integers(1, 3))
  n = tiles_n * draw(st.integers(1, 3))
  order = [i for i, r in enumerate(roles) if r == "b"] + \
          [i for i, r in enumerate(roles) if r == "n"] + \
          [i for i, r in enumerate(roles) if r == "r"]
  grid = np.asarray(devices).reshape(mesh).transpose(order)
  rep = math.prod(s for s, r in zip(mesh, roles) if r == "r")
  sharding = tiled([tiles_b, tiles_n], devices=grid.reshape(-1).tolist(), replicated=rep)
  return batch, n, sharding


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(sharded_reduction())
def test_groups_cover_each_part_once_per_batch_block(case):
  batch, n, sharding = case
  plan = _core.make_plan(reduced_problem(
      [((batch, n), 1, sharding)], [((batch, 3), 1)], [[-1, 0]]))
  op = plan.operand_shardings[0]
  tiles = list(op.tile_dims)
  if op.kind != _core.Sharding.Kind.TILED:
    assert plan.reduce_tiles == 1 and plan.reduce_groups == []
    return
  sub = list(op.subgroup_dims)
  grid = np.asarray(op.devices).reshape(tiles + sub)
  where = {int(d): c for c, d in np.ndenumerate(grid)}   # device -> (b, n, rep...)
  assert plan.reduce_tiles == tiles[1]
  if tiles[1] == 1:
    assert plan.reduce_groups == []
    return
  seen = set()
  for group in plan.reduce_groups:
    coords = [where[int(d)] for d in group]
    # One batch block and one replica; every part of n exactly once.
    assert len({(c[0], *c[2:]) for c in coords}) == 1
    assert sorted(c[1] for c in coords) == list(range(tiles[1]))
    seen.update(int(d) for d in group)
  assert seen == set(range(8))
  # Results: batch-sharded as the operand, replicated over the parts of n.
  res = plan.result_shardings[0]
  if res.kind == _core.Sharding.Kind.REPLICATED:
    assert tiles[0] == 1
  else:
    assert list(res.tile_dims) == [tiles[0], 1]
