"""The C++ partition planner, tested directly through nanobind.

Unit cases pin down the plans docs/design.md describes; hypothesis checks, over
random meshes, shardings and shapes, that every plan makes each device
compute exactly the batch elements it outputs.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from batchpart import _core

Kind = _core.Sharding.Kind
Subgroup = _core.Sharding.Subgroup
NUM_DEVICES = 8


def tiled(tile_dims, devices=None, replicated=1, manual=1):
  s = _core.Sharding()
  s.kind = Kind.TILED
  s.tile_dims = list(tile_dims)
  if manual > 1:
    s.subgroup_dims = s.subgroup_dims + [manual]
    s.subgroup_kinds = s.subgroup_kinds + [Subgroup.MANUAL]
  if replicated > 1:
    s.subgroup_dims = s.subgroup_dims + [replicated]
    s.subgroup_kinds = s.subgroup_kinds + [Subgroup.REPLICATED]
  s.devices = list(range(s.num_tiles())) if devices is None else list(devices)
  return s


def replicated():
  return _core.Sharding()


def problem(operands, results, rebatch=True, result_shardings=None):
  p = _core.Problem()
  p.operand_shapes = [list(s) for s, _, _ in operands]
  p.operand_batch_ranks = [b for _, b, _ in operands]
  p.operand_shardings = [h for _, _, h in operands]
  p.result_shapes = [list(s) for s, _ in results]
  p.result_batch_ranks = [b for _, b in results]
  if result_shardings is not None:
    p.result_shardings = result_shardings
  p.rebatch = rebatch
  return p


# ---- unit cases -------------------------------------------------------------

def test_batch_sharded_stays_put():
  plan = _core.make_plan(problem([((64, 16), 1, tiled([8, 1]))], [((64, 16), 1), ((64,), 1)]))
  assert plan.operand_local_shapes == [[8, 16]]
  assert plan.result_local_shapes == [[8, 16], [8]]
  assert plan.batch_tiles == [8] and plan.replication == 1
  assert repr(plan.result_shardings[1]) == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_core_sharded_moves_onto_batch():
  plan = _core.make_plan(problem([((64, 16), 1, tiled([1, 8]))], [((64, 16), 1)]))
  assert plan.operand_local_shapes == [[8, 16]] and plan.replication == 1
  assert list(plan.operand_shardings[0].tile_dims) == [8, 1]


def test_core_sharded_without_rebatch_replicates():
  plan = _core.make_plan(problem([((64, 16), 1, tiled([1, 8]))], [((64, 16), 1)],
                                 rebatch=False))
  assert plan.operand_local_shapes == [[64, 16]] and plan.replication == 8


def test_core_axis_that_does_not_divide_is_split():
  # batch 12: 8 does not divide it, its factor 4 does; the rest is replicated.
  plan = _core.make_plan(problem([((12, 16), 1, tiled([1, 8]))], [((12, 16), 1)]))
  assert plan.batch_tiles == [4] and plan.replication == 2
  assert plan.operand_local_shapes == [[3, 16]]


def test_core_axis_goes_to_a_batch_dim_it_divides():
  plan = _core.make_plan(problem([((3, 8, 16), 2, tiled([1, 1, 8]))], [((3, 8, 16), 2)]))
  assert plan.batch_tiles == [1, 8] and plan.operand_local_shapes == [[3, 1, 16]]


def test_two_axis_mesh_batch_and_core():
  # devices [2 (batch), 4 (core)]: the core axis joins the batch axis as its minor part.
  plan = _core.make_plan(problem([((16, 8), 1, tiled([2, 4]))], [((16, 8), 1)]))
  assert plan.batch_tiles == [8]
  assert list(plan.operand_shardings[0].devices) == list(range(8))


def test_partial_replication_is_kept():
  plan = _core.make_plan(problem([((16, 8), 1, tiled([4, 1], replicated=2))], [((16, 8), 1)]))
  assert plan.batch_tiles == [4] and plan.replication == 2
  assert plan.operand_local_shapes == [[4, 8]]


def test_broadcast_operand_is_replicated_not_tiled():
  plan = _core.make_plan(problem(
      [((16, 4, 6), 1, tiled([8, 1, 1])), ((6,), 0, replicated())], [((16, 4), 1)]))
  assert plan.operand_local_shapes == [[2, 4, 6], [6]]
  assert plan.operand_shardings[1].kind == Kind.REPLICATED


def test_size_one_batch_dim_broadcasts():
  plan = _core.make_plan(problem(
      [((8, 1, 3), 2, tiled([8, 1, 1])), ((4, 3), 1, replicated())], [((8, 4), 2)]))
  assert plan.batch_shape == [8, 4]
  assert plan.operand_local_shapes == [[1, 1, 3], [4, 3]]
  assert plan.result_local_shapes == [[1, 4]]


def test_operands_disagree_most_parallel_wins():
  plan = _core.make_plan(problem(
      [((16, 4), 1, tiled([2, 1], replicated=4)), ((16, 4), 1, tiled([8, 1]))],
      [((16, 4), 1)]))
  assert plan.batch_tiles == [8]
  assert plan.operand_local_shapes == [[2, 4], [2, 4]]


def test_result_hint_used_when_operands_replicated():
  plan = _core.make_plan(problem([((16, 4), 1, replicated())], [((16, 4), 1)],
                                 result_shardings=[tiled([8, 1])]))
  assert plan.batch_tiles == [8]


def test_nothing_tiled_is_all_replicated():
  plan = _core.make_plan(problem([((16, 4), 1, replicated())], [((16, 4), 1)]))
  assert plan.operand_shardings[0].kind == Kind.REPLICATED
  assert plan.operand_local_shapes == [[16, 4]]


def test_uneven_batch():
  plan = _core.make_plan(problem([((10, 4), 1, tiled([8, 1]))], [((10, 4), 1)]))
  assert plan.operand_local_shapes == [[2, 4]]


def test_manual_passes_through():
  m = _core.Sharding()
  m.kind = Kind.MANUAL
  plan = _core.make_plan(problem([((2, 4), 1, m)], [((2, 4), 1)]))
  assert plan.passthrough and plan.operand_local_shapes == [[2, 4]]


def test_manual_subgroup_is_kept():
  # partially manual: 2 manual groups of a 2x4 mesh, batch tiled 4 ways.
  plan = _core.make_plan(problem([((8, 4), 1, tiled([4, 1], manual=2))], [((8, 4), 1)]))
  s = plan.result_shardings[0]
  assert list(s.tile_dims) == [4, 1] and list(s.subgroup_kinds) == [Subgroup.MANUAL]


@pytest.mark.parametrize("mutate,message", [
    (lambda p: setattr(p, "operand_batch_ranks", [3]), "batch rank 3"),
    (lambda p: setattr(p, "operand_shardings", [tiled([8])]), "1 tile dims"),
    (lambda p: setattr(p, "operand_shardings", [tiled([8, 1], devices=[0] * 8)]), "distinct"),
    (lambda p: setattr(p, "operand_shardings", [tiled([8, 1], devices=[0, 1])]), "2 entries"),
    (lambda p: setattr(p, "operand_shardings", [tiled([0, 1])]), "positive"),
    (lambda p: setattr(p, "operand_batch_ranks", []), "one batch rank per operand"),
    (lambda p: setattr(p, "result_shapes", [[5, 4]]), "does not start with the batch shape"),
    (lambda p: setattr(p, "operand_shapes", [[-1, 4]]), "negative dimension"),
])
def test_invalid_input_raises_value_error(mutate, message):
  p = problem([((8, 4), 1, tiled([8, 1]))], [((8, 4), 1)])
  mutate(p)
  with pytest.raises(ValueError, match=message):
    _core.make_plan(p)


def test_mismatched_device_counts():
  p = problem([((8, 4), 1, tiled([8, 1])), ((8, 4), 1, tiled([4, 1]))], [((8, 4), 1)])
  with pytest.raises(ValueError, match="different numbers of devices"):
    _core.make_plan(p)


# ---- properties -------------------------------------------------------------

MESH_SHAPES = [(8,), (2, 4), (4, 2), (2, 2, 2)]


@st.composite
def mesh_sharding(draw, rank):
  """A sharding as jax builds one from a mesh and a PartitionSpec: each mesh
  axis tiles one array dim or is replicated."""
  mesh_shape = draw(st.sampled_from(MESH_SHAPES))
  perm = draw(st.permutations(range(NUM_DEVICES)))
  mesh = np.asarray(perm).reshape(mesh_shape)
  if rank == 0 or draw(st.booleans()) is False and draw(st.integers(0, 3)) == 0:
    return replicated()
  assignment = [draw(st.integers(-1, rank - 1)) for _ in mesh_shape]
  order = []
  for d in range(rank):
    order += [a for a, t in enumerate(assignment) if t == d]
  rep = [a for a, t in enumerate(assignment) if t == -1]
  devices = mesh.transpose(order + rep)
  tile_dims = [math.prod(mesh_shape[a] for a, t in enumerate(assignment) if t == d)
               for d in range(rank)]
  rep_size = math.prod(mesh_shape[a] for a in rep)
  if all(t == 1 for t in tile_dims):
    return replicated()
  return tiled(tile_dims, devices.reshape(-1).tolist(), replicated=rep_size)


@st.composite
def problems(draw):
  batch_rank = draw(st.integers(0, 3))
  batch = [draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16])) for _ in range(batch_rank)]
  operands = []
  for _ in range(draw(st.integers(1, 3))):
    b = draw(st.integers(0, batch_rank))
    own = [1 if draw(st.integers(0, 4)) == 0 else n for n in batch[batch_rank - b:]]
    core = [draw(st.sampled_from([1, 2, 4, 6, 8])) for _ in range(draw(st.integers(0, 2)))]
    shape = own + core
    operands.append((shape, b, draw(mesh_sharding(len(shape)))))
  broadcast = np.broadcast_shapes(*[tuple(s[:b]) for s, b, _ in operands])
  broadcast = [1] * (batch_rank - len(broadcast)) + list(broadcast)
  broadcast = broadcast[-max([b for _, b, _ in operands]):] if any(
      b for _, b, _ in operands) else []
  results = [(broadcast + [draw(st.sampled_from([1, 3, 8]))] * draw(st.integers(0, 2)),
              len(broadcast)) for _ in range(draw(st.integers(1, 2)))]
  return problem(operands, results, rebatch=draw(st.booleans()))


def tile_coords(sharding, device, rank):
  if sharding.kind != Kind.TILED:
    return [0] * rank
  dims = list(sharding.tile_dims) + list(sharding.subgroup_dims)
  pos = list(sharding.devices).index(device)
  return list(np.unravel_index(pos, dims))[:rank]


def original_batch_tiles(p, k, batch_shape):
  s = p.operand_shardings[k]
  if s.kind != Kind.TILED:
    return 1
  shape, b = p.operand_shapes[k], p.operand_batch_ranks[k]
  return math.prod(s.tile_dims[m] for m in range(b)
                   if not (shape[m] == 1 and batch_shape[len(batch_shape) - b + m] != 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_device_computes_exactly_what_it_outputs(p):
  plan = _core.make_plan(p)
  batch = list(plan.batch_shape)
  R = len(batch)
  tiled_shardings = [s for s in list(plan.operand_shardings) + list(plan.result_shardings)
                     if s.kind == Kind.TILED]
  for s in tiled_shardings:
    assert sorted(s.devices) == list(range(NUM_DEVICES))
  # Core dims and broadcast batch dims are never tiled.
  for k, s in enumerate(plan.operand_shardings):
    if s.kind == Kind.TILED:
      shape, b = p.operand_shapes[k], p.operand_batch_ranks[k]
      assert all(t == 1 for t in list(s.tile_dims)[b:])
      for m in range(b):
        if shape[m] == 1 and batch[R - b + m] != 1:
          assert s.tile_dims[m] == 1
  # Parallelism is never lost: at least the best operand's batch tiling.
  best = max(original_batch_tiles(p, k, batch) for k in range(len(p.operand_shapes)))
  assert math.prod(plan.batch_tiles) >= best
  if not any(s.kind == Kind.TILED for s in tiled_shardings):
    return
  # Each device's operands hold exactly the batch slice of its results.
  computed = {}
  for device in range(NUM_DEVICES):
    res_coords = tile_coords(plan.result_shardings[0], device, R)
    for r, s in enumerate(plan.result_shardings):
      assert tile_coords(s, device, R) == res_coords
      assert tiles_of(s, len(p.result_shapes[r]))[:R] == list(plan.batch_tiles)
    for k, s in enumerate(plan.operand_shardings):
      shape, b = p.operand_shapes[k], p.operand_batch_ranks[k]
      coords, tiles = tile_coords(s, device, len(shape)), tiles_of(s, len(shape))
      for m in range(b):
        i = R - b + m
        if not (shape[m] == 1 and batch[i] != 1):
          assert coords[m] == res_coords[i]
          assert tiles[m] == plan.batch_tiles[i]
    computed.setdefault(tuple(res_coords), []).append(device)
  assert len(computed) == math.prod(plan.batch_tiles)
  assert all(len(v) == plan.replication for v in computed.values())
  for shape, local, s in itertools.chain(
      zip(p.operand_shapes, plan.operand_local_shapes, plan.operand_shardings),
      zip(p.result_shapes, plan.result_local_shapes, plan.result_shardings)):
    assert list(local) == [-(-n // t) for n, t in zip(shape, tiles_of(s, len(shape)))]


def tiles_of(sharding, rank):
  return list(sharding.tile_dims) if sharding.kind == Kind.TILED else [1] * rank


@st.composite
def garbage_shardings(draw):
  s = _core.Sharding()
  s.kind = draw(st.sampled_from([Kind.REPLICATED, Kind.TILED, Kind.MANUAL, Kind.MAXIMAL]))
  s.tile_dims = draw(st.lists(st.integers(-2, 9), max_size=4))
  n = draw(st.integers(0, 2))
  s.subgroup_dims = draw(st.lists(st.integers(-1, 4), min_size=n, max_size=n))
  s.subgroup_kinds = draw(st.lists(st.sampled_from([Subgroup.REPLICATED, Subgroup.MANUAL]),
                                   max_size=2))
  s.devices = draw(st.lists(st.integers(-1, 9), max_size=12))
  return s


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_invalid_problems_never_crash(data):
  """Arbitrary (mostly invalid) input either plans or raises ValueError."""
  shapes = data.draw(st.lists(st.lists(st.integers(-1, 9), max_size=4), min_size=0, max_size=3))
  p = _core.Problem()
  p.operand_shapes = shapes
  p.operand_batch_ranks = data.draw(st.lists(st.integers(-1, 4), min_size=len(shapes),
                                             max_size=len(shapes) + data.draw(st.integers(0, 1))))
  p.operand_shardings = data.draw(st.lists(garbage_shardings(), min_size=len(shapes),
                                           max_size=len(shapes)))
  p.result_shapes = data.draw(st.lists(st.lists(st.integers(-1, 9), max_size=4), max_size=2))
  p.result_batch_ranks = data.draw(st.lists(st.integers(-1, 3), min_size=len(p.result_shapes),
                                            max_size=len(p.result_shapes)))
  try:
    _core.make_plan(p)
  except ValueError:
    pass
