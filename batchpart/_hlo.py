"""Reading a compiled (partitioned) HLO module's text: custom calls and
collectives, with their per-device shapes.

XLA prints per-device shapes after SPMD partitioning, so these are what each
device really holds.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16|f8\w*)\[([\d,]*)\]")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<opcode>[a-z][\w\-]*)\((?P<operands>.*?)\)(?P<rest>.*)$")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')

COLLECTIVE_OPCODES = ("all-gather", "all-to-all", "collective-permute",
                      "all-reduce", "reduce-scatter", "ragged-all-to-all",
                      "collective-broadcast")

_DTYPE_NAMES = {"pred": "bool", "bf16": "bfloat16"}


@dataclasses.dataclass(frozen=True)
class ArrayType:
  dtype: str
  shape: tuple[int, ...]

  @property
  def nbytes(self) -> int:
    name = _DTYPE_NAMES.get(self.dtype, self.dtype)
    if name[0] in "sufc" and name[1:].isdigit():
      kind = {"s": "int", "u": "uint", "f": "float", "c": "complex"}[name[0]]
      name = f"{kind}{name[1:]}"
    try:
      itemsize = np.dtype(name).itemsize
    except TypeError:
      itemsize = 1
    return int(np.prod(self.shape, dtype=np.int64)) * itemsize

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


def parse_types(text: str) -> tuple[ArrayType, ...]:
  return tuple(ArrayType(dtype, tuple(int(d) for d in dims.split(",") if d))
               for dtype, dims in _SHAPE.findall(text))


def _braced_value(line: str, key: str) -> str:
  """The text inside the balanced braces after `key`, or ''."""
  start = line.find(key + "{")
  if start < 0:
    return ""
  depth = 0
  for i in range(start + len(key), len(line)):
    depth += {"{": 1, "}": -1}.get(line[i], 0)
    if depth == 0:
      return line[start + len(key) + 1:i]
  return ""


def instructions(hlo_text: str) -> list[Instruction]:
  out = []
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    opcode = m.group("opcode")
    operands = tuple(o.strip().lstrip("%").split(" ")[-1].lstrip("%")
                     for o in m.group("operands").split(",") if o.strip())
    target = operand_types = None
    if opcode == "custom-call":
      t = _TARGET.search(line)
      target = t.group(1) if t else None
      operand_types = parse_types(_braced_value(line, "operand_layout_constraints="))
    out.append(Instruction(
        name=m.group("name"), opcode=opcode,
        result_types=parse_types(m.group("shape")), operand_names=operands,
        target=target, operand_types=operand_types or (), text=line.strip()))
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
