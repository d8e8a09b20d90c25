"""The demo's guards (``batchpart._demo``): a baseline that can hang runs in a
child process with a time limit, and XLA's C++ log lines are held back."""

import os
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
