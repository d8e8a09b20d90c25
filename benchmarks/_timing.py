"""Side-by-side timing: candidates run interleaved (A B C A B C ...) in one
process, so drift in machine load hits all of them alike."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import jax

# OpenBLAS's worker threads spin for about 0.1 s after a threaded call
# (its THREAD_TIMEOUT, 2^28 cycles) before they sleep. jaxlib's LAPACK kernels
# call OpenBLAS threaded, so on a 2-core machine the candidate that runs next
# shares a core with a spinning thread it never started. A pause longer than
# that between candidates measures each one on the machine it would get alone.
SETTLE_SECONDS = 0.25


def simulated_devices(count: int = 8):
  """jax with ``count`` simulated CPU devices and synchronous dispatch (XLA's
  CPU runtime has hung on simulated devices with async dispatch on; see
  docs/reliability.md). Call it before any computation."""
  jax.config.update("jax_num_cpu_devices", count)
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  return jax


def steady_allocator() -> bool:
  """Fixes glibc malloc's mmap and trim thresholds for this process; False
  where the C library is not glibc (nothing done).

  XLA allocates each call's buffers with malloc. Under glibc's dynamic
  thresholds, whether a freed multi-MiB buffer stays in the heap or goes back
  to the OS (to be faulted in again, a page at a time, by the next call that
  writes it) depends on the process's allocation history: the same
  2048 x 16 x 16 float64 Cholesky took 0.2 ms a call in one process and
  0.5-0.9 ms in another, with 100-600 page faults a call, and jax's kernels and
  the memory pass drew the same lottery. Fixed thresholds keep buffers up to
  32 MiB in the heap, so every candidate is timed on reused memory."""
  import ctypes
  import ctypes.util
  try:
    mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
  except (OSError, AttributeError):
    return False
  m_trim_threshold, m_mmap_threshold = -1, -3   # glibc's malloc.h
  return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


def interleaved(candidates: dict, args, *, repeats: int = 7, min_time: float = 0.1,
                settle: float = SETTLE_SECONDS, warmup: float = 0.0):
  """Median seconds per call of each (already jitted) candidate.

  Each round calls every candidate enough times to run for ``min_time``
  (calibrated on the first call), pausing ``settle`` seconds before each
  candidate, then the rounds are repeated. With ``warmup``, each candidate
  first runs untimed for that many seconds after its pause: on this machine
  a kernel that splits its batch over XLA's thread pool ran its first 10-20
  ms after an idle pause as if on one core (a 4096 x 8 x 8 LU: 320 us a call
  in 50 ms rounds, 219 us without the pause, 227 us in 0.5 s rounds), which
  would charge the pause to the candidates that use both cores.
  """
  loops = {}
  for name, f in candidates.items():
    jax.block_until_ready(f(*args))  # compile and warm up
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    loops[name] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))
  samples = {name: [] for name in candidates}
  names = list(candidates)
  for r in range(repeats):
    # Each round starts with another candidate: the first of a round runs on
    # a colder machine (caches, frequency), which must not favour one of them.
    for name in names[r % len(names):] + names[:r % len(names)]:
      f = candidates[name]
      time.sleep(settle)
      warm_until = time.perf_counter() + warmup
      while time.perf_counter() < warm_until:
        jax.block_until_ready(f(*args))
      t0 = time.perf_counter()
      for _ in range(loops[name]):
        out = f(*args)
      jax.block_until_ready(out)
      samples[name].append((time.perf_counter() - t0) / loops[name])
  return {name: statistics.median(s) for name, s in samples.items()}


def fastest(f, args, *, repeats: int, min_time: float, min_loops: int = 1) -> float:
  """The fastest of ``repeats`` rounds, seconds per call of ``f`` (each round
  calls it enough times, at least ``min_loops``, to run for ``min_time``,
  calibrated on one call). For comparing builds or paths run apart: on a
  shared machine the minimum is the least disturbed round."""
  jax.block_until_ready(f(*args))  # compile and warm up
  t0 = time.perf_counter()
  jax.block_until_ready(f(*args))
  loops = max(min_loops, int(min_time / max(time.perf_counter() - t0, 1e-6)))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(loops):
      out = f(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t0) / loops)
  return best


def under_both_partitioners(candidates, args, check, *, repeats: int,
                            partitioners=("shardy", "gspmd")) -> list[tuple]:
  """``(partitioner, name, seconds, bytes received per device)`` of each
  candidate under Shardy, then GSPMD (or ``partitioners``), timed
  interleaved. ``candidates()``, called once the partitioner is set, gives
  name -> (function to time, the jitted function whose compiled program's
  collectives are counted); ``check(out)`` asserts each candidate's result
  first."""
  from batchpart import _hlo
  rows = []
  for partitioner in partitioners:
    jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    made = candidates()
    timed = {name: f for name, (f, _) in made.items()}
    for f in timed.values():
      check(f(*args))
    times = interleaved(timed, args, repeats=repeats)
    for name, (_, jitted) in made.items():
      text = jitted.lower(*args).compile().as_text()
      received = sum(sum(t.nbytes for t in c.result_types) for c in _hlo.collectives(text))
      rows.append((partitioner, name, times[name], received))
  return rows


def print_comparison(rows, baseline: str, what: str) -> None:
  """``under_both_partitioners``' rows as a markdown table, each time also
  as a ratio to ``baseline``'s under the same partitioner."""
  base = {p: t for p, name, t, _ in rows if name == baseline}
  print(f"| partitioner | {what} | time | vs {baseline} | bytes received per device |")
  print("| --- | --- | ---: | ---: | ---: |")
  for partitioner, name, t, nbytes in rows:
    print(f"| {partitioner} | {name} | {fmt_time(t).strip()} | "
          f"{t / base[partitioner]:.2f}x | {nbytes:,} |")


def fmt_time(seconds: float) -> str:
  if seconds < 1e-3:
    return f"{seconds * 1e6:7.1f}us"
  if seconds < 1:
    return f"{seconds * 1e3:7.2f}ms"
  return f"{seconds:7.2f}s "


def write_doc(path: str, lines: list[str]) -> str:
  """Writes ``lines`` as the markdown file ``path``; returns its text."""
  text = "\n".join(lines)
  with open(path, "w") as f:
    f.write(text)
  return text


def run_child(script: str, args: list[str], *, timeout: float, tries: int = 3):
  """Runs ``python script *args`` and returns the JSON its last stdout line
  holds. A child past ``timeout`` is killed and run again: jaxlib's LAPACK
  kernels can deadlock XLA's CPU pool on simulated devices
  (docs/reliability.md)."""
  for attempt in range(tries):
    try:
      # The child's stderr (its progress) goes straight to ours.
      proc = subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE, text=True,
                            timeout=timeout)
    except subprocess.TimeoutExpired:
      print(f"{script} {' '.join(args)}: timed out (attempt {attempt + 1}), retrying",
            flush=True)
      continue
    if proc.returncode != 0:
      raise RuntimeError(f"{script} {' '.join(args)} failed:\n{proc.stdout[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
  raise RuntimeError(f"{script} {' '.join(args)}: timed out {tries} times")


def parts_in_children(script: str, parts: dict, *, timeout: float):
  """The command line of a benchmark whose parts each run in a child process.

  ``script --child NAME [--quick]`` runs ``parts[NAME](quick)`` here and
  prints its rows as JSON (returns None). Without ``--child``, every part
  runs in a child (``run_child``), in order; returns (rows, quick).
  """
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--child", choices=list(parts))
  args = parser.parse_args()
  if args.child:
    print(json.dumps(parts[args.child](args.quick)))
    return None
  quick = ["--quick"] if args.quick else []
  rows = [row for name in parts
          for row in run_child(script, ["--child", name, *quick], timeout=timeout)]
  return rows, args.quick
