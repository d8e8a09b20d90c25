"""One description of a batch-partitionable custom call.

Everything the partitioner needs to restate a call on local shapes that XLA
does not hand its callbacks: which dims are batch dims, layouts, aliases and
the side-effect flag. XLA does hand over shapes, shardings and the backend
config (the FFI attributes), so those are not part of it.
"""

from __future__ import annotations

import dataclasses

from batchpart._vocab.declared_dims import DeclaredDims
from batchpart._vocab.dims.batch import normalize_lead_fields
from batchpart._vocab.dims.reduced import lower_combiners
from batchpart._vocab.dims.scan import lower_scans


def default_layout(rank: int) -> tuple[int, ...]:
  """Row-major, minor-to-major: what a call gets when no layout is given."""
  return tuple(range(rank - 1, -1, -1))


@dataclasses.dataclass(frozen=True)
class CallDescription(DeclaredDims):
  """A typed-FFI custom call, as far as partitioning depends on it.

  Layouts are minor-to-major dim orders (XLA's convention); ``aliases`` are
  ``(operand, result)`` pairs; ``attribute_rule`` is the content digest
  of the rule that rewrites FFI attributes per shard ("" for none).
  ``callback_partitions`` > 0 marks a host callback (``bp.pure_callback`` /
  ``bp.io_callback``) in a program over that many partitions: operand 0 is
  its block vector (the block's offsets in the global batch, then the local
  batch shape), which the per-device module fills in per partition, and a
  batch replicated over devices is split across them instead
  (``_vocab/blocks``). ``unit_batch`` marks such a callback with no batch
  dims of its own: its user arrays were given a leading batch dim of size 1,
  so that where XLA would replicate the call one device makes it and the
  others get padding; the call each device makes drops that dim again
  (``without_unit_batch``), so jax's callback target sees the user's shapes.
  ``operand_lead_ranks`` / ``result_lead_ranks``: the core dims before each
  array's batch dims (a signature's ``...`` not in front); ``()`` where all
  are zero, so an array's batch dims are [lead, lead + batch rank).
  """
  target: str
  operand_batch_ranks: tuple[int, ...]
  result_batch_ranks: tuple[int, ...]
  operand_layouts: tuple[tuple[int, ...], ...]
  result_layouts: tuple[tuple[int, ...], ...]
  aliases: tuple[tuple[int, int], ...] = ()
  has_side_effect: bool = False
  attribute_rule: str = ""
  callback_partitions: int = 0
  unit_batch: bool = False
  operand_lead_ranks: tuple[int, ...] = ()
  result_lead_ranks: tuple[int, ...] = ()

  def __post_init__(self):
    normalize_lead_fields(self, len(self.operand_batch_ranks), len(self.result_batch_ranks),
                          f"{self.target}: ")
    if len(self.operand_layouts) != len(self.operand_batch_ranks):
      raise ValueError(f"{self.target}: {len(self.operand_layouts)} operand layouts "
                       f"for {len(self.operand_batch_ranks)} operands")
    if len(self.result_layouts) != len(self.result_batch_ranks):
      raise ValueError(f"{self.target}: {len(self.result_layouts)} result layouts "
                       f"for {len(self.result_batch_ranks)} results")
    for what, layouts in (("operand", self.operand_layouts),
                          ("result", self.result_layouts)):
      for i, layout in enumerate(layouts):
        if sorted(layout) != list(range(len(layout))):
          raise ValueError(f"{self.target}: {what} layout {i} {layout} is not a "
                           "permutation of its dims")
    for i, o in self.aliases:
      if not (0 <= i < len(self.operand_batch_ranks) and
              0 <= o < len(self.result_batch_ranks)):
        raise ValueError(f"{self.target}: alias {i}->{o} is out of range")
    if len({r.op for r in self.reductions}) > 1:
      raise ValueError(f"{self.target}: reductions {self.reductions} do not share one op")
    if len({r.name for r in self.reductions}) != len(self.reductions):
      raise ValueError(f"{self.target}: reductions {self.reductions} name a dim twice")
    reduced_axes: set[tuple[int, int]] = set()
    for r in self.reductions:
      if not r.dims or len({k for k, _ in r.dims}) != len(r.dims):
        raise ValueError(f"{self.target}: reduction {r} must name at most one core axis "
                         "of each operand, and at least one")
      for k, axis in r.dims:
        self._check_core_axis("operand", k, axis, self.operand_batch_ranks,
                              self.operand_leads, self.operand_ranks)
        if (k, axis) in reduced_axes:
          raise ValueError(f"{self.target}: operand {k} core axis {axis} is in two reductions")
        reduced_axes.add((k, axis))
      if len({k for k, _ in r.results}) != len(r.results):
        raise ValueError(f"{self.target}: reduction {r} names one result twice")
      for k, axis in (*r.results, *r.k_dims):
        self._check_core_axis("result", k, axis, self.result_batch_ranks,
                              self.result_leads, self.result_ranks)
      if {k for k, _ in r.k_dims} & {k for k, _ in r.results}:
        raise ValueError(f"{self.target}: reduction {r} holds k in a result that keeps "
                         "the dim")
    if len({n.name for n in self.dim_names}) != len(self.dim_names):
      raise ValueError(f"{self.target}: dim names {self.dim_names} name a dim twice")
    for n in self.dim_names:
      if n.kind == "o":
        what, batch, leads, ranks = ("operand", self.operand_batch_ranks, self.operand_leads,
                                     self.operand_ranks)
      elif n.kind == "r":
        what, batch, leads, ranks = ("result", self.result_batch_ranks, self.result_leads,
                                     self.result_ranks)
      else:
        raise ValueError(f"{self.target}: dim name {n} is neither an operand's nor a "
                         "result's")
      self._check_core_axis(what, n.index, n.axis, batch, leads, ranks)
    self._check_halos()
    self._check_scans()

  def _check_scans(self) -> None:
    """At most one scanned dim, beside no reduced or halo dim; it names a
    core axis of at least one operand, once per array, and the state
    operand and result are in range and lack it."""
    if not self.scans:
      return
    if len(self.scans) > 1 or self.reductions or self.halos:
      raise ValueError(f"{self.target}: scans {self.scans} must be one dim, without "
                       "reduced or halo dims")
    s = self.scans[0]
    k, j = s.state
    if not s.operand_dims or not (0 <= k < len(self.operand_batch_ranks)) or not (
        0 <= j < len(self.result_batch_ranks)):
      raise ValueError(f"{self.target}: scan {s} needs an operand and a state in range")
    for dims in (s.operand_dims, s.result_dims):
      if len({i for i, _ in dims}) != len(dims):
        raise ValueError(f"{self.target}: scan {s} names an array twice")
    if k in dict(s.operand_dims) or j in dict(s.result_dims):
      raise ValueError(f"{self.target}: scan {s}: the state has the scanned dim")
    for i, axis in s.operand_dims:
      self._check_core_axis("operand", i, axis, self.operand_batch_ranks,
                            self.operand_leads, self.operand_ranks)
    for i, axis in s.result_dims:
      self._check_core_axis("result", i, axis, self.result_batch_ranks,
                            self.result_leads, self.result_ranks)

  def _check_halos(self) -> None:
    """Each halo names a core axis of at least one operand and of every
    result, once per array, and no reduced axis."""
    if len({h.name for h in self.halos}) != len(self.halos):
      raise ValueError(f"{self.target}: halos {self.halos} name a dim twice")
    reduced = {pair for r in self.reductions for pair in r.dims}
    for h in self.halos:
      if h.lo < 0 or h.hi < 0 or not h.operand_dims or sorted(
          k for k, _ in h.result_dims) != list(range(len(self.result_batch_ranks))):
        raise ValueError(f"{self.target}: halo {h} must have widths >= 0, an operand and "
                         "every result")
      if len({k for k, _ in h.operand_dims}) != len(h.operand_dims):
        raise ValueError(f"{self.target}: halo {h} names an operand twice")
      for k, axis in h.operand_dims:
        if (k, axis) in reduced:
          raise ValueError(f"{self.target}: operand {k} core axis {axis} is reduced and a "
                           "halo")
        self._check_core_axis("operand", k, axis, self.operand_batch_ranks,
                              self.operand_leads, self.operand_ranks)
      for k, axis in h.result_dims:
        self._check_core_axis("result", k, axis, self.result_batch_ranks,
                              self.result_leads, self.result_ranks)

  def _check_core_axis(self, what, k, axis, batch_ranks, leads, ranks) -> None:
    """Raises unless ``axis`` is a core axis of array ``k``."""
    ok = 0 <= k < len(ranks) and (
        0 <= axis < leads[k] or
        -(ranks[k] - leads[k] - batch_ranks[k]) <= axis < 0)
    if not ok:
      raise ValueError(f"{self.target}: {what} {k} has no core axis {axis}")

  @property
  def operand_leads(self) -> tuple[int, ...]:
    """Each operand's leading core dims (zeros where none)."""
    return self.operand_lead_ranks or (0,) * len(self.operand_batch_ranks)

  @property
  def result_leads(self) -> tuple[int, ...]:
    return self.result_lead_ranks or (0,) * len(self.result_batch_ranks)

  @property
  def operand_ranks(self) -> tuple[int, ...]:
    return tuple(len(l) for l in self.operand_layouts)

  @property
  def result_ranks(self) -> tuple[int, ...]:
    return tuple(len(l) for l in self.result_layouts)


def without_unit_batch(d: CallDescription) -> CallDescription:
  """The call a ``unit_batch`` description's devices make: every array but
  operand 0 (the block vector) without its leading unit batch dim."""
  drop = lambda layout: tuple(a - 1 for a in layout if a != 0)
  return dataclasses.replace(
      d, unit_batch=False,
      operand_batch_ranks=(d.operand_batch_ranks[0],
                           *(b - 1 for b in d.operand_batch_ranks[1:])),
      result_batch_ranks=tuple(b - 1 for b in d.result_batch_ranks),
      operand_layouts=(d.operand_layouts[0], *map(drop, d.operand_layouts[1:])),
      result_layouts=tuple(map(drop, d.result_layouts)))


def describe(target_name, operand_shapes, operand_core_ranks, result_shapes,
             result_core_ranks, *, input_layouts, output_layouts, input_output_aliases,
             has_side_effect, attribute_rule: str = "", operand_lead_ranks=(),
             result_lead_ranks=(), reductions=(), dim_names=(), halos=(),
             result_dtypes=(), scans=(), owner: str = "") -> CallDescription:
  """The description of a call with these shapes and (trailing, leading)
  core ranks; a ``Combiner`` among the reductions, and a parallel scan's
  functions, are lowered on the results' ``result_dtypes``, their errors
  naming ``owner`` (default: the target)."""
  owner = owner or f"'{target_name}'"
  operand_leads = operand_lead_ranks or (0,) * len(operand_shapes)
  result_leads = result_lead_ranks or (0,) * len(result_shapes)
  reductions = lower_combiners(owner, reductions, result_shapes, result_core_ranks,
                               result_leads, result_dtypes)
  scans = lower_scans(owner, scans, result_shapes, result_core_ranks, result_leads,
                      result_dtypes)
  return CallDescription(
      target=target_name,
      operand_batch_ranks=tuple(len(s) - c - lead for s, c, lead in
                                zip(operand_shapes, operand_core_ranks, operand_leads)),
      result_batch_ranks=tuple(len(s) - c - lead for s, c, lead in
                               zip(result_shapes, result_core_ranks, result_leads)),
      operand_lead_ranks=tuple(operand_lead_ranks),
      result_lead_ranks=tuple(result_lead_ranks),
      operand_layouts=tuple(map(tuple, input_layouts)),
      result_layouts=tuple(map(tuple, output_layouts)),
      aliases=tuple(sorted(map(tuple, input_output_aliases))),
      has_side_effect=bool(has_side_effect),
      attribute_rule=attribute_rule,
      reductions=tuple(reductions),
      dim_names=tuple(dim_names),
      halos=tuple(halos),
      scans=tuple(scans),
  )
