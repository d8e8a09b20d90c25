"""The derived target name: a call's description written into its name.

XLA hands the partitioner callbacks a call's shapes, shardings and backend
config, but not its frontend attributes, and a partitioner is registered per
target name. So a batchpart call that XLA will partition is emitted under a
name derived from the user's target and its description; the callbacks
registered for that name have the description bound, and nothing is looked
up at partition time. Where XLA will not partition (one device, a fully
manual region) the call keeps the user's name and carries its derived name in
the frontend attribute ``FRONTEND_ATTRIBUTE`` (for ``bp.explain`` and for
modules exported there and called sharded later).

The name is ``<target>$bp1`` followed by fields, each starting with ``$``:

- ``$o<r>,<r>,...``: operand batch ranks; ``$r<r>,...``: result batch ranks
- ``$lo<i>:<d>.<d>...`` / ``$lr<i>:...``: a non-default (minor-to-major)
  layout of operand / result ``i``, one field each; ranks follow from them
  and from ``$no`` / ``$nr`` (the ranks of operands / results with default
  layouts, in order: ``$no2,1``)
- ``$po<r>,<r>,...`` / ``$pr<r>,...``: the operands' / results' leading core
  dims, before their batch dims (a signature's ``...`` not in front); only
  where some are nonzero, so calls with leading batch dims keep their names
- ``$a<i>:<j>``: operand ``i`` aliases result ``j``
- ``$s``: the call has a side effect
- ``$c<n>``: a host callback in a program of ``n`` partitions; operand 0 is
  its block vector, filled in per partition (``batchpart/_vocab/blocks``)
- ``$u``: that callback has no batch dims of its own; its arrays' leading
  batch dim of size 1 is batchpart's (``CallDescription.unit_batch``)
- ``$x:<name>=<op>:<operand>.<axis>,...``: a reduced core dim, the op that
  combines the results over its parts (``sum``, ``max``, ``min`` or a named
  combiner: ``argmax``, ``argmin``, ``max_k``, ``min_k``, ``logsumexp``, or
  ``merge_<digest>`` for a ``bp.Combiner``), and its core axis in each
  operand that has it (``>= 0`` leading, ``< 0`` trailing), one field per dim;
  then ``:r<result>.<axis>,...`` where results keep the dim, and
  ``:k<result>.<axis>,...`` where a ``max_k`` / ``min_k``'s results hold k
- ``$k:<name>=<o|r><index>.<axis>``: where a named core dim first appears
  (for a per-shard attribute rule's core sizes), one field per name
- ``$h:<name>=<lo>.<hi>[.<ends>]:<operand>.<axis>,...:<result>.<axis>,...``: a
  halo dim, its window, its stated ends (``.p``: periodic, ``.nearest``,
  ``.reflect``, ``.mirror``, ``.constant~<cval>``; none: unstated) and its
  core axis in each operand and each result that has it, one field per dim
- ``$t:<name>=<k>.<j>[.r][.scan_<digest>]:<operand>.<axis>,...:<result>.<axis>,...``:
  the scanned dim, its state operand ``k`` and result ``j``, ``.r`` where the
  state flows from the end, the lowered merge of a parallel scan (none:
  sequential), and its core axis in each operand and each result that has
  it (the results' list may be empty)
- ``$f=<digest>``: the content digest of the per-shard attribute rule
  (``rule_digest``): a changed rule gives a new name, hence a new partition
  cache entry and a new persistent-compilation-cache key

Example: ``my_softmax$bp1$o1$r1,1$no2$nr2,1``. The name is readable in HLO,
and ``decode`` inverts ``encode`` exactly (unit-tested).
"""

from __future__ import annotations

import re

from batchpart._vocab.description import CallDescription, default_layout
from batchpart._vocab.dims.core import DimName
from batchpart._vocab.dims.halo import HaloDim
from batchpart._vocab.dims.reduced import ALL_OPS, Reduction
from batchpart._vocab.dims.scan import ScanDim
from batchpart._vocab.dims.user_combiner import is_user_combiner

MARKER = "$bp1"
FRONTEND_ATTRIBUTE = "batchpart.derived_name"
_FIELD = re.compile(r"\$([a-z]+)([^$]*)")
_RULE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_PAIRS = r"-?\d+\.-?\d+(?:,-?\d+\.-?\d+)*"
_REDUCTION = re.compile(rf"^:(\w+)=(\w+):({_PAIRS})(?::r({_PAIRS}))?(?::k({_PAIRS}))?$")
_HALO = re.compile(rf"^:(\w+)=(\d+)\.(\d+)(?:\.(p|nearest|reflect|mirror|constant~[^:]+))?"
                   rf":({_PAIRS}):({_PAIRS})$")
_SCAN = re.compile(
    rf"^:(\w+)=(\d+)\.(\d+)(\.r)?(?:\.(scan_[0-9a-f]{{16}}))?:({_PAIRS}):({_PAIRS})?$")
_DIM_NAME = re.compile(r"^:(\w+)=([or])(\d+)\.(-?\d+)$")


def _ints(values, sep=",") -> str:
  return sep.join(str(int(v)) for v in values)


def encode(d: CallDescription) -> str:
  """The derived target name of a call."""
  if d.attribute_rule and not _RULE_NAME.match(d.attribute_rule):
    raise ValueError(f"attribute rule name {d.attribute_rule!r} must match "
                     f"{_RULE_NAME.pattern}")
  fields = [f"$o{_ints(d.operand_batch_ranks)}", f"$r{_ints(d.result_batch_ranks)}"]
  for kind, layouts in (("o", d.operand_layouts), ("r", d.result_layouts)):
    fields.append(f"$n{kind}" + _ints(len(l) for l in layouts))
    for i, layout in enumerate(layouts):
      if tuple(layout) != default_layout(len(layout)):
        fields.append(f"$l{kind}{i}:{_ints(layout, '.')}")
  if d.operand_lead_ranks:
    fields.append(f"$po{_ints(d.operand_lead_ranks)}")
  if d.result_lead_ranks:
    fields.append(f"$pr{_ints(d.result_lead_ranks)}")
  fields += [f"$a{i}:{o}" for i, o in sorted(d.aliases)]
  fields += [f"$x:{r.name}={r.op}:{_write_pairs(r.dims)}"
             + (f":r{_write_pairs(r.results)}" if r.results else "")
             + (f":k{_write_pairs(r.k_dims)}" if r.k_dims else "")
             for r in d.reductions]
  fields += [f"$h:{h.name}={h.lo}.{h.hi}{_ends_text(h)}"
             f":{_write_pairs(h.operand_dims)}:{_write_pairs(h.result_dims)}" for h in d.halos]
  fields += [f"$t:{t.name}={t.state[0]}.{t.state[1]}{'.r' if t.reverse else ''}"
             f"{'.' + str(t.fold) if t.fold else ''}"
             f":{_write_pairs(t.operand_dims)}:{_write_pairs(t.result_dims)}" for t in d.scans]
  fields += [f"$k:{n.name}={n.kind}{n.index}.{n.axis}" for n in d.dim_names]
  if d.has_side_effect:
    fields.append("$s")
  if d.callback_partitions:
    fields.append(f"$c{int(d.callback_partitions)}")
  if d.unit_batch:
    fields.append("$u")
  if d.attribute_rule:
    fields.append(f"$f={d.attribute_rule}")
  return d.target + MARKER + "".join(fields)


def _ends_text(h) -> str:
  """A halo dim's stated ends in its field (empty where unstated)."""
  if h.ends is None:
    return ""
  if h.periodic:
    return ".p"
  return f".constant~{h.cval!r}" if h.ends == "constant" else f".{h.ends}"


def _halo_dim(m) -> HaloDim:
  """The halo dim a ``$h`` field's match holds."""
  ends, cval = m.group(4), 0.0
  if ends and ends.startswith("constant~"):
    ends, cval = "constant", float(ends[len("constant~"):])
  if ends == "p":
    ends = "wrap"
  return HaloDim(m.group(1), int(m.group(2)), int(m.group(3)), ends == "wrap",
                 _read_pairs(m.group(5)), _read_pairs(m.group(6)), ends, cval)


def _write_pairs(dims) -> str:
  """(array, axis) pairs as ``k.axis,...``."""
  return ",".join(f"{k}.{axis}" for k, axis in dims)


def _read_pairs(text: str) -> tuple[tuple[int, int], ...]:
  """``k.axis,...`` (or nothing) as (array, axis) pairs."""
  return tuple((int(k), int(a)) for k, a in (p.split(".") for p in text.split(",") if p))


def is_derived(name: str) -> bool:
  return MARKER + "$" in name


def user_target(name: str) -> str:
  """The target the user wrote, for a derived name; other names unchanged."""
  i = name.rfind(MARKER + "$")
  return name if i < 0 else name[:i]


def decode(name: str) -> CallDescription:
  """The description a derived name carries.

  Raises:
    ValueError: naming the target, if ``name`` is not a derived name this
      version of batchpart wrote.
  """
  i = name.rfind(MARKER + "$")
  if i <= 0:
    raise ValueError(f"'{name}' is not a batchpart derived target name")
  target, body = name[:i], name[i + len(MARKER):]
  try:
    return _decode_fields(target, body)
  except (ValueError, IndexError, KeyError) as e:
    raise ValueError(f"batchpart: cannot read the derived target name '{name}' of FFI "
                     f"target '{target}': {e}") from None


def _parse_ints(text: str, sep=",") -> tuple[int, ...]:
  return tuple(int(v) for v in text.split(sep)) if text else ()


def _decode_fields(target: str, body: str) -> CallDescription:
  if "".join(m.group(0) for m in _FIELD.finditer(body)) != body:
    raise ValueError("malformed fields")
  values: dict[str, str] = {}
  layouts: dict[str, dict[int, tuple[int, ...]]] = {"o": {}, "r": {}}
  aliases, side_effect, rule, callback_partitions, unit_batch = [], False, "", 0, False
  reductions, dim_names, halos, scans = [], [], [], []
  for m in _FIELD.finditer(body):
    tag, value = m.group(1), m.group(2)
    if tag in ("o", "r", "no", "nr", "po", "pr"):
      if tag in values:
        raise ValueError(f"field ${tag} given twice")
      values[tag] = value
    elif tag in ("lo", "lr"):
      index, dims = value.split(":")
      layouts[tag[1]][int(index)] = _parse_ints(dims, ".")
    elif tag == "a":
      operand, result = value.split(":")
      aliases.append((int(operand), int(result)))
    elif tag == "s" and not value:
      side_effect = True
    elif tag == "c" and value.isdigit() and int(value) > 0:
      callback_partitions = int(value)
    elif tag == "u" and not value:
      unit_batch = True
    elif tag == "f" and value.startswith("=") and _RULE_NAME.match(value[1:]):
      rule = value[1:]
    elif tag == "x" and (x := _REDUCTION.match(value)) and (
        x.group(2) in ALL_OPS or is_user_combiner(x.group(2))):
      reductions.append(Reduction(x.group(1), x.group(2), _read_pairs(x.group(3)),
                                  _read_pairs(x.group(4) or ""),
                                  _read_pairs(x.group(5) or "")))
    elif tag == "h" and (h := _HALO.match(value)):
      halos.append(_halo_dim(h))
    elif tag == "t" and (t := _SCAN.match(value)):
      scans.append(ScanDim(t.group(1), (int(t.group(2)), int(t.group(3))), bool(t.group(4)),
                           _read_pairs(t.group(6)), _read_pairs(t.group(7) or ""),
                           t.group(5) or ""))
    elif tag == "k" and (k := _DIM_NAME.match(value)):
      dim_names.append(DimName(k.group(1), k.group(2), int(k.group(3)), int(k.group(4))))
    else:
      raise ValueError(f"unknown field ${tag}{value}")
  for tag in ("o", "r", "no", "nr"):
    if tag not in values:
      raise ValueError(f"field ${tag} missing")

  def full_layouts(kind: str) -> tuple[tuple[int, ...], ...]:
    ranks = _parse_ints(values["n" + kind])
    given = layouts[kind]
    if any(not 0 <= i < len(ranks) for i in given):
      raise ValueError(f"layout index out of range for {len(ranks)} arrays")
    return tuple(given.get(i, default_layout(r)) for i, r in enumerate(ranks))

  operand_ranks = _parse_ints(values["o"])
  result_ranks = _parse_ints(values["r"])
  operand_layouts, result_layouts = full_layouts("o"), full_layouts("r")
  operand_leads = _parse_ints(values.get("po", ""))
  result_leads = _parse_ints(values.get("pr", ""))
  for batch, leads, layouts_ in ((operand_ranks, operand_leads, operand_layouts),
                                 (result_ranks, result_leads, result_layouts)):
    if leads and (len(leads) != len(batch) or not any(leads)):
      raise ValueError("lead ranks do not fit the arrays")
    leads = leads or (0,) * len(batch)
    if len(batch) != len(layouts_) or any(
        not (0 <= b and 0 <= p and b + p <= len(l))
        for b, p, l in zip(batch, leads, layouts_)):
      raise ValueError("batch ranks do not fit the arrays' ranks")
  return CallDescription(
      target=target,
      operand_batch_ranks=operand_ranks,
      result_batch_ranks=result_ranks,
      operand_layouts=operand_layouts,
      result_layouts=result_layouts,
      aliases=tuple(sorted(aliases)),
      has_side_effect=side_effect,
      attribute_rule=rule,
      callback_partitions=callback_partitions,
      unit_batch=unit_batch,
      operand_lead_ranks=operand_leads,
      result_lead_ranks=result_leads,
      reductions=tuple(reductions),
      dim_names=tuple(dim_names),
      halos=tuple(halos),
      scans=tuple(scans),
  )
