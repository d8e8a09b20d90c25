"""The compiled-HLO reader: instructions, edges, metadata, stack frames."""

from batchpart import _hlo

from hlo_sample import HLO


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


def test_array_type_bytes():
  assert _hlo.ArrayType("f32", (8, 16)).nbytes == 512
  assert _hlo.ArrayType("c128", (2,)).nbytes == 32
  assert _hlo.ArrayType("pred", (3,)).nbytes == 3
  assert _hlo.ArrayType("bf16", (4,)).nbytes == 8
  assert _hlo.ArrayType("f32", ()).nbytes == 4
  assert str(_hlo.ArrayType("s32", (2, 3))) == "s32[2,3]"


def test_custom_call_keeps_the_user_target_of_a_derived_name():
  line = ('  %c = f32[4]{0} custom-call(%p), custom_call_target="k$bp1$o1$r1$no1$nr1", '
          'api_version=API_VERSION_TYPED_FFI')
  (inst,) = _hlo.instructions(line)
  assert inst.opcode == "custom-call" and inst.target == "k"
