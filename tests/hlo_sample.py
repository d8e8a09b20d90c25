"""A hand-written compiled module: an async all-gather feeding an FFI call,
a collective-permute of its result and an all-reduce behind a dot, with the
StackFrames tables XLA prints. Shared by test_hlo.py and
test_explain_collectives.py."""

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
