"""An ``ExplainReport`` as text: one table of global and per-device types per
call, then its collectives, batch dims and replication.

Reads the report's fields and imports nothing of ``report``, which imports
this module for ``str(report)``: the dependency runs one way.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from batchpart import _dtypes
from batchpart._vocab.dims.halo import part_sizes
from batchpart._vocab.dims.named_combiners import gathers, is_combiner, merge_text

Shape = tuple[int, ...]


def _type(dtype: str, shape: Shape | None) -> str:
  if shape is None:
    return "?"
  return f"{_dtypes.to_hlo(dtype)}[{','.join(map(str, shape))}]"


def _bytes(n: int) -> str:
  size = float(n)
  for unit in ("B", "KiB", "MiB", "GiB"):
    if size < 1024 or unit == "GiB":
      return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
    size /= 1024
  return f"{n} B"


def _collective_text(cs: Sequence[Any], call_op_names: set[str], from_device=None) -> str:
  """``cs``: ``Collective``s; ``from_device``: the one device whose results
  they carry, for a call that runs there only."""
  if not cs:
    return "none"
  parts = []
  for c in cs:
    text = f"{c.kind} {_bytes(c.bytes)}"
    if from_device is not None:
      text += f" (device {from_device}'s results to the others)"
    elif getattr(c, "declared_reduction", False):
      text += " (the declared reduction)"
    elif getattr(c, "declared_halo", False):
      text += " (the declared halo)"
    elif c.op_name and c.op_name not in call_op_names:
      text += f" (for {c.op_name})"
    parts.append(text)
  return ", ".join(parts)


def _at(shapes, i: int) -> Shape | None:
  return shapes[i] if shapes is not None and i < len(shapes) else None


def render(report: Any) -> str:
  """The text of an ``ExplainReport``."""
  n = len(report.calls)
  head = (f"batchpart.explain: {n} FFI call{'s' if n != 1 else ''}, "
          f"{report.num_devices} device{'s' if report.num_devices != 1 else ''}"
          f" ({report.partitioner})")
  if not n:
    return head + "\nno FFI call in this program"
  lines = [head]
  for k, call in enumerate(report.calls):
    lines += ["", *_call_lines(k, call)]
  return "\n".join(wrapped for line in lines for wrapped in _wrap(line))


#: the report's width: it reads line by line, in a terminal or a notebook's output box
WIDTH = 88
#: ``    collectives before: `` -> its length is where the value starts
_FIELD = re.compile(r"^( +[a-z][a-z0-9 ]*: +)")
#: a size and its unit (``4.0 KiB``), kept on one line
_SIZE = re.compile(r"(?<=\d) (?=(?:B|KiB|MiB|GiB)\b)")


def _wrap(line: str) -> list[str]:
  """A line of the report in lines of at most ``WIDTH`` columns, each continuation indented
  to where the line's value starts (a call's own line: to its fields), so that a long value
  keeps the report's columns."""
  if len(line) <= WIDTH:
    return [line]
  field = _FIELD.match(line)
  indent = len(field[1]) if field else 4 + len(line) - len(line.lstrip())
  glued = _SIZE.sub("\0", line)
  return [part.replace("\0", " ") for part in textwrap.wrap(
      glued, WIDTH, subsequent_indent=" " * indent, break_long_words=False,
      break_on_hyphens=False)]


def _where(source: str) -> str:
  """A call site as its reader knows it: ``model.py:16 (f)``, or, for code run in IPython or
  Jupyter (whose files are temporary, ``/tmp/ipykernel_7/3712901551.py``), the cell as
  IPython's own tracebacks name it: ``Cell In[3], line 16 (f)``."""
  place, _, function = source.partition(" ")
  file, _, line = place.rpartition(":")
  ipython = sys.modules.get("IPython")
  shell = ipython.get_ipython() if ipython is not None else None
  cell = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(file)
  if cell is not None:
    return f"{' '.join(cell)}, line {line} {function}".rstrip()
  return f"{os.path.basename(file)}:{line} {function}".rstrip()


def _call_lines(k: int, call: Any) -> list[str]:
  """The lines of one ``CallReport``."""
  where = f"  at {_where(call.source)}" if call.source else ""
  label = call.target if call.callback is None else f"{call.callback} ({call.target})"
  lines = [f"[{k}] {label}{where}"]
  if call.removed:
    lines.append("    not in the compiled program (XLA removed it: unused, "
                 "or merged with an identical call)")
  lines += _type_table(call)
  one = getattr(call, "single_device", None)
  if not call.removed:
    own = {call.op_name}
    lines.append(f"    collectives before: "
                 f"{_collective_text(call.collectives_before, own)}")
    lines.append(f"    collectives after:  "
                 f"{_collective_text(call.collectives_after, own, one)}")
  if one is not None:
    lines.append(f"    runs on:     {_single_device_text(call)}")
  lines.append(f"    batch dims:  {_batch_text(call)}")
  if getattr(call, "declaration", None):
    lines.append(f"    declared:    {call.declaration}")
  if call.reduced_dims:
    lines.append(f"    reduced:     {_reduced_text(call)}")
  if getattr(call, "halo_dims", ()):
    lines.append(f"    halo:        {_halo_text(call)}")
  if getattr(call, "scan_dims", ()):
    lines.append(f"    scan:        {_scan_text(call)}")
  lines.append(f"    replication: {_replication_text(call)}")
  return lines


def _type_table(call: Any) -> list[str]:
  """Global and per-device types of a call's operands and results."""
  rows = [("", "shard_map body" if call.in_shard_map else "global", "per device")]
  for i, dtype in enumerate(call.operand_dtypes):
    rows.append((f"operand {i}", _type(dtype, _at(call.global_operand_shapes, i)),
                 _type(dtype, _at(call.device_operand_shapes, i))))
  for i, dtype in enumerate(call.result_dtypes):
    rows.append((f"result {i}", _type(dtype, _at(call.global_result_shapes, i)),
                 _type(dtype, _at(call.device_result_shapes, i))))
  w0 = max(len(r[0]) for r in rows)
  w1 = max(len(r[1]) for r in rows)
  return [f"    {r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}".rstrip() for r in rows]


def _batch_text(call: Any) -> str:
  """The batch dims a call has (where, not how they were declared)."""
  if call.num_batch_dims is None:
    if getattr(call, "single_device", None) is not None:
      return "none declared"
    return "none declared (replication judged over all dims)"
  if call.num_batch_dims == 0:
    return "none"
  if call.leading_core_dims is None:
    return f"{call.num_batch_dims} leading"
  ins, outs = call.leading_core_dims
  return (f"{call.num_batch_dims}, after leading core dims (signature '...'): "
          f"operands {_counts(ins)}, results {_counts(outs)}")


def _replication_text(call: Any) -> str:
  if call.in_shard_map:
    return "n/a (inside shard_map: each device runs the body on its own block)"
  if call.replication is None:
    return "unknown"
  one = getattr(call, "single_device", None)
  if one is not None:
    return (f"{call.replication} (device {one} alone computes every element; the "
            f"other {call.num_devices - 1} devices compute none of it)")
  return (f"{call.replication} (each batch element computed by "
          f"{call.replication} of {call.num_devices} devices"
          + ("; no redundant work)" if call.replication == 1 else ")"))


def _single_device_text(call: Any) -> str:
  """Where a call XLA runs on one device only runs, and what it gathers."""
  text = f"device {call.single_device} only: one call on the whole arrays"
  gathered = sum(c.bytes for c in call.collectives_before if c.kind == "all-gather")
  if gathered:
    text += f", after all-gathering {_bytes(gathered)} per device"
  return text


def _reduced_text(call: Any) -> str:
  """The declared reduced dims and what became of them."""
  parts = []
  for r in call.reduced_dims:
    size = f" (size {r.size})" if r.size is not None else ""
    if r.parts is None:
      where = "split unknown"
    elif r.parts > 1:
      group = "all-gather" if gathers(r.op) else "all-reduce"
      where = f"in {r.parts} parts, one per device of each {group} group"
      if is_combiner(r.op):
        where += f", merged by {merge_text(r.op)}"
    elif call.collectives_before:
      where = ("whole on every device, resharded by the collectives before the call "
               "(a reduced dim stays split only where it splits evenly)")
    else:
      where = "whole on every device"
    parts.append(f"{r.name}{size} by {r.op}, {where}")
  return "; ".join(parts)


def _halo_text(call: Any) -> str:
  """The declared halo dims and what became of them."""
  sent = sum(c.bytes for c in call.collectives_before if getattr(c, "declared_halo", False))
  parts = []
  for h in call.halo_dims:
    size = f" (size {h.size})" if h.size is not None else ""
    window = f"lo {h.lo}, hi {h.hi}" + (
        ", periodic" if h.periodic else f", ends {h.ends}" + (f" {h.cval:g}" if h.cval else "")
        if h.ends else "")
    if h.parts is None:
      where = "split unknown"
    elif h.parts > 1:
      part, last = part_sizes(h.size, h.parts)
      where = (f"in {h.parts} parts of {part}" + (f" (the last {last})" if last != part else "")
               + f", each device's window {h.lo + part + h.hi} elements")
    else:
      where = ("whole on every device (a halo dim stays split only where its last part "
               "holds at least lo + hi)")
    parts.append(f"{h.name}{size}, {window}: {where}")
  text = "; ".join(parts)
  return text + (f"; exchanged by collective-permutes of {_bytes(sent)} per device"
                 if sent else "")


def _scan_text(call: Any) -> str:
  """The declared scanned dim and how its parts get their states."""
  parts = []
  for t in call.scan_dims:
    size = f" (size {t.size})" if t.size is not None else ""
    flow = "from the end" if t.reverse else "from the start"
    if t.parts is None:
      where = "split unknown"
    elif t.parts == 1:
      where = "whole on every device (one pass)"
    elif t.parallel:
      where = (f"in {t.parts} parts of {t.size // t.parts}, parallel: pass 1 from a zero "
               "state, one all-gather of the parts' summaries, a fold, pass 2 from each "
               "part's start (this call is one of the two passes)")
    else:
      where = (f"in {t.parts} parts of {t.size // t.parts}, sequential: the state handed "
               "part to part by collective-permutes")
    moved = f"; {_bytes(t.moved_bytes)} moved per device" if t.moved_bytes else ""
    parts.append(f"{t.name}{size}, state flows {flow}: {where}{moved}")
  return "; ".join(parts)


def _counts(values) -> str:
  return "(" + ", ".join(str(v) for v in values) + ")"
