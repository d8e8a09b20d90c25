"""bp.explain on one device, and its pieces on hand-written HLO: the module
reader, the collective walk (async pairs, what stops it), the replication
rule and the text rendering. The multi-device behaviour is in
multidevice_tests/test_explain.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp
from batchpart import _explain, _hlo, testing as kernels


def test_single_device_call():
  x = np.ones((6, 5), np.float32)
  report = bp.explain(lambda x: kernels.softmax(x), x)
  assert report.num_devices == 1
  (call,) = report.calls
  assert call.target == "batchpart_test_softmax" and call.num_batch_dims == 1
  assert call.global_operand_shapes == call.device_operand_shapes == ((6, 5),)
  assert call.global_result_shapes == call.device_result_shapes == ((6, 5), (6,))
  assert call.collectives_before == call.collectives_after == ()
  assert call.replication == 1
  assert "test_explain.py" in call.source
  text = str(report)
  assert "batchpart_test_softmax" in text and "f32[6,5]" in text


def test_explain_does_not_run_the_function():
  kernels.reset_batch_elements_processed()
  bp.explain(kernels.softmax, np.ones((6, 5), np.float32))
  assert kernels.batch_elements_processed() == 0


def test_no_ffi_call():
  report = bp.explain(lambda x: jnp.cos(x) * 2, np.ones(3, np.float32))
  assert report.calls == ()
  assert "no FFI call" in str(report)


def test_keyword_arguments_go_to_the_function():
  f = lambda x, *, scale: kernels.softmax(x * scale)[0]
  (call,) = bp.explain(f, np.ones((2, 3), np.float32), scale=2.0).calls
  assert call.global_operand_shapes == ((2, 3),)


def test_vmap_adds_a_batch_dim():
  (call,) = bp.explain(jax.vmap(kernels.softmax), np.ones((2, 3, 4), np.float32)).calls
  assert call.num_batch_dims == 2 and call.global_operand_shapes == ((2, 3, 4),)


# --- the replication rule -------------------------------------------------

@pytest.mark.parametrize("g, l, k, expected", [
    ((64, 16), (8, 16), 1, 1),      # batch split 8 ways
    ((64, 16), (64, 16), 1, 8),     # every device does everything
    ((64, 16), (16, 16), 1, 2),     # 4 ways, each block on 2 devices
    ((64, 16), (64, 16), None, 8),  # plain call: all dims considered
    ((64, 16), (8, 16), None, 1),
    ((10, 3), (2, 3), 1, 1),        # uneven: padded to 16 rows over 8
    ((10, 3), (3, 3), 1, 2),        # uneven: 4 shards of 3 (padded to 12)
    ((4, 4, 5), (2, 1, 5), 2, 1),   # two batch dims over a 2x4 mesh
    ((4, 4, 5), (2, 4, 5), 2, 4),
    ((64, 16), (64, 16), 0, 8),     # no batch dims: one problem everywhere
    ((64, 16), (8, 16), 0, 8),
])
def test_replication_rule(g, l, k, expected):
  assert _explain._replication(8, ((g,),), (g,), ((l,),), (l,), k) == expected
  assert _explain._replication(8, (g,), (g,), (l,), (l,), k) == expected


def test_replication_uses_the_largest_result_then_operands():
  # results (64, 16) and (64,): the (64, 16) one decides
  assert _explain._replication(8, ((64, 16),), ((64, 16), (64,)),
                               ((8, 16),), ((8, 16), (8,)), 1) == 1
  # no results: the operands decide
  assert _explain._replication(8, ((64, 16),), (), ((64, 16),), (), 1) == 8


def test_replication_unknown_when_shapes_do_not_fit():
  assert _explain._replication(8, ((8,),), ((8,),), ((9,),), ((9,),), 1) is None
  assert _explain._replication(8, ((8,),), ((8,),), ((3,),), ((3,),), 1) is None


# --- reading compiled modules --------------------------------------------

HLO = """\
HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[8,2]{1,0})->f32[8,16]{1,0}}, num_partitions=8

FileNames
1 "/home/user/f.py"
2 "/site-packages/batchpart/_primitive.py"

FunctionNames
1 "<module>"
2 "f"
3 "bind"

FileLocations
1 {file_name_id=1 function_name_id=1 line=30 end_line=30 column=1 end_column=1}
2 {file_name_id=1 function_name_id=2 line=12 end_line=12 column=5 end_column=5}
3 {file_name_id=2 function_name_id=3 line=231 end_line=231 column=9 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}


%fused_copy (param_0: f32[8,16]) -> f32[8,16] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  ROOT %copy.1 = f32[8,16]{1,0} copy(%param_0)
}

%fused_dot (param_0.1: f32[8,16], param_1: f32[16,16]) -> f32[8,16] {
  %param_0.1 = f32[8,16]{1,0} parameter(0)
  %param_1 = f32[16,16]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,16]{1,0} dot(%param_0.1, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main (param: f32[1,16], param.1: f32[16,16]) -> (f32[8,16], f32[8,16]) {
  %param = f32[1,16]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %param.1 = f32[16,16]{1,0} parameter(1), sharding={replicated}
  %all-gather-start = (f32[1,16]{1,0}, f32[8,16]{1,0}) all-gather-start(%param), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, metadata={op_name="jit(f)/ffi_call" stack_frame_id=3}
  %all-gather-done = f32[8,16]{1,0} all-gather-done(%all-gather-start), metadata={op_name="jit(f)/ffi_call" stack_frame_id=3}
  %copy_fusion = f32[8,16]{1,0} fusion(%all-gather-done), kind=kLoop, calls=%fused_copy
  %custom-call.1 = (f32[8,16]{1,0}, f32[8]{0}) custom-call(%copy_fusion), custom_call_target="my_kernel", operand_layout_constraints={f32[8,16]{1,0}}, api_version=API_VERSION_TYPED_FFI, metadata={op_name="jit(f)/ffi_call" stack_frame_id=3}
  %gte = f32[8,16]{1,0} get-tuple-element(%custom-call.1), index=0
  %dot_fusion = f32[8,16]{1,0} fusion(%gte, %param.1), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(f)/dot_general" stack_frame_id=2}
  %all-reduce = f32[8,16]{1,0} all-reduce(%dot_fusion), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add, metadata={op_name="jit(f)/dot_general" stack_frame_id=2}
  %cp = f32[8,16]{1,0} collective-permute(%gte), channel_id=3, source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(f)/ffi_call" stack_frame_id=3}
  %t = (f32[8,16]{1,0}, f32[8,16]{1,0}, f32[8,16]{1,0}, f32[8,16]{1,0}, f32[8,16]{1,0}, /*index=5*/f32[8,16]{1,0}) tuple(%all-reduce, %cp, %gte, %gte, %gte, /*index=5*/%copy_fusion)
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%t), index=5
}
"""


def test_parse_module():
  m = _hlo.parse_module(HLO)
  assert m.entry == "main" and m.num_partitions == 8 and m.replica_count == 1
  assert set(m.computations) == {"fused_copy", "fused_dot", "add", "main"}
  call = m.by_name["custom-call.1"]
  assert m.computation_of[call.name] == "main"
  assert call.op_name == "jit(f)/ffi_call" and call.stack_frame_id == 3
  assert [f.function for f in m.stack(call.stack_frame_id)] == ["bind", "f", "<module>"]
  assert m.stack(2)[0] == _hlo.Frame("f", "/home/user/f.py", 12, 5)
  assert [o.name for o in m.operands(call)] == ["copy_fusion"]
  assert [u.name for u in m.users_of(call)] == ["gte"]
  # operands after an /*index=5*/ comment keep their names
  assert m.by_name["t"].operand_names[5] == "copy_fusion"
  assert m.by_name["copy_fusion"].called == ("fused_copy",)
  assert {i.opcode for i in m.called_instructions(m.by_name["dot_fusion"])} == {
      "parameter", "dot"}


def test_existing_readers_keep_working_on_the_same_text():
  (call,) = _hlo.custom_calls(HLO, "my_kernel")
  assert [t.shape for t in call.operand_types] == [(8, 16)]
  kinds = [c.opcode for c in _hlo.collectives(HLO)]
  assert kinds == ["all-gather", "all-reduce", "collective-permute"]


def test_collective_walk():
  m = _hlo.parse_module(HLO)
  call = m.by_name["custom-call.1"]
  before = _explain._collectives(m, call, forward=False)
  after = _explain._collectives(m, call, forward=True)
  # the async pair counts once, named after the start, sized by the done
  assert before == (_explain.Collective("all-gather", 8 * 16 * 4, "all-gather-start",
                                        "jit(f)/ffi_call"),)
  # the all-reduce behind the dot belongs to the dot: the walk stops there
  assert [c.kind for c in after] == ["collective-permute"]


def test_render():
  call = _explain.CallReport(
      target="my_kernel", num_batch_dims=None, operand_dtypes=("float32",),
      result_dtypes=("float32", "int32"), global_operand_shapes=((64, 16),),
      global_result_shapes=((64, 16), (64,)), device_operand_shapes=((64, 16),),
      device_result_shapes=((64, 16), (64,)),
      collectives_before=(_explain.Collective("all-gather", 4096, "ag", "jit(f)/ffi_call"),
                          _explain.Collective("all-reduce", 3 << 20, "ar", "jit(f)/reduce_sum")),
      collectives_after=(), replication=8, num_devices=8,
      source="/home/user/f.py:12 (f)", op_name="jit(f)/ffi_call")
  text = str(_explain.ExplainReport(calls=(call,), num_devices=8, partitioner="shardy"))
  assert text.splitlines()[0] == "batchpart.explain: 1 FFI call, 8 devices (shardy)"
  assert "[0] my_kernel  at f.py:12 (f)" in text
  assert "operand 0  f32[64,16]  f32[64,16]" in text
  assert "result 1   s32[64]     s32[64]" in text
  assert ("collectives before: all-gather 4.0 KiB, "
          "all-reduce 3.0 MiB (for jit(f)/reduce_sum)") in text
  assert "collectives after:  none" in text
  assert "replication: 8 (each batch element computed by 8 of 8 devices)" in text
