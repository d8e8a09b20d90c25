"""Reading a compiled (partitioned) HLO module's text: custom calls and
collectives, with their per-device shapes.

XLA prints per-device shapes after SPMD partitioning, so these are what each
device really holds. ``parse_module`` also keeps which computation each
instruction belongs to, operand/user edges, metadata (the jax op name and the
Python stack frames XLA carries from the lowered program's locations) and the
module's partition count, for ``batchpart.explain``.

Strings (targets, frontend attributes, op names, file and function names)
print quoted with C escapes (XLA's ``CEscape``: a backslash before a quote,
a backslash, a tab or a newline; other bytes outside printable ASCII in
octal), checked against jaxlib 0.10.2's printer. Structure is read with every
string's contents masked, so a quote or a ``key=`` inside a name cannot be
taken for syntax.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from batchpart import _dtypes
from batchpart._vocab import derived_names

_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16|f8\w*)\[([\d,]*)\]")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<opcode>[a-z][\w\-]*)\((?P<operands>.*?)\)(?P<rest>.*)$")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_ESCAPE = re.compile(r'\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))', re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b",
                   "f": "\f", "v": "\v"}
_ATTRIBUTE_KEY = re.compile(r'([\w.\-]+)="')
_COMMENT = re.compile(r"/\*.*?\*/")
_API_VERSION = re.compile(r"\bapi_version=(\w+)")
_STACK_FRAME_ID = re.compile(r"\bstack_frame_id=(\d+)")
_CALLED = re.compile(
    r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)"
    r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*->.*\{\s*$")
_HEADER_INT = re.compile(r"\b(num_partitions|replica_count)=(\d+)")
_TABLE_ROW = re.compile(r"^(\d+)\s+(.*)$")
_KEY_VALUE = re.compile(r"(\w+)=(\d+)")

COLLECTIVE_OPCODES = ("all-gather", "all-to-all", "collective-permute",
                      "all-reduce", "reduce-scatter", "ragged-all-to-all",
                      "collective-broadcast")


@dataclasses.dataclass(frozen=True)
class ArrayType:
  dtype: str
  shape: tuple[int, ...]

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * _dtypes.itemsize(self.dtype)

  def __str__(self):
    return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  opcode: str
  result_types: tuple[ArrayType, ...]
  operand_names: tuple[str, ...]
  target: str | None = None
  operand_types: tuple[ArrayType, ...] = ()
  text: str = ""
  #: the jax op XLA attributes the instruction to (``metadata={op_name=...}``)
  op_name: str = ""
  #: index into the module's StackFrames table (0: none)
  stack_frame_id: int = 0
  #: computations the instruction calls (fusion bodies, reducers, loop bodies)
  called: tuple[str, ...] = ()
  #: ``frontend_attributes={k="v",...}``, unescaped, in printed order
  frontend_attributes: tuple[tuple[str, str], ...] = ()
  #: a custom call's ``api_version`` (``API_VERSION_TYPED_FFI``), or ''
  api_version: str = ""
  #: a batchpart call's derived target name: its custom-call target, or, for
  #: a call XLA does not partition (one device, a fully manual region), the
  #: frontend attribute that carries it; None for any other instruction
  derived_name: str | None = None

  def frontend_attribute(self, key: str) -> str | None:
    return dict(self.frontend_attributes).get(key)


def parse_types(text: str) -> tuple[ArrayType, ...]:
  return tuple(ArrayType(dtype, tuple(int(d) for d in dims.split(",") if d))
               for dtype, dims in _SHAPE.findall(text))


def unescape(text: str) -> str:
  """The value of a printed HLO string's contents (without its quotes):
  C escapes undone, octal and hex escapes read as UTF-8 bytes."""
  if "\\" not in text:
    return text
  out = bytearray()
  last = 0
  for m in _ESCAPE.finditer(text):
    out += text[last:m.start()].encode()
    octal, hexa, char = m.groups()
    if octal is not None:
      out.append(int(octal, 8) & 0xFF)
    elif hexa is not None:
      out.append(int(hexa, 16))
    else:
      out += _SIMPLE_ESCAPES.get(char, char).encode()
    last = m.end()
  out += text[last:].encode()
  return out.decode("utf-8", errors="replace")


def _mask_strings(line: str) -> str:
  """``line`` with every string's contents replaced by as many ``_``: the
  same length, so positions found in it hold in ``line``."""
  return _STRING.sub(lambda m: '"' + "_" * (len(m.group(0)) - 2) + '"', line)


def _string_at(line: str, quote: int) -> str:
  """The unescaped string whose opening quote is at ``line[quote]``."""
  m = _STRING.match(line, quote)
  return unescape(m.group(0)[1:-1]) if m else ""


def _braced_span(masked: str, key: str, start: int = 0) -> tuple[int, int] | None:
  """(start, end) of the text inside the balanced braces after ``key`` in a
  masked line, or None."""
  at = masked.find(key + "{", start)
  if at < 0:
    return None
  depth = 0
  for i in range(at + len(key), len(masked)):
    depth += {"{": 1, "}": -1}.get(masked[i], 0)
    if depth == 0:
      return at + len(key) + 1, i
  return None


def _braced_value(line: str, key: str) -> str:
  """The text inside the balanced braces after `key`, or ''."""
  span = _braced_span(_mask_strings(line), key)
  return line[span[0]:span[1]] if span else ""


def _string_attribute(line: str, masked: str, key: str, span=None) -> str | None:
  """The value of ``key="..."`` outside any string (within ``span``, if given)."""
  lo, hi = span or (0, len(masked))
  m = re.compile(r'(?<![\w.\-])' + re.escape(key) + r'="').search(masked, lo, hi)
  return _string_at(line, m.end() - 1) if m else None


def _string_attributes(line: str, masked: str, span) -> tuple[tuple[str, str], ...]:
  """The ``key="value"`` pairs inside ``span`` of a masked line."""
  if span is None:
    return ()
  return tuple((m.group(1), _string_at(line, m.end() - 1))
               for m in _ATTRIBUTE_KEY.finditer(masked, span[0], span[1]))


def _parse_instruction(line: str) -> Instruction | None:
  masked = _mask_strings(line)
  m = _INSTRUCTION.match(masked)
  if not m:
    return None
  opcode = m.group("opcode")
  # Operands print as "%a, %b, /*index=5*/%c" (older XLA: "f32[2] %a").
  operands = tuple(_COMMENT.sub("", o).strip().split(" ")[-1].lstrip("%")
                   for o in m.group("operands").split(",") if o.strip())
  rest_at = m.start("rest")
  rest = m.group("rest")
  frontend = _string_attributes(line, masked, _braced_span(masked, "frontend_attributes=",
                                                           rest_at))
  target = operand_types = derived = None
  api_version = ""
  if opcode == "custom-call":
    raw = _string_attribute(line, masked, "custom_call_target", (rest_at, len(masked)))
    # A derived name is the target only where XLA partitions the call, and
    # the partitioner replaces it; either way the call reads as the target
    # the user wrote.
    target = derived_names.user_target(raw) if raw is not None else None
    if raw is not None and derived_names.is_derived(raw):
      derived = raw
    else:
      derived = dict(frontend).get(derived_names.FRONTEND_ATTRIBUTE)
    span = _braced_span(masked, "operand_layout_constraints=", rest_at)
    operand_types = parse_types(masked[span[0]:span[1]]) if span else ()
    version = _API_VERSION.search(rest)
    api_version = version.group(1) if version else ""
  metadata = _braced_span(masked, "metadata=", rest_at)
  op_name = _string_attribute(line, masked, "op_name", metadata) if metadata else None
  frame = _STACK_FRAME_ID.search(rest)
  called = list(_CALLED.findall(rest))
  for branches in _BRANCHES.findall(rest):
    called += [b.strip().lstrip("%") for b in branches.split(",") if b.strip()]
  return Instruction(
      name=m.group("name"), opcode=opcode,
      result_types=parse_types(m.group("shape")), operand_names=operands,
      target=target, operand_types=operand_types or (), text=line.strip(),
      op_name=op_name or "",
      stack_frame_id=int(frame.group(1)) if frame else 0,
      called=tuple(called), frontend_attributes=frontend, api_version=api_version,
      derived_name=derived)


def instructions(hlo_text: str) -> list[Instruction]:
  out = []
  for line in hlo_text.splitlines():
    inst = _parse_instruction(line)
    if inst is not None:
      out.append(inst)
  return out


def custom_calls(hlo_text: str, target: str | None = None) -> list[Instruction]:
  return [i for i in instructions(hlo_text)
          if i.opcode == "custom-call" and (target is None or i.target == target)]


def collectives(hlo_text: str) -> list[Instruction]:
  """Collective instructions (async ``-start`` forms count once; ``-done``
  halves are skipped)."""
  out = []
  for inst in instructions(hlo_text):
    base = inst.opcode.removesuffix("-start")
    if base in COLLECTIVE_OPCODES and not inst.opcode.endswith("-done"):
      out.append(dataclasses.replace(inst, opcode=base))
  return out


def collective_kind(inst: Instruction) -> str | None:
  """The collective an instruction is (``"all-gather"`` for ``all-gather``,
  ``all-gather-start`` and ``all-gather-done``), or None."""
  base = inst.opcode.removesuffix("-start").removesuffix("-done")
  return base if base in COLLECTIVE_OPCODES else None


@dataclasses.dataclass(frozen=True)
class Frame:
  """One Python stack frame, as XLA keeps it in a module's StackFrames table."""
  function: str
  file: str
  line: int
  column: int


@dataclasses.dataclass
class Module:
  """A compiled HLO module: its computations, edges, frames and partitions."""
  computations: dict[str, list[Instruction]]
  entry: str
  num_partitions: int = 1
  replica_count: int = 1
  #: frame id -> (file location id, parent frame id or 0)
  stack_frames: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
  #: file location id -> the frame it names
  file_locations: dict[int, Frame] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.by_name: dict[str, Instruction] = {}
    self.computation_of: dict[str, str] = {}
    self.users: dict[str, list[str]] = {}
    for comp, insts in self.computations.items():
      for inst in insts:
        self.by_name[inst.name] = inst
        self.computation_of[inst.name] = comp
      names = {i.name for i in insts}
      for inst in insts:
        for operand in inst.operand_names:
          if operand in names:
            self.users.setdefault(operand, []).append(inst.name)

  def all_instructions(self) -> list[Instruction]:
    """Every instruction, non-entry computations first (as XLA prints them)."""
    return [i for insts in self.computations.values() for i in insts]

  def operands(self, inst: Instruction) -> list[Instruction]:
    comp = self.computation_of.get(inst.name)
    return [self.by_name[o] for o in inst.operand_names
            if o in self.by_name and self.computation_of[o] == comp]

  def users_of(self, inst: Instruction) -> list[Instruction]:
    return [self.by_name[u] for u in self.users.get(inst.name, ())]

  def called_instructions(self, inst: Instruction) -> list[Instruction]:
    """The instructions of the computations ``inst`` calls, recursively."""
    out, seen, todo = [], set(), list(inst.called)
    while todo:
      comp = todo.pop()
      if comp in seen or comp not in self.computations:
        continue
      seen.add(comp)
      for i in self.computations[comp]:
        out.append(i)
        todo.extend(i.called)
    return out

  def stack(self, frame_id: int) -> tuple[Frame, ...]:
    """The Python frames of a stack frame id, innermost first."""
    out, seen = [], set()
    while frame_id and frame_id in self.stack_frames and frame_id not in seen:
      seen.add(frame_id)
      location, parent = self.stack_frames[frame_id]
      if location in self.file_locations:
        out.append(self.file_locations[location])
      frame_id = parent
    return tuple(out)


def _table_string(value: str) -> str:
  """A FileNames / FunctionNames row's value: a quoted, escaped string."""
  value = value.strip()
  m = _STRING.fullmatch(value)
  return unescape(m.group(0)[1:-1]) if m else value.strip('"')


def parse_module(hlo_text: str) -> Module:
  """Parses a compiled module's text (``compiled.as_text()``)."""
  computations: dict[str, list[Instruction]] = {}
  entry = ""
  current: str | None = None
  header = {"num_partitions": 1, "replica_count": 1}
  tables: dict[str, dict[int, str]] = {}
  table = None
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if stripped.startswith("HloModule "):
      for key, value in _HEADER_INT.findall(stripped):
        header[key] = int(value)
      continue
    if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      table = tables.setdefault(stripped, {})
      continue
    if current is None and table is not None:
      row = _TABLE_ROW.match(stripped)
      if row:
        table[int(row.group(1))] = row.group(2)
        continue
      table = None
    inst = _parse_instruction(line) if current is not None else None
    if current is not None and inst is not None:
      computations[current].append(inst)
      continue
    comp = _COMPUTATION.match(stripped)
    if comp and " = " not in stripped.split("(", 1)[0]:
      current = comp.group("name")
      computations[current] = []
      table = None
      if comp.group("entry"):
        entry = current
      continue
    if stripped == "}":
      current = None
  names = {k: _table_string(v) for k, v in tables.get("FileNames", {}).items()}
  functions = {k: _table_string(v) for k, v in tables.get("FunctionNames", {}).items()}
  locations = {}
  for k, v in tables.get("FileLocations", {}).items():
    f = dict((a, int(b)) for a, b in _KEY_VALUE.findall(v))
    locations[k] = Frame(functions.get(f.get("function_name_id", 0), ""),
                         names.get(f.get("file_name_id", 0), ""),
                         f.get("line", 0), f.get("column", 0))
  frames = {}
  for k, v in tables.get("StackFrames", {}).items():
    f = dict((a, int(b)) for a, b in _KEY_VALUE.findall(v))
    # XLA prints parent_frame_id one above the parent's id (1: no parent),
    # checked on jaxlib 0.10.2's printer.
    frames[k] = (f.get("file_location_id", 0), max(f.get("parent_frame_id", 0) - 1, 0))
  return Module(computations=computations, entry=entry,
                num_partitions=header["num_partitions"],
                replica_count=header["replica_count"],
                stack_frames=frames, file_locations=locations)
