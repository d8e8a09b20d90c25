"""One call's plan: the C++ planner on a description and XLA's shardings."""

from __future__ import annotations

from batchpart import _core
from batchpart._partition import shardings as sh
from batchpart._partition.description import CallDescription


def make_plan(d: CallDescription, operand_shapes, operand_shardings, result_shapes,
              result_shardings=None, *, split_axes: bool = True) -> _core.Plan:
  """Plans one call. Shapes are lists of dims; shardings are HloShardings
  (None: replicated operand, or no proposal for a result)."""
  problem = _core.Problem()
  problem.operand_shapes = [list(s) for s in operand_shapes]
  problem.operand_batch_ranks = list(d.operand_batch_ranks)
  problem.operand_shardings = [sh.to_planner(h, len(s))
                               for h, s in zip(operand_shardings, operand_shapes)]
  problem.result_shapes = [list(s) for s in result_shapes]
  problem.result_batch_ranks = list(d.result_batch_ranks)
  if result_shardings is not None:
    problem.result_shardings = [sh.to_planner(h, len(s))
                                for h, s in zip(result_shardings, result_shapes)]
  problem.split_axes = split_axes
  return _core.make_plan(problem)
