"""The demo's guards (``batchpart._demo``): a baseline that can hang runs in a
child process with a time limit, and XLA's C++ log lines are held back; and
its named-combiner and halo sections print equal results; its reduction table
has a header and one byte format, and its shard_map baseline no relayout copies."""

import os
import re
import subprocess
import sys

import pytest

from batchpart import _demo


@pytest.mark.timeout(60)
def test_a_child_that_hangs_costs_a_row_not_the_demo():
  reason = _demo._child_json("import time; time.sleep(60)", timeout=2)
  assert isinstance(reason, str) and reason.startswith("no result: stopped after 2 s")


@pytest.mark.timeout(60)
def test_a_child_that_fails_is_reported_and_one_that_prints_is_read():
  reason = _demo._child_json("raise SystemExit('boom')", timeout=30)
  assert reason == "no result: the child process failed (boom)"
  assert _demo._child_json("print('noise'); print('[1, 2.5]')", timeout=30) == [1, 2.5]


def test_xla_log_lines_are_held_back_and_the_rest_passed_on(capfd):
  with _demo._without_xla_logs():
    os.write(2, b"W1128 08:01:02.039460   15282 spmd_partitioner.cc:656] [SPMD] remat\n")
    os.write(2, b"a warning of our own\n")
    print("python stderr", file=sys.stderr)
  err = capfd.readouterr().err
  assert "spmd_partitioner" not in err
  assert "a warning of our own" in err and "python stderr" in err


_SECTIONS = """
from batchpart import _demo
from batchpart._demo import kinds
_demo._configure(8)
import jax
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
with _demo._without_xla_logs():
  kinds.combiner(mesh, 8, 2)
  print(flush=True)
  kinds.halo(mesh, 8, 2)
  print(flush=True)
  kinds.scan(mesh, 8, 2)
"""


def _child(code: str) -> subprocess.CompletedProcess:
  """``code`` run in a child process, which succeeded: the demo's sections
  need 8 simulated devices, which jax takes only before its first use in a
  process."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=240, env=env)
  assert done.returncode == 0, done.stderr[-2000:]
  return done


@pytest.mark.timeout(300)
def test_the_combiner_and_halo_sections_print_and_equal_the_unsharded_call():
  done = _child(_SECTIONS)
  out = done.stdout
  assert "named combiner: attention" in out and "reduce={'n': 'logsumexp'}" in out
  assert "(o, lse) allclose to the unsharded call, all three: True" in out
  assert "halo: a stencil (y" in out and "halo={'n': bp.Halo(2, 1, ends='zero')}" in out
  assert "equal to the unsharded call bit for bit, all three: True" in out
  assert "scan: a linear recurrence" in out
  assert "(y, h_T) allclose to the unsharded call, all three: True" in out
  out, scanned = out.split("scan: a linear recurrence")
  rows = {line.split()[0]: line for line in scanned.splitlines() if line.startswith("  bp.")}
  # Each device holds its part of the steps; one all-gather of the summaries.
  assert " 8x8192 " in rows["bp.ffi_call"] and "all-gather" in rows["bp.ffi_call"]
  combiner, halo = out.split("halo: a stencil (")
  for name in ("bp.ffi_call", "jax.ffi.ffi_call", "shard_map by hand"):
    assert f"  {name} " in combiner and f"  {name} " in halo
  # Each device sees its own keys (4096 / 8), and the halo's windows come from
  # collective-permutes, where jax's call gathers.
  rows = {line.split()[0]: line for line in combiner.splitlines() if line.startswith("  bp.")}
  assert " 512x16 " in rows["bp.ffi_call"] and "all-gather" not in rows["bp.ffi_call"]
  rows = {line.split()[0]: line for line in halo.splitlines() if line.startswith("  bp.")}
  assert "collective-permute" in rows["bp.ffi_call"] and "all-gather" not in rows["bp.ffi_call"]
  assert "no result" not in out and not any(
      _demo._XLA_LOG_LINE.match(line) for line in done.stderr.splitlines())


_REDUCTION_AND_CHOLESKY = """
from batchpart import _demo
_demo._configure(8)
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
a, _ = _demo._spd_batch(64, 8)
a = jax.device_put(a, NamedSharding(mesh, P("x")))
for name, f in _demo._candidates(mesh).items():
  text = jax.jit(f, out_shardings=NamedSharding(mesh, P("x"))).lower(a).compile().as_text()
  print("copies", name, sum(" copy(" in l or "wrapped_copy" in l for l in text.splitlines()))
with _demo._without_xla_logs():
  _demo._reductions(mesh, 8, 2)
"""


@pytest.mark.timeout(300)
def test_the_reduction_table_has_a_header_and_one_byte_format():
  out = _child(_REDUCTION_AND_CHOLESKY).stdout
  lines = out.splitlines()
  # The shard_map baseline runs the kernel as batchpart does, with no relayout copies.
  assert "copies shard_map wrapper 0" in lines and "copies batchpart.linalg 0" in lines
  table = lines[[i for i, line in enumerate(lines) if line.startswith("reduction:")][0] + 1:]
  assert table[0].split()[:2] == ["call", "per-device"] and "collectives" in table[0]
  rows = {line.split()[0]: line for line in table[1:4]}
  assert set(rows) == {"bp.ffi_call", "jax.ffi.ffi_call", "shard_map"}
  assert "all-reduce 256 B" in rows["bp.ffi_call"]
  assert "all-gather 16.2 MiB" in rows["jax.ffi.ffi_call"]
  # One format for every size: a space before the unit, no bare KiB counts.
  assert not re.search(r"\d(B|KiB|MiB)\b", out)
