"""Single matrices and small batches through batchpart.linalg, for comparing two
builds: every op and dtype at sizes that the small-matrix kernels take, at
batches of 1 to a few (where a group is mostly padding), and, single-threaded,
at a batch of full groups.

Two builds cannot share a process, so each run times the installed build and
writes its numbers; runs of both builds, alternated, are then compared by
their fastest rounds (the machine is shared: the least disturbed run):

  python benchmarks/small_batches.py --json before-1.json   # build A installed
  python benchmarks/small_batches.py --json after-1.json    # build B installed
  ...                                                       # again, alternating
  python benchmarks/small_batches.py --before before-*.json --after after-*.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = ("cholesky", "solve_pos", "triangular_solve", "lu", "solve", "qr", "eigh")
DTYPES = ("float32", "float64", "complex64", "complex128")
# A batch of full groups, timed on one thread: the kernels' own throughput.
FULL = 256


def _cases(sizes, batches):
  """(op, dtype, n, batch) to time: every op, dtype and size at each small
  batch, and at FULL single-threaded (batch FULL)."""
  for op in OPS:
    for dtype in DTYPES:
      for n in sizes:
        for batch in (*batches, FULL):
          yield op, dtype, n, batch


def run(sizes, batches, rounds: int) -> dict[str, float]:
  """{"op dtype n batch": microseconds per call} for the installed build."""
  sys.path.insert(0, HERE)
  from _timing import fastest, steady_allocator
  steady_allocator()
  import jax
  jax.config.update("jax_num_cpu_devices", 1)
  jax.config.update("jax_enable_x64", True)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  import numpy as np

  from batchpart import _core
  from batchpart.testing import split_function, split_operands
  out = {}
  for op, dtype, n, batch in _cases(sizes, batches):
    f = jax.jit(split_function(op))
    args = split_operands(np.random.default_rng(0), op, batch, n, np.dtype(dtype))
    _core.lapack.set_intra_op_parallelism(batch != FULL)
    key = f"{op} {dtype} {n} {batch}"
    out[key] = fastest(f, args, repeats=rounds, min_time=0.02 if batch != FULL else 0.1,
                       min_loops=3) * 1e6
    print(f"{key}: {out[key]:.1f} us", flush=True)
  _core.lapack.set_intra_op_parallelism(True)
  return out


def compare(before: list[str], after: list[str]) -> None:
  """Prints after / before per case, each side its fastest run."""
  def fastest(paths):
    best: dict[str, float] = {}
    for path in paths:
      with open(path) as f:
        for key, value in json.load(f).items():
          best[key] = min(value, best.get(key, float("inf")))
    return best

  a, b = fastest(before), fastest(after)
  print("| op | dtype | n | batch | before us | after us | after / before |")
  print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
  for key in a:
    if key in b:
      op, dtype, n, batch = key.split()
      print(f"| {op} | {dtype} | {n} | {batch} | {a[key]:.1f} | {b[key]:.1f} | "
            f"{b[key] / a[key]:.2f} |")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="4,16,32,48", help="comma-separated n")
  parser.add_argument("--batches", default="1,3", help="comma-separated small batches")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--json", help="write the numbers here")
  parser.add_argument("--before", nargs="+", metavar="JSON", help="runs of build A")
  parser.add_argument("--after", nargs="+", metavar="JSON", help="runs of build B")
  args = parser.parse_args(argv)
  if args.before:
    compare(args.before, args.after)
    return 0
  numbers = run([int(s) for s in args.sizes.split(",")],
                [int(b) for b in args.batches.split(",")], args.rounds)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(numbers, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
