"""Compile-and-inspect helpers for the multi-device tests."""

import functools
import math
import os
import re
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from batchpart import _hlo


def compiled_text(f, *args) -> str:
  return jax.jit(f).lower(*args).compile().as_text()


def collective_kinds(text: str) -> set[str]:
  return {c.opcode for c in _hlo.collectives(text)}


def the_custom_call(text: str, target: str):
  calls = _hlo.custom_calls(text, target)
  assert len(calls) == 1, f"expected one call to {target}, found {len(calls)}"
  return calls[0]


def local_shapes(call) -> list[tuple[int, ...]]:
  return [t.shape for t in call.operand_types]


def put(x, mesh, spec):
  return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))


def put_each(mesh, arrays_specs) -> list:
  """Each ``(array, spec)`` put on ``mesh``."""
  return [put(a, mesh, spec) for a, spec in arrays_specs]


def flat(text: str) -> str:
  """Text with every run of whitespace one space: a ``bp.explain`` report's phrase found
  whatever line it wraps onto."""
  return " ".join(text.split())


def collective_lines(text: str, kind: str) -> list[str]:
  """The lines of compiled HLO ``text`` that run a ``kind`` collective
  (its async start included)."""
  return [line for line in text.splitlines()
          if re.search(rf"= \S+ {kind}(-start)?\(", line) or
          re.search(rf"\) {kind}(-start)?\(", line)]


def assert_one_all_gather(text: str, shape: str) -> None:
  """Compiled HLO ``text`` has exactly one all-gather, of ``shape`` ("[8,4]"):
  the parts' summaries, never a sequence."""
  gathers = collective_lines(text, "all-gather")
  assert len(gathers) == 1 and shape in gathers[0], gathers


def rng(seed=0):
  return np.random.default_rng(seed)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_two_processes(worker: str, out: str, timeout: float = 240) -> None:
  """Runs ``worker PORT PROCESS_ID OUT`` as a two-process jax.distributed
  job on this machine (the worker sets its own device count) and asserts
  both exit cleanly, showing their output otherwise."""
  port = str(_free_port())
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen([sys.executable, worker, port, str(i), out], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert all(p.returncode == 0 for p in procs), "\n\n".join(logs)


def join_two_processes(argv):
  """In a worker run by ``run_two_processes``: joins the job named by
  ``argv`` (``worker PORT PROCESS_ID OUT``) with 4 CPU devices, gloo
  collectives and synchronous dispatch, and registers batchpart's test
  kernels. Call it before anything starts jax's backend, which reads the
  device count once. Returns the process id, OUT, and the 8 devices in
  process order (process 0's first)."""
  port, process_id, out = argv[1], int(argv[2]), argv[3]
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                             initialization_timeout=120)
  from batchpart import testing
  testing.register()
  assert jax.device_count() == 8 and jax.local_device_count() == 4
  return process_id, out, sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


def random_spec(data, mesh, rank: int, label: str, *, shuffle: bool = False) -> P:
  """A drawn PartitionSpec: each mesh axis tiles one random dim, or none;
  axes on one dim stack (in drawn order too, with ``shuffle``)."""
  entries: list[list[str]] = [[] for _ in range(rank)]
  for name in mesh.axis_names:
    dim = data.draw(st.integers(-1, rank - 1), label=f"{label}: dim for axis {name}")
    if dim >= 0:
      entries[dim].append(name)
  if shuffle and rank and data.draw(st.booleans(), label=f"{label}: shuffle stacked axes"):
    entries = [list(reversed(e)) for e in entries]
  return P(*(None if not e else e[0] if len(e) == 1 else tuple(e) for e in entries))


def divides(mesh, spec: P, shape) -> bool:
  """Whether ``spec`` tiles every dim of ``shape`` evenly on ``mesh``."""
  for size, entry in zip(shape, spec):
    axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
    if size % math.prod(mesh.shape[a] for a in axes):
      return False
  return True


def property_settings(examples: int, **overrides):
  """The hypothesis settings of the property suites: ``examples`` draws in a
  fixed sequence, no deadline (each draw compiles), no example database, the
  failing blob printed, no health checks, and no shrinking (each step
  compiles, and a failure names what it drew); ``overrides`` replace any."""
  options = dict(max_examples=examples, deadline=None, database=None, derandomize=True,
                 print_blob=True, suppress_health_check=list(HealthCheck),
                 phases=[Phase.explicit, Phase.generate])
  return settings(**{**options, **overrides})


def known_bug_report(suite: str, examples: int, hits):
  """A module fixture that prints, after the module's tests, how many
  examples ``suite`` drew and the known bugs it counted in ``hits`` as
  worked around."""
  @pytest.fixture(scope="module", autouse=True)
  def report():
    yield
    print(f"\n{suite}: {examples} examples; worked around: {dict(hits) or 'nothing'}")
  return report


@functools.cache
def auto_mesh(shape: tuple[int, ...]):
  """An Auto-mode mesh of ``shape``, its axes named a, b, c; one per shape
  (a drawn test compiles against the same mesh object each time)."""
  return jax.make_mesh(shape, ("a", "b", "c")[:len(shape)],
                       axis_types=(AxisType.Auto,) * len(shape))


#: the meshes of all 8 devices the drawn tests sample from
MESH_SHAPES = ((8,), (2, 4), (4, 2), (2, 2, 2))


def draw_mesh(data, shapes=MESH_SHAPES):
  """``auto_mesh`` of one of ``shapes`` (drawn)."""
  return auto_mesh(data.draw(st.sampled_from(shapes), label="mesh"))


def constrained_call(mesh, specs, fn, *arrays):
  """``fn`` jitted with each argument constrained to its spec inside the jit
  (uneven splits included, which device_put refuses), and ``arrays`` put
  with those specs (replicated where a spec does not divide its array)."""
  def constrained(*args):
    return fn(*(jax.lax.with_sharding_constraint(a, NamedSharding(mesh, s))
                for a, s in zip(args, specs)))
  return jax.jit(constrained), [put(a, mesh, s if divides(mesh, s, a.shape) else P())
                                for a, s in zip(arrays, specs)]


def draw_auto_mesh(data, shapes, names=("a", "b", "c")):
  """An Auto-mode mesh of one of ``shapes`` (drawn), its axes named from
  ``names``."""
  shape = data.draw(st.sampled_from(shapes), label="mesh shape")
  return jax.make_mesh(shape, names[:len(shape)], axis_types=(AxisType.Auto,) * len(shape))


_LIST = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\]"
                   r"(?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}")


def _iota(dims, perm):
  dims = [int(d) for d in dims.split(",")]
  ids = np.arange(math.prod(dims)).reshape(dims)
  return ids.transpose([int(p) for p in perm.split(",")]) if perm else ids


def replica_groups(inst) -> set[frozenset[int]]:
  """A collective's replica groups, as sets of logical device ids, from any
  of the forms XLA prints: explicit lists, an iota, or mesh axes."""
  text = inst.text
  if m := _IOTA.search(text):
    ids = _iota(m.group(3), m.group(4)).reshape(int(m.group(1)), int(m.group(2)))
    return {frozenset(int(i) for i in g) for g in ids}
  if m := _MESH.search(text):
    axes = [(name, int(size)) for name, size in re.findall(r"'(\w+)'=(\d+)", m.group(1))]
    shape = [size for _, size in axes]
    ids = (_iota(m.group(2), m.group(3)) if m.group(2) else np.arange(math.prod(shape)))
    ids = ids.reshape(shape)
    chosen = [i for i, (name, _) in enumerate(axes) if f"'{name}'" in m.group(4)]
    rest = [i for i in range(len(axes)) if i not in chosen]
    groups = ids.transpose(rest + chosen).reshape(-1, math.prod(shape[i] for i in chosen))
    return {frozenset(int(i) for i in g) for g in groups}
  if m := _LIST.search(text):
    return {frozenset(int(i) for i in g.split(",") if i.strip())
            for g in re.findall(r"\{([\d,\s]*)\}", m.group(1))}
  raise AssertionError(f"no replica groups in {text}")


# The start of a script run by run_sharing_a_cache: 8 devices, jax's
# persistent compilation cache in argv[1] keeping every program, batchpart's
# test kernels registered; argv[2] is the run's own argument.
_PERSISTENT_CACHE_PREAMBLE = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import numpy as np
    from jax.interpreters import mlir
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import batchpart as bp
    from batchpart import _compat as compat, testing
    testing.register()
""")


def run_sharing_a_cache(body: str, cache_dir, args, timeout: float = 240) -> list[str]:
  """Runs the script ``body`` (after the preamble above) once per entry of
  ``args``, each in a fresh process reading and writing the persistent
  cache in ``cache_dir``; asserts each ran to the end of ``body`` with its
  own argument and exited cleanly, and that the cache was written; returns
  their outputs."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  script = _PERSISTENT_CACHE_PREAMBLE + textwrap.dedent(body) + '\nprint("ok", sys.argv[2])\n'
  outputs = []
  for arg in args:
    proc = subprocess.run([sys.executable, "-c", script, str(cache_dir), str(arg)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["ok", str(arg)], proc.stdout[-3000:]
    outputs.append(proc.stdout)
  assert any(os.scandir(cache_dir))
  return outputs


def run_concurrently(*bodies, timeout: float = 120) -> None:
  """Runs each body on its own thread, all released at once by a barrier;
  fails if one does not finish in ``timeout`` s, re-raising what they raised."""
  import threading
  errors: list[BaseException] = []
  barrier = threading.Barrier(len(bodies))

  def run(body):
    try:
      barrier.wait(timeout=30)
      body()
    except BaseException as e:  # noqa: BLE001 - re-raised below
      errors.append(e)

  threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=timeout)
  assert not any(t.is_alive() for t in threads), "a thread did not finish"
  if errors:
    raise errors[0]


def warm_up_jax_finufft() -> None:
  """Runs each jax-finufft transform the tests use once, on one device.

  jax-finufft's CPU kernel fills a per-process cache on first use, and that
  first use is not safe on several devices at once, stock or partitioned: in
  30 fresh processes each, a first 2-D nufft1 with its points on 8 simulated
  devices crashed (SIGSEGV inside jax_finufft_cpu) 2 times stock and 5 times
  partitioned; after one call on one device, none of 30 did. The tests are
  about the partitioning, so each process takes that call first: types 1 and
  2, 1-D and 2-D, both precisions, upsampfac 2 and FINUFFT's default."""
  import jax_finufft
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    for real, complex_ in ((np.float32, np.complex64), (np.float64, np.complex128)):
      x, y = rng.uniform(-np.pi, np.pi, (2, 64)).astype(real)
      c = (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(complex_)
      for opts in (jax_finufft.options.Opts(upsampfac=2.0), None):
        for modes, points in ((16, (x,)), ((16, 16), (x, y))):
          f = jax_finufft.nufft1(modes, c, *points, opts=opts)
          jax.block_until_ready(jax_finufft.nufft2(f, *points, opts=opts))
