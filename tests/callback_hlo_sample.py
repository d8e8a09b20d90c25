"""What jax 0.10.2 compiles for a ``jax.pure_callback`` on an operand
sharded over 8 devices (Shardy; GSPMD gives the same structure), trimmed to
what matters: the all-gather in front, the call in the true branch of a
conditional on ``partition-id() == 0``, and the select + all-reduce that
broadcasts device 0's results behind. Used by test_explain_callbacks.py."""

HLO = """\
HloModule jit_f, is_scheduled=true, num_partitions=8

%true_computation (true_branch_param: (f32[64,16])) -> (f32[64,16]) {
  %true_branch_param = (f32[64,16]{1,0}) parameter(0)
  %get-tuple-element = f32[64,16]{1,0} get-tuple-element(%true_branch_param), index=0
  ROOT %pure_callback.0 = (f32[64,16]{1,0}) custom-call(%get-tuple-element), custom_call_target="xla_ffi_python_cpu_callback", operand_layout_constraints={f32[64,16]{1,0}}, api_version=API_VERSION_TYPED_FFI, metadata={op_name="jit(f)/pure_callback"}, backend_config={index = 0 : ui64}
}

%false_computation (false_branch_param.1: ()) -> (f32[64,16]) {
  %false_branch_param.1 = () parameter(0)
  %constant.2 = f32[] constant(0)
  %broadcast = f32[64,16]{1,0} broadcast(%constant.2), dimensions={}
  ROOT %tuple.5 = (f32[64,16]{1,0}) tuple(%broadcast)
}

%wrapped_compare_computation (param_0: u32[], param_1: u32[]) -> pred[] {
  %param_0 = u32[] parameter(0)
  %param_1 = u32[] parameter(1)
  ROOT %compare.1 = pred[] compare(%param_0, %param_1), direction=EQ
}

%other_compare_computation (param_0.5: u32[], param_1.5: u32[]) -> pred[] {
  %param_0.5 = u32[] parameter(0)
  %param_1.5 = u32[] parameter(1)
  ROOT %compare.2 = pred[] compare(%param_0.5, %param_1.5), direction=NE
}

%select_computation (param_0.2: f32[64,16], param_1.2: u32[]) -> f32[64,16] {
  %param_0.2 = f32[64,16]{1,0} parameter(0)
  %param_1.2 = u32[] parameter(1)
  %constant.7 = u32[] constant(0)
  %compare.3 = pred[] compare(%param_1.2, %constant.7), direction=EQ
  %broadcast.3 = pred[64,16]{1,0} broadcast(%compare.3), dimensions={}
  %constant.8 = f32[] constant(0)
  %broadcast.4 = f32[64,16]{1,0} broadcast(%constant.8), dimensions={}
  ROOT %select = f32[64,16]{1,0} select(%broadcast.3, %param_0.2, %broadcast.4)
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main.0_spmd (param: f32[8,16]) -> f32[64,16] {
  %partition-id = u32[] partition-id()
  %param = f32[8,16]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %constant.1 = u32[] constant(0)
  %tuple.3 = () tuple()
  %all-gather = f32[64,16]{1,0} all-gather(%param), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(f)/pure_callback"}
  %wrapped_compare = pred[] fusion(%partition-id, %constant.1), kind=kLoop, calls=%wrapped_compare_computation
  %tuple.1 = (f32[64,16]{1,0}) tuple(%all-gather)
  %conditional = (f32[64,16]{1,0}) conditional(%wrapped_compare, %tuple.1, %tuple.3), true_computation=%true_computation, false_computation=%false_computation
  %get-tuple-element.1 = f32[64,16]{1,0} get-tuple-element(%conditional), index=0
  %select_fusion = f32[64,16]{1,0} fusion(%get-tuple-element.1, %partition-id), kind=kLoop, calls=%select_computation
  ROOT %all-reduce = f32[64,16]{1,0} all-reduce(%select_fusion), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(f)/mul"}
}
"""
