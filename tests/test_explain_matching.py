"""Tying compiled FFI calls to lowered ones: by target and stack, then by
order; copies and unknown calls."""

from batchpart import _hlo
from batchpart._explain.lowered import LoweredCall
from batchpart._explain.matching import compiled_ffi_calls, match

F = _hlo.Frame
USER_A = F("f", "/u/a.py", 10, 1)
USER_B = F("f", "/u/a.py", 20, 1)
CALLER = F("<module>", "/u/a.py", 30, 1)


def _module(*calls):
  # frame ids: 1 = CALLER; 2 = USER_A in CALLER; 3 = USER_B in CALLER
  return _hlo.Module(
      computations={"main": list(calls)}, entry="main",
      stack_frames={1: (1, 0), 2: (2, 1), 3: (3, 1)},
      file_locations={1: CALLER, 2: USER_A, 3: USER_B})


def _compiled(name, target, frame_id):
  return _hlo.Instruction(name=name, opcode="custom-call", result_types=(),
                          operand_names=(), target=target, stack_frame_id=frame_id,
                          api_version="API_VERSION_TYPED_FFI")


def _lowered(target, *frames):
  return LoweredCall(target=target, operands=(), results=(), num_batch_dims=1,
                     in_shard_map=False, frames=frames)


def _names(matched):
  return {k: [i.name for i in v] for k, v in matched.items()}


def test_stacks_decide_over_order():
  a, b = _compiled("c.a", "k", 2), _compiled("c.b", "k", 3)
  module = _module(b, a)
  # the lowered stacks are prefixes: inlining adds the caller frame
  lowered = [_lowered("k", USER_A), _lowered("k", USER_B)]
  assert _names(match(lowered, [b, a], module)) == {0: ["c.a"], 1: ["c.b"]}


def test_calls_without_stacks_go_by_order():
  a, b = _compiled("c.a", "k", 0), _compiled("c.b", "k", 0)
  lowered = [_lowered("k"), _lowered("k")]
  assert _names(match(lowered, [a, b], _module(a, b))) == {0: ["c.a"], 1: ["c.b"]}


def test_copies_and_unknown_and_removed_calls():
  a1, a2 = _compiled("c.a1", "k", 2), _compiled("c.a2", "k", 2)
  other = _compiled("c.x", "other", 0)
  lowered = [_lowered("k", USER_A), _lowered("k", USER_B)]
  matched = match(lowered, [a1, a2, other], _module(a1, a2, other))
  # an unrolled loop copies the call; the second lowered call was removed
  assert _names(matched) == {0: ["c.a1", "c.a2"], None: ["c.x"]}


def test_compiled_ffi_calls_are_typed_ffi_custom_calls():
  typed = _compiled("c.a", "k", 0)
  legacy = _hlo.Instruction(name="c.l", opcode="custom-call", result_types=(),
                            operand_names=(), target="k", api_version="API_VERSION_ORIGINAL")
  copy = _hlo.Instruction(name="cp", opcode="copy", result_types=(), operand_names=())
  assert compiled_ffi_calls(_module(typed, legacy, copy)) == [typed]


def test_a_quoted_target_matches_its_lowered_call():
  line = (r'  %c = f32[4]{0} custom-call(%p), custom_call_target="my\"quoted", '
          r'api_version=API_VERSION_TYPED_FFI, frontend_attributes={'
          r'batchpart.derived_name="my\"quoted$bp1$o1$r1$no1$nr1",num_batch_dims="1"}, '
          r'metadata={op_name="jit(f)/batchpart_ffi_call" stack_frame_id=2}')
  (compiled,) = _hlo.instructions(line)
  module = _module(compiled)
  assert compiled_ffi_calls(module) == [compiled]
  matched = match([_lowered('my"quoted', USER_A)], [compiled], module)
  assert _names(matched) == {0: ["c"]}
