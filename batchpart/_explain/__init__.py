"""``batchpart.explain``: what XLA made of each FFI call in a program.

It lowers and compiles a function for the given (sharded) arguments and, per
FFI call, puts side by side what the program asked for (global shapes, from
the lowered StableHLO) and what every device runs (per-device shapes, from the
compiled, partitioned HLO), with the collectives XLA inserted around the call
and how many devices compute each batch element. Nothing is executed.

One module per step (see docs/explain.md):
- ``lowered``: the FFI calls of the lowered program, read with
  ``batchpart._stablehlo``.
- ``matching``: which compiled ``custom-call`` is which lowered call.
- ``collectives``: the collectives XLA put around a compiled call.
- ``replication``: how many devices compute each batch element.
- ``report``: the report dataclasses; ``render``: their text.
- ``build``: ``explain`` itself, tying the steps together.
"""

from batchpart._explain.build import explain
from batchpart._explain.report import CallReport, Collective, ExplainReport

__all__ = ["CallReport", "Collective", "ExplainReport", "explain"]
