"""The text of an ExplainReport."""

import pytest

from batchpart._explain import CallReport, Collective, ExplainReport
from batchpart._explain.render import _where


def test_render():
  call = CallReport(
      target="my_kernel", num_batch_dims=None, operand_dtypes=("float32",),
      result_dtypes=("float32", "int32"), global_operand_shapes=((64, 16),),
      global_result_shapes=((64, 16), (64,)), device_operand_shapes=((64, 16),),
      device_result_shapes=((64, 16), (64,)),
      collectives_before=(Collective("all-gather", 4096, "ag", "jit(f)/ffi_call"),
                          Collective("all-reduce", 3 << 20, "ar", "jit(f)/reduce_sum")),
      collectives_after=(), replication=8, num_devices=8,
      source="/home/user/f.py:12 (f)", op_name="jit(f)/ffi_call")
  text = str(ExplainReport(calls=(call,), num_devices=8, partitioner="shardy"))
  assert text.splitlines()[0] == "batchpart.explain: 1 FFI call, 8 devices (shardy)"
  assert "[0] my_kernel  at f.py:12 (f)" in text
  assert "operand 0  f32[64,16]  f32[64,16]" in text
  assert "result 1   s32[64]     s32[64]" in text
  assert ("collectives before: all-gather 4.0 KiB, "
          "all-reduce 3.0 MiB (for jit(f)/reduce_sum)") in text
  assert "collectives after:  none" in text
  assert "replication: 8 (each batch element computed by 8 of 8 devices)" in text


def _call(**changes):
  fields = dict(
      target="k", num_batch_dims=1, operand_dtypes=("bfloat16",), result_dtypes=("bool",),
      global_operand_shapes=((8, 2),), global_result_shapes=((8,),),
      device_operand_shapes=((1, 2),), device_result_shapes=((1,),),
      collectives_before=(), collectives_after=(), replication=1, num_devices=8)
  fields.update(changes)
  return CallReport(**fields)


def _text(*calls, num_devices=8):
  return str(ExplainReport(calls=calls, num_devices=num_devices, partitioner="gspmd"))


def test_render_types_and_no_redundant_work():
  text = _text(_call())
  assert "operand 0  bf16[8,2]  bf16[1,2]" in text
  assert "result 0   pred[8]    pred[1]" in text
  assert "batch dims:  1 leading\n" in text and "declared:" not in text
  assert "(each batch element computed by 1 of 8 devices; no redundant work)" in text


def test_render_the_declaration_as_written():
  # the derived name's ranks say "1 leading" for num_batch_dims=1 and for
  # this signature alike; the declaration line says which the user wrote
  text = _text(_call(declaration="signature='(n)->()', reduce={'n': 'sum'}"))
  assert "batch dims:  1 leading\n" in text
  assert "declared:    signature='(n)->()', reduce={'n': 'sum'}" in text
  assert "(num_batch_dims)" not in text


def test_render_a_call_on_one_device():
  gather = Collective("all-gather", 4096, "ag", "jit(f)/pure_callback")
  back = Collective("all-reduce", 4096, "ar", "jit(f)/mul")
  text = _text(_call(target="xla_ffi_python_cpu_callback", callback="jax.pure_callback",
                     num_batch_dims=None, device_operand_shapes=((8, 2),),
                     device_result_shapes=((8,),), collectives_before=(gather,),
                     collectives_after=(back,), single_device=0,
                     op_name="jit(f)/pure_callback"))
  assert "[0] jax.pure_callback (xla_ffi_python_cpu_callback)" in text
  # Lines wider than the report wrap, each continuation under the field's value.
  assert ("    runs on:     device 0 only: one call on the whole arrays, after all-gathering\n"
          "                 4.0 KiB per device") in text   # a size stays with its unit
  assert max(map(len, text.splitlines())) <= 88
  assert "collectives after:  all-reduce 4.0 KiB (device 0's results to the others)" in text
  assert ("replication: 1 (device 0 alone computes every element; the other 7 devices "
          "compute\n                 none of it)") in text
  assert "no redundant work" not in text


def test_render_removed_call():
  text = _text(_call(device_operand_shapes=None, device_result_shapes=None,
                     replication=None, removed=True))
  assert "not in the compiled program" in text
  assert "operand 0  bf16[8,2]  ?" in text
  assert "collectives before" not in text and "replication: unknown" in text


def test_render_shard_map_body():
  text = _text(_call(in_shard_map=True, replication=None))
  assert "shard_map body" in text and "replication: n/a (inside shard_map" in text


def test_render_no_calls_and_one_device():
  assert _text(num_devices=1) == ("batchpart.explain: 0 FFI calls, 1 device (gspmd)\n"
                                  "no FFI call in this program")


def test_render_byte_units():
  c = lambda n: Collective("all-to-all", n, "a2a", "jit(f)/ffi_call")
  text = _text(_call(collectives_before=(c(1000),), collectives_after=(c(5 << 30),),
                     op_name="jit(f)/ffi_call"))
  assert "collectives before: all-to-all 1000 B" in text
  assert "collectives after:  all-to-all 5.0 GiB" in text


def test_render_does_not_import_report():
  # report imports render for str(); the dependency runs one way only
  import ast
  import inspect

  from batchpart._explain import render as render_module
  imported = set()
  for node in ast.walk(ast.parse(inspect.getsource(render_module))):
    if isinstance(node, ast.ImportFrom):
      imported.add(node.module or "")
      imported |= {f"{node.module}.{a.name}" for a in node.names}
    elif isinstance(node, ast.Import):
      imported |= {a.name for a in node.names}
  assert not any(m.startswith("batchpart._explain") for m in imported), imported


def test_a_call_typed_into_ipython_is_placed_by_its_cell():
  """Code run in IPython or Jupyter lives in temporary files (``/tmp/ipykernel_7/
  3712901551.py``): the report names the cell as IPython's tracebacks do."""
  interactive = pytest.importorskip("IPython.core.interactiveshell")
  shell = interactive.InteractiveShell.instance()
  try:
    shell.run_cell("import batchpart._explain.render as r", store_history=True)
    result = shell.run_cell("def f():\n  pass\n\nfile = f.__code__.co_filename",
                            store_history=True)
    assert result.success
    count = result.execution_count
    where = shell.user_ns["r"]._where(shell.user_ns["file"] + ":4 (f)")
  finally:
    interactive.InteractiveShell.clear_instance()
  assert where == f"Cell In[{count}], line 4 (f)"
  assert _where("/home/user/f.py:12 (f)") == "f.py:12 (f)"
