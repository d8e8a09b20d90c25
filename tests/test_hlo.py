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


def test_derived_name_from_target_or_frontend_attribute():
  derived = "k$bp1$o1$r1$no1$nr1"
  partitioned = ('  %c = f32[4]{0} custom-call(%p), custom_call_target="' + derived + '", '
                 'api_version=API_VERSION_TYPED_FFI')
  # one device / fully manual region: the user's target, the name rides along
  unpartitioned = ('  %c = f32[4]{0} custom-call(%p), custom_call_target="k", '
                   'api_version=API_VERSION_TYPED_FFI, frontend_attributes={'
                   'batchpart.derived_name="' + derived + '",num_batch_dims="1"}')
  plain = '  %c = f32[4]{0} custom-call(%p), custom_call_target="k"'
  (a,), (b,), (c,) = map(_hlo.instructions, (partitioned, unpartitioned, plain))
  assert a.target == b.target == c.target == "k"
  assert a.derived_name == b.derived_name == derived and c.derived_name is None
  assert b.frontend_attributes == (("batchpart.derived_name", derived),
                                   ("num_batch_dims", "1"))
  assert b.frontend_attribute("num_batch_dims") == "1" and a.frontend_attribute("x") is None
  assert a.api_version == "API_VERSION_TYPED_FFI" and c.api_version == ""


def test_unescape():
  assert _hlo.unescape("plain") == "plain"
  assert _hlo.unescape(r"my\"quoted") == 'my"quoted'
  assert _hlo.unescape(r"back\\slash\ttab\nline\'") == "back\\slash\ttab\nline'"
  assert _hlo.unescape(r"caf\303\251 \x41") == "café A"   # CEscape's octal bytes: UTF-8


def test_quoted_strings_are_not_syntax():
  # A target with a quote, and strings that spell attributes: only the real
  # attributes count.
  line = (r'  ROOT %c = (f32[2,8]{1,0}, f32[2]{0}) custom-call(%p), '
          r'custom_call_target="my\"q, calls=%x operand_layout_constraints={f32[9]}", '
          r'operand_layout_constraints={f32[2,8]{1,0}}, api_version=API_VERSION_TYPED_FFI, '
          r'frontend_attributes={batchpart.derived_name="my\"q$bp1$o1$r1,1$no2$nr2,1",'
          r'num_batch_dims="1"}, metadata={op_name="jit(f)/say \"hi\" stack_frame_id=9" '
          r'stack_frame_id=5}, backend_config={}')
  (inst,) = _hlo.instructions(line)
  assert inst.target == 'my"q, calls=%x operand_layout_constraints={f32[9]}'
  assert [t.shape for t in inst.operand_types] == [(2, 8)]
  assert [t.shape for t in inst.result_types] == [(2, 8), (2,)]
  assert inst.called == () and inst.stack_frame_id == 5
  assert inst.op_name == 'jit(f)/say "hi" stack_frame_id=9'
  assert inst.derived_name == 'my"q$bp1$o1$r1,1$no2$nr2,1'
  assert inst.api_version == "API_VERSION_TYPED_FFI"


def test_table_strings_are_unescaped():
  text = ('HloModule m\n\nFileNames\n1 "/tmp/a \\"b\\".py"\n\nFunctionNames\n1 "f"\n\n'
          'FileLocations\n1 {file_name_id=1 function_name_id=1 line=3 column=1}\n\n'
          'StackFrames\n1 {file_location_id=1 parent_frame_id=1}\n\n'
          'ENTRY %main (p: f32[2]) -> f32[2] {\n'
          '  ROOT %p = f32[2]{0} parameter(0)\n}\n')
  m = _hlo.parse_module(text)
  assert m.stack(1) == (_hlo.Frame("f", '/tmp/a "b".py', 3, 1),)
