"""Hunts the XLA CPU runtime hang on 8 simulated devices (docs/reliability.md).

Each *loop* is a fresh subprocess that compiles one program mixing
collectives and LAPACK custom calls and runs it ``--runs`` times, printing
one progress line per run. The parent watches the progress; when a loop makes
no progress for ``--stall`` seconds it is declared hung and, before it is
killed, the evidence is collected:

- the CPU time the process burns over 3 s (a true hang burns none),
- every Python thread's stack (faulthandler, on SIGUSR1),
- ``py-spy dump --native`` (when py-spy is installed),
- ``gdb -batch -ex "thread apply all bt"``, summarised as "how many threads
  wait where".

Configurations (``--configs``, comma separated; default: a,b,c):

  a   jnp.linalg.cholesky on a core-sharded input (jaxlib's LAPACK potrf
      behind an all-gather): the hang docs/reliability.md describes.
  b   bp.linalg.cholesky on a core-sharded input (all-to-all + batchpart's
      potrf) plus a batch-sharded bp.linalg.cholesky and test softmax in the
      same program: batchpart's own programs.
  c   b with async dispatch off (jax_cpu_enable_async_dispatch=False).
  d   a with async dispatch off.
  e   b with batchpart's intra-op pool off (every LAPACK batch loop serial).
  f   b with OPENBLAS_NUM_THREADS=1 (no OpenBLAS threads inside kernels).
  g   a with OPENBLAS_NUM_THREADS=1.
  h   jnp.linalg.cholesky on a batch-sharded input: no collective at all.
  i   h with async dispatch off.
  j   jax.grad of bp.linalg.cholesky on a core-sharded input: batchpart's
      JVP rules solve with jax.lax.linalg.triangular_solve, i.e. jaxlib's
      LAPACK trsm kernel.
  k   j with async dispatch off.

Usage::

  python scripts/hang_loop.py                       # a,b,c, 3 loops each, 300 runs
  python scripts/hang_loop.py --configs a,b,c,d,e,f,g --reps 5 --out /tmp/hang
  python scripts/hang_loop.py --child b --runs 300  # one loop, in this process

Async dispatch is on (jax's default) unless a configuration turns it off.
The exit status is 0 when every loop finished, 1 when any hung or crashed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

CONFIGS = {
    # name: (program, async dispatch, batchpart intra-op pool, extra env)
    "a": ("jnp", True, True, {}),
    "b": ("bp", True, True, {}),
    "c": ("bp", False, True, {}),
    "d": ("jnp", False, True, {}),
    "e": ("bp", True, False, {}),
    "f": ("bp", True, True, {"OPENBLAS_NUM_THREADS": "1"}),
    "g": ("jnp", True, True, {"OPENBLAS_NUM_THREADS": "1"}),
    "h": ("jnp-batch", True, True, {}),
    "i": ("jnp-batch", False, True, {}),
    "j": ("bp-grad", True, True, {}),
    "k": ("bp-grad", False, True, {}),
}


# ---------------------------------------------------------------------------
# The child: one loop
# ---------------------------------------------------------------------------

def child(config: str, runs: int, batch: int, n: int, block_every: int) -> int:
  import faulthandler
  program, async_dispatch, pool, _ = CONFIGS[config]
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  jax.config.update("jax_cpu_enable_async_dispatch", async_dispatch)
  import batchpart as bp
  import batchpart.testing as kernels
  from batchpart import _core
  from batchpart.linalg import _kernels
  kernels.register()
  _kernels.ensure_registered()
  _core.lapack.set_intra_op_parallelism(pool)

  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
  rng = np.random.default_rng(0)
  m = rng.standard_normal((batch, n, n), dtype=np.float32)
  spd = m @ np.swapaxes(m, -1, -2) + n * np.eye(n, dtype=np.float32)
  a_core = jax.device_put(spd, NamedSharding(mesh, P(None, None, "x")))
  a_batch = jax.device_put(spd, NamedSharding(mesh, P("x")))
  x_batch = jax.device_put(rng.standard_normal((batch, 16), dtype=np.float32),
                           NamedSharding(mesh, P("x")))
  if program == "jnp":
    f = jax.jit(jnp.linalg.cholesky)
    args = (a_core,)
  elif program == "jnp-batch":
    f = jax.jit(jnp.linalg.cholesky)
    args = (a_batch,)
  elif program == "bp-grad":
    f = jax.jit(jax.grad(lambda a: bp.linalg.cholesky(a).sum()))
    args = (a_core,)
  else:
    def f(a_core, a_batch, x_batch):
      return (bp.linalg.cholesky(a_core), bp.linalg.cholesky(a_batch),
              kernels.softmax(x_batch)[0])
    f = jax.jit(f)
    args = (a_core, a_batch, x_batch)
  if program == "bp-grad":  # unsharded, on one device
    expected = np.asarray(jax.grad(lambda a: jnp.linalg.cholesky(a).sum())(spd))
  else:
    expected = np.linalg.cholesky(spd)
  out = jax.block_until_ready(f(*args))
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(out)[0]), expected,
                             rtol=1e-3, atol=1e-3)
  print(f"compiled {program} pid={os.getpid()} pool_threads=? async={async_dispatch}",
        flush=True)
  t0 = time.perf_counter()
  pending = []
  for i in range(runs):
    pending.append(f(*args))
    if (i + 1) % block_every == 0:
      jax.block_until_ready(pending)
      pending.clear()
    print(f"run {i + 1} {time.perf_counter() - t0:.3f}", flush=True)
  jax.block_until_ready(pending)
  np.testing.assert_allclose(np.asarray(jax.tree.leaves(f(*args))[0]), expected,
                             rtol=1e-3, atol=1e-3)
  print(f"done {runs} {time.perf_counter() - t0:.3f}", flush=True)
  return 0


# ---------------------------------------------------------------------------
# The parent: run loops, detect hangs, collect evidence
# ---------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_states(pid: int) -> collections.Counter:
  states = collections.Counter()
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/stat") as f:
        states[f.read().rsplit(")", 1)[1].split()[0]] += 1
    except OSError:
      pass
  return states


_SKIP_FRAMES = re.compile(
    r"syscall|futex|__GI_|pthread_cond|std::condition_variable|__lll_lock|"
    r"___pthread_mutex|nsync|absl::.*Mutex|absl::.*CondVar|__futex|"
    r"^\?\?|clock_nanosleep|epoll_wait|poll|select|sem_wait|do_futex|"
    r"absl::lts_\d+::synchronization_internal|Waiter")


def summarise_gdb(text: str, depth: int = 4) -> list[tuple[int, str]]:
  """Groups gdb's threads by their first `depth` interesting frames."""
  threads = re.split(r"\nThread \d+ ", "\n" + text)
  groups = collections.Counter()
  for thread in threads[1:]:
    frames = re.findall(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(.+?)(?: \(|$)", thread, re.M)
    wait = next((f for f in frames if re.search(
        r"futex|cond.*wait|CondVar|Wait|sem_wait|epoll|poll|nanosleep", f)), "running?")
    interesting = [f for f in frames if not _SKIP_FRAMES.search(f)][:depth]
    key = f"waits in {_short(wait)} <- " + " <- ".join(_short(f) for f in interesting)
    groups[key] += 1
  return groups.most_common()


def _short(frame: str, width: int = 90) -> str:
  frame = re.sub(r"<[^<>]*(<[^<>]*>[^<>]*)*>", "<>", frame)
  frame = re.sub(r"\(.*", "", frame)
  return frame[:width]


def collect_evidence(pid: int, stem: str, gdb: bool = True) -> dict:
  evidence = {}
  try:
    c0 = _cpu_seconds(pid)
    time.sleep(3)
    evidence["cpu_seconds_in_3s"] = round(_cpu_seconds(pid) - c0, 3)
    evidence["thread_states"] = dict(_threads_states(pid))
  except OSError as e:
    evidence["cpu_error"] = str(e)
  try:
    os.kill(pid, signal.SIGUSR1)  # faulthandler: Python stacks to the child's stderr
    time.sleep(1)
  except OSError:
    pass
  py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
  if os.path.exists(py_spy):
    r = subprocess.run([py_spy, "dump", "--native", "--pid", str(pid)],
                       capture_output=True, text=True, timeout=120)
    with open(stem + ".pyspy.txt", "w") as f:
      f.write(r.stdout + r.stderr)
    evidence["py_spy"] = stem + ".pyspy.txt"
  if gdb and shutil.which("gdb"):
    r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "set pagination off",
                        "-ex", "thread apply all bt"],
                       capture_output=True, text=True, timeout=300)
    with open(stem + ".gdb.txt", "w") as f:
      f.write(r.stdout + r.stderr)
    evidence["gdb"] = stem + ".gdb.txt"
    evidence["gdb_summary"] = summarise_gdb(r.stdout)
  return evidence


_gdb_done: set[str] = set()


def run_loop(config: str, rep: int, args) -> dict:
  _, _, _, extra_env = CONFIGS[config]
  env = dict(os.environ, **extra_env)
  stem = os.path.join(args.out, f"{config}-{rep}")
  cmd = [sys.executable, os.path.abspath(__file__), "--child", config,
         "--runs", str(args.runs), "--batch", str(args.batch), "--n", str(args.n),
         "--block-every", str(args.block_every)]
  stderr = open(stem + ".stderr.txt", "w")
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
  state = {"last": time.monotonic(), "runs": 0, "compiled": False, "done": False,
           "times": []}

  def reader():
    for line in proc.stdout:
      state["last"] = time.monotonic()
      if line.startswith("run "):
        state["runs"] = int(line.split()[1])
        state["times"].append(float(line.split()[2]))
      elif line.startswith("compiled"):
        state["compiled"] = True
      elif line.startswith("done"):
        state["done"] = True

  t = threading.Thread(target=reader, daemon=True)
  t.start()
  start = time.monotonic()
  result = {"config": config, "rep": rep}
  while True:
    rc = proc.poll()
    if rc is not None:
      t.join(5)
      result["outcome"] = "finished" if rc == 0 and state["done"] else f"exit {rc}"
      break
    now = time.monotonic()
    stalled = now - state["last"] > (args.stall if state["compiled"] else args.compile_timeout)
    if stalled or now - start > args.loop_timeout:
      result["outcome"] = "hung" if stalled else "too slow"
      use_gdb = args.gdb == "all" or (args.gdb == "first" and config not in _gdb_done)
      result["evidence"] = collect_evidence(proc.pid, stem, gdb=use_gdb)
      if use_gdb:
        _gdb_done.add(config)
      proc.kill()
      proc.wait()
      break
    time.sleep(0.5)
  stderr.close()
  result["runs_completed"] = state["runs"]
  times = state["times"]
  if len(times) > 1:
    steps = sorted(b - a for a, b in zip(times, times[1:]))
    result["median_run_s"] = round(steps[len(steps) // 2], 4)
    result["max_run_s"] = round(steps[-1], 3)
  result["wall_s"] = round(time.monotonic() - start, 1)
  return result


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--child", choices=sorted(CONFIGS))
  p.add_argument("--configs", default="a,b,c")
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--runs", type=int, default=300)
  p.add_argument("--batch", type=int, default=512, help="matrices per program")
  p.add_argument("--n", type=int, default=32, help="matrix size (divisible by 8)")
  p.add_argument("--block-every", type=int, default=1,
                 help="block_until_ready after every k dispatches")
  p.add_argument("--stall", type=float, default=60,
                 help="seconds without a finished run that count as a hang")
  p.add_argument("--compile-timeout", type=float, default=300)
  p.add_argument("--loop-timeout", type=float, default=1800)
  p.add_argument("--out", default="hang_loop_out")
  p.add_argument("--gdb", choices=["all", "first", "none"], default="first",
                 help="gdb backtraces of every hung loop, of the first per config, or none "
                      "(gdb on a loaded machine takes minutes)")
  args = p.parse_args(argv)
  if args.child:
    return child(args.child, args.runs, args.batch, args.n, args.block_every)

  os.makedirs(args.out, exist_ok=True)
  results = []
  for config in args.configs.split(","):
    for rep in range(args.reps):
      r = run_loop(config, rep, args)
      results.append(r)
      print(json.dumps(r), flush=True)
  print("\nconfig  loops  finished  hung  other  runs before hang")
  ok = True
  for config in args.configs.split(","):
    rs = [r for r in results if r["config"] == config]
    hung = [r for r in rs if r["outcome"] == "hung"]
    fin = [r for r in rs if r["outcome"] == "finished"]
    ok &= len(fin) == len(rs)
    print(f"{config:6}  {len(rs):5}  {len(fin):8}  {len(hung):4}  "
          f"{len(rs) - len(fin) - len(hung):5}  {[r['runs_completed'] for r in hung]}")
  with open(os.path.join(args.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
