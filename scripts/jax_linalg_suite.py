"""Runs JAX's own linear-algebra tests with jax's entry points routed to
batchpart.linalg, and with jax itself, on 1 device and on 8 simulated devices.

A measuring script, not part of the test suite. It needs JAX's test files of
the installed version (tests/linalg_test.py and tests/eigh_test.py, taken from
a git clone of jax at the release's tag) and absl-py; see
docs/kernels.md ("JAX's own tests") for how to run it.

Selection: the test methods of those files that exercise cholesky, lu, qr,
eigh, svd, triangular_solve and solve (``--methods``), with jax's own
parameter sampling (JAX_NUM_GENERATED_CASES, default 10 per method); then
``--cases`` of them, drawn with ``--seed``, sorted. Every run uses JAX's test
settings: JaxTestCase's strict dtype and rank promotion
(``jax_numpy_rank_promotion='raise'``) and x64.

Routing (``--impl batchpart``): the functions of jax.numpy.linalg,
jax.lax.linalg and jax.scipy.linalg that batchpart.linalg mirrors (public
modules and jax._src's, so jax's other wrappers reach them too) are replaced
by thin adapters that translate names and return orders and call
batchpart.linalg; ``--impl jax`` runs jax unchanged. With ``--devices 8``,
both implementations shard every operand whose leading (batch) dim is a
multiple of 2 over a (2, 2, 2) mesh of the 8 devices first.

Each configuration runs in worker processes that report test by test; a test
that makes no progress for ``--timeout`` seconds (XLA's CPU pool can deadlock
in jaxlib's LAPACK kernels on simulated devices, docs/reliability.md) is
recorded as a timeout and the worker restarts after it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

DEFAULT_METHODS = (
    r"^(NumpyLinalgTest\.(testCholesky|testSVD|testJspSVDBasic|testNumpyQrModes|testQr"
    r"|testSolve)"
    r"|ScipyLinalgTest\.(testLu(?!PivotsTo|CPUBackend)|testChoSolve|testSolve"
    r"|testTriangularSolve|testScipyQrModes)"
    r"|EighTest\.(testEigh(?!LargeMatrix|SubsetByIndex)|testEigvalsh)"
    r"|LaxLinalgEighTest\.testEigh)")
TEST_FILES = ("linalg_test.py", "eigh_test.py")


# ---- worker -------------------------------------------------------------------

def _mesh_sharding(x, mesh):
  """The sharding that splits x's leading dim over as many of the mesh's
  axes as divide it (None: leave x as it is)."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec as P
  shape = getattr(x, "shape", ())
  # Empty operands stay put: jax's device_put cannot split them.
  if len(shape) < 3 or 0 in shape:
    return None
  for axes in (("a", "b", "c"), ("a", "b"), ("a",)):
    size = 1
    for axis in axes:
      size *= mesh.shape[axis]
    if shape[0] % size == 0:
      return NamedSharding(mesh, P(axes))
  del jax
  return None


def _sharder(devices: int):
  """A function that places array operands on the 8-device mesh (identity
  on 1 device)."""
  if devices == 1:
    return lambda x: x
  import jax
  import numpy as np
  from jax.sharding import AxisType
  # Auto axes: with_sharding_constraint on traced operands needs them.
  mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Auto,) * 3)

  def shard(x):
    if not isinstance(x, (np.ndarray, jax.Array)) or not hasattr(x, "ndim"):
      return x
    sharding = _mesh_sharding(x, mesh)
    if sharding is None:
      return x
    if isinstance(x, np.ndarray) or not isinstance(x, jax.core.Tracer):
      return jax.device_put(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)

  return shard


def _batchpart_routes(shard):
  """{(module, name): adapter} calling batchpart.linalg with jax's signatures."""
  import jax.numpy as jnp
  from jax.lax import linalg as lax_linalg

  import batchpart as bp

  bl = bp.linalg

  def lax_cholesky(x, *, symmetrize_input=True):
    return bl.cholesky(shard(x), symmetrize_input=symmetrize_input)

  def lax_eigh(x, *, lower=True, symmetrize_input=True, sort_eigenvalues=True,
               subset_by_index=None, implementation=None):
    n = jnp.shape(x)[-1]
    if subset_by_index is not None and tuple(subset_by_index) != (0, n):
      raise NotImplementedError("subset_by_index not supported on CPU and GPU")
    if implementation not in (None, lax_linalg.EighImplementation.QR):
      raise NotImplementedError(f"{implementation} is not supported on CPU")
    w, v = bl.eigh(shard(x), lower=lower, symmetrize_input=symmetrize_input,
                   sort_eigenvalues=sort_eigenvalues)
    return v, w

  def lax_lu(x):
    return bl.lu(shard(x))

  def lax_qr(x, *, pivoting=False, full_matrices=True, use_magma=None):
    del use_magma
    return tuple(bl.qr(shard(x), mode="complete" if full_matrices else "reduced",
                       pivoting=pivoting))

  def lax_svd(x, *, full_matrices=True, compute_uv=True, subset_by_index=None,
              algorithm=None):
    if subset_by_index is not None and tuple(subset_by_index) != (0, min(jnp.shape(x)[-2:])):
      raise NotImplementedError("subset_by_index not implemented for CPU and GPU")
    out = bl.svd(shard(x), full_matrices=full_matrices, compute_uv=compute_uv,
                 algorithm=algorithm)
    return tuple(out) if compute_uv else out

  def lax_triangular_solve(a, b, *, left_side=False, lower=False, transpose_a=False,
                           conjugate_a=False, unit_diagonal=False):
    return bl.triangular_solve(shard(a), shard(b), left_side=left_side, lower=lower,
                               transpose_a=transpose_a, conjugate_a=conjugate_a,
                               unit_diagonal=unit_diagonal)

  def jnp_cholesky(a, *, upper=False, symmetrize_input=True):
    return bl.cholesky(shard(a), lower=not upper, symmetrize_input=symmetrize_input)

  def _uplo(uplo):
    if uplo not in (None, "L", "U"):
      raise ValueError(f"UPLO must be one of None, 'L', or 'U', got {uplo}")
    return uplo != "U"

  def jnp_eigh(a, UPLO=None, symmetrize_input=True):
    return bl.eigh(shard(a), lower=_uplo(UPLO), symmetrize_input=symmetrize_input)

  def jnp_eigvalsh(a, UPLO="L", *, symmetrize_input=True):
    return bl.eigh(shard(a), lower=_uplo(UPLO), symmetrize_input=symmetrize_input)[0]

  def jnp_svd(a, full_matrices=True, compute_uv=True, hermitian=False, subset_by_index=None):
    if subset_by_index is not None:
      raise NotImplementedError("subset_by_index not implemented for CPU and GPU")
    return bl.svd(shard(a), full_matrices=full_matrices, compute_uv=compute_uv,
                  hermitian=hermitian)

  def jnp_qr(a, mode="reduced"):
    return bl.qr(shard(a), mode=mode)

  def jnp_solve(a, b):
    return bl.solve(shard(a), shard(b))

  def jsp_solve(a, b, lower=False, overwrite_a=False, overwrite_b=False, debug=False,
                check_finite=True, assume_a="gen"):
    a, b = jnp.asarray(a), jnp.asarray(b)
    if assume_a != "gen" and b.ndim == a.ndim - 1 and b.ndim > 1:  # scipy's batched vectors
      return bl.solve(shard(a), shard(b[..., None]), assume_a=assume_a, lower=lower)[..., 0]
    return bl.solve(shard(a), shard(b), assume_a=assume_a, lower=lower)

  lax_names = {"cholesky": lax_cholesky, "eigh": lax_eigh, "lu": lax_lu, "qr": lax_qr,
               "svd": lax_svd, "triangular_solve": lax_triangular_solve}
  jnp_names = {"cholesky": jnp_cholesky, "eigh": jnp_eigh, "eigvalsh": jnp_eigvalsh,
               "svd": jnp_svd, "qr": jnp_qr, "solve": jnp_solve}
  # jax.scipy.linalg's other wrappers (qr, lu, svd, solve_triangular, eigh,
  # ...) call jax._src.lax.linalg's functions, replaced above.
  jsp_names = {"solve": jsp_solve}
  return {"lax": lax_names, "jnp": jnp_names, "jsp": jsp_names}


def _jax_routes(shard):
  """jax's own functions, with sharded operands (for the 8-device runs)."""
  import functools

  import jax
  routes = {"lax": {}, "jnp": {}, "jsp": {}}
  modules = {"lax": jax.lax.linalg, "jnp": jax.numpy.linalg, "jsp": jax.scipy.linalg}
  names = {"lax": ("cholesky", "eigh", "lu", "qr", "svd", "triangular_solve"),
           "jnp": ("cholesky", "eigh", "eigvalsh", "svd", "qr", "solve"),
           "jsp": ("solve",)}
  for key, module in modules.items():
    for name in names[key]:
      original = getattr(module, name)

      def wrapper(*args, __original=original, **kwargs):
        return __original(*[shard(a) for a in args], **kwargs)

      routes[key][name] = functools.wraps(original)(wrapper)
  return routes


def _install(routes):
  import jax
  from jax._src.lax import linalg as src_lax
  from jax._src.numpy import linalg as src_jnp
  from jax._src.scipy import linalg as src_jsp
  targets = {"lax": (jax.lax.linalg, src_lax), "jnp": (jax.numpy.linalg, src_jnp),
             "jsp": (jax.scipy.linalg, src_jsp)}
  for key, functions in routes.items():
    for module in targets[key]:
      for name, function in functions.items():
        if hasattr(module, name):
          setattr(module, name, function)


def _load_tests(tests_dir):
  import unittest

  from jax._src import test_util as jtu
  sys.path.insert(0, tests_dir)
  loader = jtu.JaxTestLoader()
  tests = {}
  for filename in TEST_FILES:
    module = __import__(filename[:-3])
    suite = loader.loadTestsFromModule(module)
    stack = [suite]
    while stack:
      item = stack.pop()
      if isinstance(item, unittest.TestSuite):
        stack.extend(item)
      else:
        # Parameters that are functions print with their address: drop it, so
        # that every process names a test alike.
        name = re.sub(r" at 0x[0-9a-f]+", "", item.id().split(".", 1)[1])
        tests[f"{filename[:-3]}:{name}"] = item
  return tests


def _short(text: str) -> str:
  lines = [l for l in text.strip().splitlines() if l.strip()]
  return lines[-1][:300] if lines else ""


def worker(args) -> None:
  os.environ["JAX_ENABLE_X64"] = "1"
  if args.devices > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
  import absl.flags
  absl.flags.FLAGS(["jax_linalg_suite"])  # jax's test flags, at their defaults
  import jax
  jax.config.update("jax_enable_x64", True)
  if args.devices > 1:
    # As multidevice_tests do: synchronous dispatch makes hangs less likely.
    jax.config.update("jax_cpu_enable_async_dispatch", False)
  import unittest

  tests = _load_tests(args.tests_dir)
  if args.list:
    with open(args.results, "w") as f:
      json.dump(sorted(tests), f)
    return
  shard = _sharder(args.devices)
  if args.impl == "batchpart":
    _install(_batchpart_routes(shard))
  elif args.devices > 1:
    _install(_jax_routes(shard))
  with open(args.ids) as f:
    ids = json.load(f)
  done = set()
  if os.path.exists(args.results):
    with open(args.results) as f:
      done = {json.loads(line)["id"] for line in f if line.strip()}
  for test_id in ids:
    if test_id in done:
      continue
    with open(args.results + ".current", "w") as f:
      f.write(test_id)
    if test_id not in tests:  # a listing from another version of the test files
      with open(args.results, "a") as f:
        f.write(json.dumps({"id": test_id, "status": "missing", "seconds": 0,
                            "detail": "not among the loaded tests"}) + "\n")
      continue
    result = unittest.TestResult()
    start = time.time()
    tests[test_id].run(result)
    if result.errors or result.failures:
      status, detail = ("error", result.errors[0][1]) if result.errors else \
          ("fail", result.failures[0][1])
    elif result.skipped:
      status, detail = "skip", result.skipped[0][1]
    else:
      status, detail = "pass", ""
    with open(args.results, "a") as f:
      f.write(json.dumps({"id": test_id, "status": status, "seconds": time.time() - start,
                          "detail": _short(detail)}) + "\n")


# ---- parent -------------------------------------------------------------------

def _worker_command(args, *, impl, devices, ids_file, results, list_only=False):
  command = [sys.executable, os.path.abspath(__file__), "--worker", "--tests-dir",
             args.tests_dir, "--impl", impl, "--devices", str(devices), "--ids", ids_file,
             "--results", results]
  return command + (["--list"] if list_only else [])


def _extract_tests(args) -> str:
  if args.tests_dir:
    return args.tests_dir
  directory = tempfile.mkdtemp(prefix="jax_linalg_tests_")
  for filename in TEST_FILES:
    text = subprocess.run(["git", "--git-dir", args.jax_git, "show",
                           f"{args.rev}:tests/{filename}"],
                          check=True, capture_output=True, text=True).stdout
    with open(os.path.join(directory, filename), "w") as f:
      f.write(text)
  return directory


def _run_configuration(args, impl, devices, ids, workdir):
  results = os.path.join(workdir, f"{impl}_{devices}.jsonl")
  ids_file = os.path.join(workdir, "ids.json")
  if os.path.exists(results) and not args.resume:
    os.remove(results)
  while True:
    with open(results, "a"):
      pass
    with open(results) as f:
      done = {json.loads(line)["id"] for line in f if line.strip()}
    if all(i in done for i in ids):
      break
    process = subprocess.Popen(_worker_command(args, impl=impl, devices=devices,
                                               ids_file=ids_file, results=results),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    last_size, last_change = -1, time.time()
    while process.poll() is None:
      time.sleep(1)
      size = os.path.getsize(results)
      if size != last_size:
        last_size, last_change = size, time.time()
      elif time.time() - last_change > args.timeout:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        with open(results + ".current") as f:
          current = f.read().strip()
        with open(results, "a") as f:
          f.write(json.dumps({"id": current, "status": "timeout", "seconds": args.timeout,
                              "detail": f"no progress for {args.timeout} s"}) + "\n")
        break
    else:
      if process.returncode != 0:  # a crash (e.g. SIGFPE in XLA): record, go on
        with open(results + ".current") as f:
          current = f.read().strip()
        with open(results) as f:
          done = {json.loads(line)["id"] for line in f if line.strip()}
        if current not in done:
          with open(results, "a") as f:
            f.write(json.dumps({"id": current, "status": "crash", "seconds": 0,
                                "detail": f"worker exited with {process.returncode}"}) + "\n")
  with open(results) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {row["id"]: row for row in rows if row["id"] in set(ids)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--jax-git", help="a git directory of jax (bare or not)")
  parser.add_argument("--rev", default="jax-v0.10.2", help="the tag or commit to take tests from")
  parser.add_argument("--tests-dir", help="a folder holding linalg_test.py and eigh_test.py "
                      "(instead of --jax-git)")
  parser.add_argument("--impl", default="jax,batchpart")
  parser.add_argument("--devices", default="1,8")
  parser.add_argument("--cases", type=int, default=265)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--methods", default=DEFAULT_METHODS, help="regex over Class.method")
  parser.add_argument("--timeout", type=float, default=300)
  parser.add_argument("--workdir", default="jax_linalg_suite_results")
  parser.add_argument("--resume", action="store_true", help="keep earlier results in workdir")
  parser.add_argument("--out", help="write the summary as JSON here")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--list", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--ids", help=argparse.SUPPRESS)
  parser.add_argument("--results", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    args.devices = int(args.devices)
    worker(args)
    return
  if not (args.tests_dir or args.jax_git):
    parser.error("give --jax-git or --tests-dir")
  args.tests_dir = _extract_tests(args)
  os.makedirs(args.workdir, exist_ok=True)
  listing = os.path.join(args.workdir, "all_ids.json")
  subprocess.run(_worker_command(args, impl="jax", devices=1, ids_file="", results=listing,
                                 list_only=True), check=True)
  with open(listing) as f:
    all_ids = json.load(f)
  pattern = re.compile(args.methods)
  selected = [i for i in all_ids if pattern.search(i.split(":", 1)[1])]
  ids = sorted(random.Random(args.seed).sample(selected, min(args.cases, len(selected))))
  with open(os.path.join(args.workdir, "ids.json"), "w") as f:
    json.dump(ids, f, indent=0)
  print(f"{len(ids)} of {len(selected)} selected test cases")
  summary = {"cases": len(ids), "selected": len(selected), "seed": args.seed, "runs": {}}
  for devices in map(int, args.devices.split(",")):
    for impl in args.impl.split(","):
      rows = _run_configuration(args, impl, devices, ids, args.workdir)
      counts = {}
      for row in rows.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
      passed = counts.get("pass", 0) + counts.get("skip", 0)
      summary["runs"][f"{impl}/{devices}"] = {"passed": passed, **counts}
      print(f"{impl:9s} {devices} device(s): {passed}/{len(ids)} pass "
            f"(skips count as passes) {counts}", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  main()
