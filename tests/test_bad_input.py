"""Bad input, each kind in its own subprocess: a Python exception that names
the target (or the function) and what is wrong; never a segfault or abort.

Every case is a small script run with ``python -c``; the script calls
``call()``, catches the exception and prints its type and message as JSON.
The test then checks, separately:

- ``test_is_a_python_exception``: the process exited normally (not killed by
  a signal), and ``call()`` raised the expected exception type with a
  message that says what is wrong;
- ``test_message_names_the_target``: the message names the FFI target (or
  the batchpart function) the user called.

Cases where batchpart (or XLA beneath it) falls short are marked
``xfail(strict=True)`` with the reason, so they flip when fixed; see
docs/reliability.md. The subprocesses run two at a time on a thread pool
(one per case, so a crash cannot hide which case crashed).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

SOFTMAX = "batchpart_test_softmax"
MATVEC = "batchpart_test_matvec"
AXPY = "batchpart_test_axpy"
COPY = "batchpart_test_copy_bytes"

_PRELUDE = """
import json, os, sys
if {devices} > 1:
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={devices}"
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_enable_async_dispatch", False)
import batchpart as bp
import batchpart.testing as kernels
from batchpart import _core
kernels.register()
S = jax.ShapeDtypeStruct
f32, f64, i32 = np.float32, np.float64, np.int32
HANDLERS = _core.testing.handlers()
if {devices} > 1:
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  MESH = jax.make_mesh(({devices},), ("x",), axis_types=(AxisType.Auto,))
  def put(x, spec):
    return jax.device_put(x, NamedSharding(MESH, spec))
def sharding(tile_dims, devices=None, kind=_core.Sharding.Kind.TILED):
  import math
  s = _core.Sharding()
  s.kind = kind
  s.tile_dims = list(tile_dims)
  s.devices = list(range(math.prod(tile_dims))) if devices is None else list(devices)
  return s
def problem(shapes, batch_ranks, shardings, result_shapes, result_batch_ranks):
  p = _core.Problem()
  p.operand_shapes = [list(s) for s in shapes]
  p.operand_batch_ranks = list(batch_ranks)
  p.operand_shardings = list(shardings)
  p.result_shapes = [list(s) for s in result_shapes]
  p.result_batch_ranks = list(result_batch_ranks)
  return p
"""

_EPILOGUE = """
try:
  out = call()
  jax.block_until_ready(out)
except BaseException as e:
  print("OUTCOME " + json.dumps({{"type": type(e).__name__,
                                  "mro": [c.__name__ for c in type(e).__mro__],
                                  "message": str(e)}}), flush=True)
else:
  print("OUTCOME " + json.dumps({{"type": None, "mro": [], "message": repr(out)[:2000]}}),
        flush=True)
"""


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  code: str            # defines call(); the prelude's names are in scope
  raises: str          # an exception class name in the raised type's MRO
  problem: str         # regex the message must match: what is wrong
  target: str          # regex the message must match: the target or function
                       # (the planner knows no targets: the operand or result)
  devices: int = 1
  crash: str | None = None      # xfail reason for test_is_a_python_exception
  unnamed: str | None = None    # xfail reason for test_message_names_the_target


_XLA_ATTRIBUTE_DECODE = (
    "XLA's FFI attribute decoding fails at execution with '[execute] ...' and no "
    "target name; batchpart cannot check attributes at trace time (the handler's "
    "attribute types are not introspectable)")


CASES = [
    # ---- shapes and ranks ------------------------------------------------------
    Case("num_batch_dims_above_rank",
         f"def call(): return bp.ffi_call('{SOFTMAX}', (S((4, 8), f32), S((4,), f32)), "
         "num_batch_dims=3)(np.ones((4, 8), f32))",
         "ValueError", r"num_batch_dims=3 exceeds the rank of operand 0", SOFTMAX),
    Case("core_dim_disagrees",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((4, 6), f32), alpha=1.0)",
         "ValueError", r"core dim 'n' of operand 1 .*size 6", MATVEC),
    Case("batch_shapes_do_not_broadcast",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((6, 5), f32), alpha=1.0)",
         "ValueError", r"batch shape \(6,\) of operand 1 does not broadcast", MATVEC),
    Case("operand_rank_below_core_rank",
         f"def call(): return bp.ffi_call('{MATVEC}', S((3,), f32), "
         "signature='(m,n),(n)->(m)')(np.ones(3, f32), np.ones(3, f32), alpha=1.0)",
         "ValueError", r"operand 0 has shape \(3,\), rank 1, below the 2 core dims", MATVEC),
    Case("result_batch_shape_wrong",
         f"def call(): return bp.ffi_call('{SOFTMAX}', (S((4, 8), f32), S((5,), f32)), "
         "signature='(n)->(n),()')(np.ones((4, 8), f32))",
         "ValueError", r"result 1 has shape \(5,\)", SOFTMAX),
    Case("unequal_batch_dims_with_num_batch_dims",
         f"def call(): return bp.ffi_call('{AXPY}', S((4, 8), f32), num_batch_dims=1)("
         "np.ones((4, 8), f32), np.ones((2, 8), f32), alpha=1.0)",
         "ValueError", r"same leading 1 dims; operand 1 has shape \(2, 8\)", AXPY),
    Case("kernel_rank_check",  # passes batchpart's checks, fails the kernel's
         f"def call(): return bp.ffi_call('{COPY}', S((8,), f32), num_batch_dims=0)("
         "np.ones(8, f32))",
         "JaxRuntimeError", r"copy_bytes.*shape", COPY),
    # ---- dtypes ----------------------------------------------------------------
    Case("test_kernel_integer_operand",
         "def call(): return kernels.softmax(np.ones((4, 8), i32))",
         "JaxRuntimeError", r"unsupported dtype", SOFTMAX),
    Case("test_kernel_mixed_operand_dtypes",
         "def call(): return kernels.matvec(np.ones((4, 3, 5), f32), np.ones((4, 5), f64))",
         "JaxRuntimeError", r"must share one dtype", MATVEC),
    Case("test_kernel_result_dtype_differs",  # float64 rows into float32 results
         f"def call(): return bp.ffi_call('{SOFTMAX}', (S((64, 64), f32), S((64,), f32)), "
         "signature='(n)->(n),()')(np.ones((64, 64), f64))",
         "JaxRuntimeError", r"dtype", SOFTMAX),
    Case("linalg_float16",
         "def call(): return bp.linalg.cholesky(np.eye(3, dtype=np.float16)[None])",
         "NotImplementedError", r"Unsupported dtype float16", r"batchpart\.linalg\.cholesky"),
    Case("linalg_string_operand",
         "def call(): return bp.linalg.eigh('abc')",
         "TypeError", r"(not a valid JAX array type|dtype)", r"batchpart\.linalg\.eigh"),
    Case("lapack_kernel_result_dtype",
         "from batchpart.linalg import _kernels\n_kernels.ensure_registered()\n"
         "def call(): return bp.ffi_call('batchpart_potrf', (S((2, 3, 3), f64), S((2,), i32)), "
         "signature='(n,n)->(n,n),()')(np.ones((2, 3, 3), f32), lower=True, "
         "symmetrize=False)",
         "JaxRuntimeError", r"result factor has dtype float64, expected float32",
         "batchpart_potrf"),
    Case("lapack_kernel_integer_operand",
         "from batchpart.linalg import _kernels\n_kernels.ensure_registered()\n"
         "def call(): return bp.ffi_call('batchpart_getrf', (S((2, 3, 3), i32), S((2, 3), i32), "
         "S((2, 3), i32), S((2,), i32)), signature='(m,n)->(m,n),(k),(m),()')("
         "np.ones((2, 3, 3), i32))",
         "JaxRuntimeError", r"unsupported dtype int32", "batchpart_getrf"),
    # ---- linalg shapes -----------------------------------------------------------
    Case("linalg_not_square",
         "def call(): return bp.linalg.cholesky(np.ones((2, 3, 4), f32))",
         "ValueError", r"must be square.*\(2, 3, 4\)", r"batchpart\.linalg\.cholesky"),
    Case("linalg_rank_one",
         "def call(): return bp.linalg.qr(np.ones(3, f32))",
         "ValueError", r"at least 2 dims", r"batchpart\.linalg\.qr"),
    Case("linalg_solve_mismatch",
         "def call(): return bp.linalg.solve(np.eye(3, dtype=f32), np.ones(4, f32))",
         "ValueError", r"b of shape \(4,\) does not fit a of shape \(3, 3\)",
         r"batchpart\.linalg\.solve"),
    Case("linalg_bad_option",
         "def call(): return bp.linalg.qr(np.ones((3, 3), f32), mode='economic')",
         "ValueError", r"mode must be", r"batchpart\.linalg\.qr"),
    # ---- attributes --------------------------------------------------------------
    Case("attribute_of_wrong_type",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((4, 5), f32), "
         "alpha='two')",
         "JaxRuntimeError", r"attribute type.*string", MATVEC, unnamed=_XLA_ATTRIBUTE_DECODE),
    Case("attribute_of_wrong_scalar_type",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((4, 5), f32), "
         "alpha=np.int32(2))",
         "JaxRuntimeError", r"expected F64 but got S32", MATVEC, unnamed=_XLA_ATTRIBUTE_DECODE),
    Case("attribute_missing",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((4, 5), f32))",
         "JaxRuntimeError", r"expected 1 but got 0", MATVEC, unnamed=_XLA_ATTRIBUTE_DECODE),
    Case("attribute_unexpected",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((4, 5), f32), "
         "alpha=1.0, beta=2.0)",
         "JaxRuntimeError", r"expected 1 but got 2.*beta", MATVEC, unnamed=_XLA_ATTRIBUTE_DECODE),
    Case("attribute_unhashable",
         f"def call(): return bp.ffi_call('{MATVEC}', S((4, 3), f32), "
         "signature='(m,n),(n)->(m)')(np.ones((4, 3, 5), f32), np.ones((4, 5), f32), "
         "alpha=[1.0])",
         "TypeError", r"[Nn]on-hashable keyword argument .*alpha", MATVEC,
         unnamed="jax's attribute wrapping raises before batchpart adds the target"),
    Case("grad_through_ffi_call",
         "def call(): return jax.grad(lambda x: kernels.softmax(x)[1].sum())(np.ones((2, 3), f32))",
         "ValueError", r"cannot be differentiated", SOFTMAX),
    # ---- signatures and specs ----------------------------------------------------
    Case("malformed_signature",
         f"def call(): return bp.ffi_call('{SOFTMAX}', S((4, 8), f32), signature='(n)(n)->(n)')",
         "ValueError", r"is not a gufunc signature", SOFTMAX),
    Case("signature_names_too_many_operands",
         f"def call(): return bp.ffi_call('{SOFTMAX}', S((4, 8), f32), "
         "signature='(n),(n)->(n)')(np.ones((4, 8), f32))",
         "ValueError", r"names 2 operands but the call got 1", SOFTMAX),
    Case("signature_names_too_few_results",
         f"def call(): return bp.ffi_call('{SOFTMAX}', (S((4, 8), f32), S((4,), f32)), "
         "signature='(n)->(n)')(np.ones((4, 8), f32))",
         "ValueError", r"names 1 results but result_shape_dtypes has 2", SOFTMAX),
    Case("both_num_batch_dims_and_signature",
         f"def call(): return bp.ffi_call('{SOFTMAX}', S((4, 8), f32), num_batch_dims=1, "
         "signature='(n)->(n)')",
         "ValueError", r"exactly one of num_batch_dims and signature", SOFTMAX),
    Case("num_batch_dims_not_an_int",
         f"def call(): return bp.ffi_call('{SOFTMAX}', (S((4, 8), f32), S((4,), f32)), "
         "num_batch_dims=1.5)(np.ones((4, 8), f32))",
         "ValueError", r"non-negative int, got 1\.5", SOFTMAX),
    Case("token_result",
         f"def call(): return bp.ffi_call('{SOFTMAX}', jax._src.core.abstract_token, "
         "num_batch_dims=0)",
         "ValueError", r"token results are not supported", SOFTMAX),
    Case("result_not_a_shape",
         f"def call(): return bp.ffi_call('{SOFTMAX}', (4, 8), num_batch_dims=1)",
         "ValueError", r"shape.*dtype", SOFTMAX,
         unnamed="jax's result_shape_dtypes check raises before batchpart adds the target"),
    Case("operand_not_an_array",
         f"def call(): return bp.ffi_call('{SOFTMAX}', (S((4, 8), f32), S((4,), f32)), "
         "signature='(n)->(n),()')('abc')",
         "TypeError", r"operand 0 must be an array", SOFTMAX),
    # ---- layouts and aliases -----------------------------------------------------
    Case("layout_not_a_permutation",
         f"def call(): return bp.ffi_call('{COPY}', S((4, 8, 8), f32), num_batch_dims=1, "
         "input_layouts=[(0, 1, 1)])(np.ones((4, 8, 8), f32))",
         "ValueError", r"input layout 0 \(0, 1, 1\) is not a permutation", COPY),
    Case("layout_count",
         f"def call(): return bp.ffi_call('{COPY}', S((4, 8, 8), f32), num_batch_dims=1, "
         "input_layouts=[None, None])(np.ones((4, 8, 8), f32))",
         "ValueError", r"2 input layouts for 1 inputs", COPY),
    Case("alias_out_of_range",
         f"def call(): return bp.ffi_call('{COPY}', S((4, 8, 8), f32), num_batch_dims=1, "
         "input_output_aliases={0: 3})(np.ones((4, 8, 8), f32))",
         "ValueError", r"maps operand 0 to result 3, outside", COPY),
    Case("alias_shape_differs",
         f"def call(): return bp.ffi_call('{AXPY}', S((4, 8), f32), num_batch_dims=1, "
         "input_output_aliases={0: 0})(np.ones((4, 9), f32), np.ones((4, 8), f32), alpha=1.0)",
         "ValueError", r"aliased buffers need one shape and dtype", AXPY),
    Case("alias_layout_differs",
         f"def call(): return bp.ffi_call('{COPY}', S((4, 8, 8), f32), num_batch_dims=1, "
         "input_layouts=[(0, 2, 1)], input_output_aliases={0: 0})(np.ones((4, 8, 8), f32))",
         "ValueError", r"layouts differ", COPY),
    # ---- registration misuse -----------------------------------------------------
    Case("reregister_with_another_handler",
         "bp.register_ffi_target('bad_input_target', HANDLERS['softmax'])\n"
         "def call(): return bp.register_ffi_target('bad_input_target', HANDLERS['matvec'])",
         "ValueError", r"already registered on platform 'cpu' with a different handler",
         "bad_input_target"),
    Case("register_a_non_capsule",  # before the CPU backend exists (jax defers it)
         "def call(): return bp.register_ffi_target('bad_input_int_handler', 42)",
         "TypeError", r"must be a PyCapsule", "bad_input_int_handler"),
    Case("register_a_non_capsule_after_backend_start",
         "jax.devices()\n"
         "def call(): return bp.register_ffi_target('bad_input_int_handler', 42)",
         "TypeError", r"must be a PyCapsule", "bad_input_int_handler"),
    Case("register_bad_api_version",
         "jax.devices()\n"
         "def call(): return bp.register_ffi_target('bad_input_api', HANDLERS['softmax'], "
         "api_version=7)",
         "Exception", r"API version 7 is not supported", "bad_input_api"),
    Case("register_bad_name",
         "def call(): return bp.register_ffi_target(None, HANDLERS['softmax'])",
         "TypeError", r"name must be a non-empty str", r"register_ffi_target.*None"),
    Case("call_after_failed_registration",
         "jax.devices()\n"
         "try:\n  bp.register_ffi_target('bad_input_failed', 42)\nexcept Exception:\n  pass\n"
         "assert not bp.is_batch_partitionable('bad_input_failed')\n"
         "def call(): return bp.ffi_call('bad_input_failed', S((4, 8), f32), "
         "num_batch_dims=1)(np.ones((4, 8), f32))",
         "ValueError", r"no typed FFI handler registered", "bad_input_failed"),
    Case("first_computation_after_bad_registration",
         "try:\n"
         "  bp.register_ffi_target('bad_input_failed', 42)  # refused before jax queues it\n"
         "except TypeError:\n"
         "  pass\n"
         "def call(): return bp.ffi_call('bad_input_failed', S((4, 8), f32), "
         "num_batch_dims=1)(np.ones((4, 8), f32))",
         "ValueError", r"no typed FFI handler registered", "bad_input_failed"),
    Case("unregistered_target",
         "def call(): return bp.ffi_call('bad_input_nowhere', S((4, 8), f32), "
         "num_batch_dims=1)(np.ones((4, 8), f32))",
         "ValueError", r"no typed FFI handler registered", "bad_input_nowhere"),
    Case("marked_but_unregistered_target",
         "def call(): bp.mark_batch_partitionable('bad_input_marked_only')",
         "ValueError", r"not registered on any platform", "bad_input_marked_only"),
    Case("legacy_api_version",
         "def call(): return bp.ffi_call('batchpart_test_softmax', S((4, 8), f32), "
         "num_batch_dims=1, custom_call_api_version=2)(np.ones((4, 8), f32))",
         "ValueError", r"typed-FFI calls", "batchpart_test_softmax"),
    Case("unknown_vmap_method",
         "def call(): return bp.ffi_call('batchpart_test_softmax', S((4, 8), f32), "
         "num_batch_dims=1, vmap_method='loop')(np.ones((4, 8), f32))",
         "ValueError", r"vmap_method", "batchpart_test_softmax"),
    # ---- the decorator -----------------------------------------------------------
    Case("decorator_without_spec",
         "def softmax_wrapper(x): return x\n"
         "def call(): return bp.batch_partitionable(softmax_wrapper)",
         "ValueError", r"exactly one of num_batch_dims and signature", "softmax_wrapper"),
    Case("decorator_malformed_signature",
         "def softmax_wrapper(x): return x\n"
         "def call(): return bp.batch_partitionable(softmax_wrapper, signature='n->n')",
         "ValueError", r"is not a gufunc signature", "softmax_wrapper"),
    Case("decorator_arguments_do_not_fit",
         "@bp.batch_partitionable(signature='(n,n)->(n,n)')\n"
         "def square_wrapper(x): return x\n"
         "def call(): return square_wrapper(np.ones((4, 3, 5), f32))",
         "ValueError", r"core dim 'n' of operand 0", "square_wrapper"),
    Case("decorator_on_a_non_callable",
         "def call(): return bp.batch_partitionable(3, num_batch_dims=1)(np.ones((2, 3), f32))",
         "TypeError", r"expected a function", r"batch_partitionable"),
    # ---- the planner, called directly ---------------------------------------------
    Case("planner_tile_dims_do_not_match_rank",
         "def call(): return _core.make_plan(problem([(8, 4)], [1], [sharding([8])], "
         "[(8, 4)], [1]))",
         "ValueError", r"sharding has 1 tile dims for an array of shape \(8, 4\)", "operand 0"),
    Case("planner_duplicate_devices",
         "def call(): return _core.make_plan(problem([(8, 4)], [1], "
         "[sharding([8, 1], [0, 0, 1, 2, 3, 4, 5, 6])], [(8, 4)], [1]))",
         "ValueError", r"distinct non-negative ids", "operand 0"),
    Case("planner_device_list_too_short",
         "def call(): return _core.make_plan(problem([(8, 4)], [1], "
         "[sharding([8, 1], [0, 1, 2])], [(8, 4)], [1]))",
         "ValueError", r"device list has 3 entries for 8 tiles", "operand 0"),
    Case("planner_batch_rank_above_rank",
         "def call(): return _core.make_plan(problem([(8, 4)], [3], [sharding([8, 1])], "
         "[(8, 4)], [1]))",
         "ValueError", r"batch rank 3 does not fit shape \(8, 4\)", "operand 0"),
    Case("planner_missing_sharding",
         "def call(): return _core.make_plan(problem([(8, 4)], [1], [], [(8, 4)], [1]))",
         "ValueError", r"one sharding per operand", "operand"),
    Case("planner_result_not_batch_shaped",
         "def call(): return _core.make_plan(problem([(8, 4)], [1], [sharding([8, 1])], "
         "[(6, 4)], [1]))",
         "ValueError", r"does not start with the batch shape", "result 0"),
    Case("planner_broadcast_batch_rank_above_rank",
         "def call(): return _core.broadcast_batch_shape([[2]], [5])",
         "ValueError", r"batch rank 5", "operand 0"),
]

assert len({c.name for c in CASES}) == len(CASES)
_BY_NAME = {c.name: c for c in CASES}


def _script(case: Case) -> str:
  return (_PRELUDE.format(devices=case.devices) + "\n" + textwrap.dedent(case.code) +
          "\n" + _EPILOGUE.format())


def _run(case: Case) -> dict:
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  try:
    proc = subprocess.run([sys.executable, "-c", _script(case)], capture_output=True,
                          text=True, timeout=240, env=env)
  except subprocess.TimeoutExpired as e:
    return {"returncode": None, "stdout": str(e.stdout), "stderr": str(e.stderr)}
  out = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-4000:]}
  for line in proc.stdout.splitlines():
    if line.startswith("OUTCOME "):
      out["outcome"] = json.loads(line[len("OUTCOME "):])
  return out


# Two subprocesses at a time by default (each is one jax process, ~2 s).
_pool = concurrent.futures.ThreadPoolExecutor(
    max_workers=int(os.environ.get("BATCHPART_BAD_INPUT_WORKERS", "2")))
_futures: dict[str, concurrent.futures.Future] = {}


@pytest.fixture(scope="module")
def outcomes(request):
  """Starts every selected case's subprocess at once (two at a time)."""
  names = {item.callspec.params["case"] for item in request.session.items
           if item.module is request.module and hasattr(item, "callspec")}
  for name in sorted(names):
    if name not in _futures:
      _futures[name] = _pool.submit(_run, _BY_NAME[name])
  yield lambda name: _futures[name].result()
  _pool.shutdown(wait=False, cancel_futures=True)


def _describe(result: dict) -> str:
  return (f"returncode {result['returncode']}\nstdout:\n{result['stdout'][-2000:]}\n"
          f"stderr:\n{result['stderr'][-2000:]}")


def _params(reason_field: str):
  params = []
  for case in CASES:
    reason = getattr(case, reason_field)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    params.append(pytest.param(case.name, marks=marks, id=case.name))
  return params


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", _params("crash"))
def test_is_a_python_exception(outcomes, case):
  spec = _BY_NAME[case]
  result = outcomes(case)
  rc = result["returncode"]
  assert rc is not None, f"{case}: timed out\n{_describe(result)}"
  assert rc >= 0, (f"{case}: killed by signal {signal.Signals(-rc).name}\n"
                   f"{_describe(result)}")
  assert rc == 0, f"{case}: the script failed\n{_describe(result)}"
  outcome = result.get("outcome")
  assert outcome and outcome["type"], f"{case}: no exception raised\n{_describe(result)}"
  assert spec.raises in outcome["mro"], (
      f"{case}: raised {outcome['type']}, expected {spec.raises}: {outcome['message']}")
  assert re.search(spec.problem, outcome["message"], re.S), (
      f"{case}: the message does not say what is wrong ({spec.problem!r}):\n"
      f"{outcome['message']}")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", _params("unnamed"))
def test_message_names_the_target(outcomes, case):
  spec = _BY_NAME[case]
  result = outcomes(case)
  outcome = result.get("outcome") or {}
  assert outcome.get("type"), f"{case}: no exception\n{_describe(result)}"
  assert re.search(spec.target, outcome["message"]), (
      f"{case}: the message does not name {spec.target!r}:\n{outcome['message']}")


def test_enough_kinds():
  """At least 20 kinds of malformed use are covered."""
  assert len(CASES) >= 20


@pytest.mark.timeout(300)
def test_a_failed_registration_can_be_corrected():
  code = _PRELUDE.format(devices=1) + textwrap.dedent("""
      try:
        bp.register_ffi_target('bad_input_fixed', 42)
      except TypeError as e:
        print('refused:', e)
      jax.devices()  # the backend starts cleanly: nothing bad was queued
      bp.register_ffi_target('bad_input_fixed', HANDLERS['softmax'])
      y, lse = bp.ffi_call('bad_input_fixed', (S((4, 8), f32), S((4,), f32)),
                           signature='(n)->(n),()')(np.zeros((4, 8), f32))
      np.testing.assert_allclose(y, 1 / 8)
      print('CORRECTED')
      """)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == 0 and "CORRECTED" in proc.stdout, (
      f"returncode {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


@pytest.mark.timeout(300)
def test_a_bad_attribute_does_not_poison_the_next_call():
  code = _PRELUDE.format(devices=1) + textwrap.dedent(f"""
      call = bp.ffi_call('{MATVEC}', S((1, 2), f32), signature='(m,n),(n)->(m)')
      a, x = np.ones((1, 2, 2), f32), np.ones((1, 2), f32)
      try:
        call(a, x, alpha=np.int32(2)).block_until_ready()
      except Exception as e:
        print('bad call:', str(e).splitlines()[-1])
      np.testing.assert_allclose(call(a, x, alpha=np.float64(2.0)), [[4.0, 4.0]])
      print('GOOD CALL OK')
      """)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == 0 and "GOOD CALL OK" in proc.stdout, (
      f"returncode {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
