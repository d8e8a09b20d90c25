"""Batch specs from what the user declares: ``num_batch_dims=k`` or a gufunc
``signature`` (the spec itself and its checks live in
``_vocab/batch_spec``).

Everything here is checked before anything is traced, so bad input fails
with a message naming the FFI target and the offending argument.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from batchpart._vocab.batch_spec import BatchSpec, broadcast_batch_shapes, fmt as _fmt
from batchpart._vocab.dims.core import DimName
from batchpart._vocab.dims.halo import HaloDim, check_halo_mapping
from batchpart._vocab.dims.named_combiners import TOP_K_COMBINERS
from batchpart._vocab.dims.reduced import Reduction, check_kept_whole, check_reduce_mapping
from batchpart._vocab.dims.scan import ScanDim, check_scan_mapping

_DIM = r"\s*(?:\w+|\.\.\.)\s*"
_CORE = rf"\(\s*(?:{_DIM}(?:,{_DIM})*)?,?\s*\)"
_CORES = rf"{_CORE}(?:\s*,\s*{_CORE})*"
_SIGNATURE = re.compile(rf"^\s*(?P<ins>(?:{_CORES})?)\s*->\s*(?P<outs>(?:{_CORES})?)\s*$")

ELLIPSIS = "..."


@dataclasses.dataclass(frozen=True)
class Signature:
  """A parsed gufunc signature: core dim names (or sizes) per argument."""
  inputs: tuple[tuple[str, ...], ...]
  outputs: tuple[tuple[str, ...], ...]

  def spec(self, reductions: tuple[Reduction, ...] = (), named: bool = False,
           halos: tuple[HaloDim, ...] = (), scans: tuple[ScanDim, ...] = ()) -> BatchSpec:
    """The core dims before (lead) and after each group's ``...``; without
    one, every core dim trails and the batch dims lead. With ``reductions``
    (from ``reductions``), or ``named`` (a per-shard attribute rule that
    reads core sizes), the spec also says where each named core dim is."""
    place = lambda groups: [_split(g) for g in groups]
    ins, outs = place(self.inputs), place(self.outputs)
    return BatchSpec(tuple(len(t) for _, t in ins), tuple(len(t) for _, t in outs),
                     tuple(len(lead) for lead, _ in ins),
                     tuple(len(lead) for lead, _ in outs),
                     reductions=tuple(reductions), halos=tuple(halos), scans=tuple(scans),
                     dim_names=self.dim_names() if reductions or named else ())

  def result_layouts(self) -> list[tuple[int, int]]:
    """Each result's core dims before and after its ``...``: ``(lead, core)``."""
    return [(len(lead), len(trail)) for lead, trail in map(_split, self.outputs)]

  def dim_names(self) -> tuple[DimName, ...]:
    """Each named (not numeric) core dim where it first appears, operands
    first."""
    seen: dict[str, DimName] = {}
    for kind, groups in (("o", self.inputs), ("r", self.outputs)):
      for i, group in enumerate(groups):
        for name, axis in _core_axes(group):
          if not name.isdigit():
            seen.setdefault(name, DimName(name, kind, i, axis))
    return tuple(seen.values())

  def reductions(self, reduce, *, owner: str) -> tuple[Reduction, ...]:
    """The checked ``reduce={name: op}`` of a call with this signature: each
    name a core dim of at least one operand, at most once per operand or
    result; a result that has it keeps it (``Reduction.results``)."""
    if reduce is None:
      return ()
    reduce = check_reduce_mapping(owner, reduce)
    out = []
    for name, op in reduce.items():
      where = [(i, axis) for i, group in enumerate(self.inputs)
               for n, axis in _core_axes(group) if n == name]
      kept = [(i, axis) for i, group in enumerate(self.outputs)
              for n, axis in _core_axes(group) if n == name]
      problem = None
      if name.isdigit() or name == ELLIPSIS:
        problem = "is not a named core dim"
      elif not where:
        problem = "is not a core dim of any operand"
      elif len({i for i, _ in where}) != len(where):
        problem = "appears twice in one operand"
      elif len({i for i, _ in kept}) != len(kept):
        problem = "appears twice in one result"
      if problem:
        raise ValueError(f"{owner}: reduce names the dim '{name}', which {problem} "
                         f"(signature '{self}').")
      out.append(Reduction(name, op, tuple(where), tuple(kept),
                           self._k_dims(name, op, {i for i, _ in kept}, owner=owner)))
    check_kept_whole(owner, out)
    return tuple(out)

  def _k_dims(self, name: str, op, kept, *, owner: str) -> tuple[tuple[int, int], ...]:
    """For ``max_k`` / ``min_k``: where each combining result holds its k
    candidates, the one core dim of it that no operand has."""
    if op not in TOP_K_COMBINERS:
      return ()
    operand_dims = {n for group in self.inputs for n in group}
    out = []
    for i, group in enumerate(self.outputs):
      fresh = [(n, axis) for n, axis in _core_axes(group) if n not in operand_dims]
      if i in kept or not fresh:
        continue
      if len(fresh) > 1:
        raise ValueError(
            f"{owner}: reduce {{{name!r}: {op!r}}}: result {i} has the core dims "
            f"{', '.join(n for n, _ in fresh)}, which no operand has; which one holds the "
            f"k candidates cannot be told: give the result one such dim (signature "
            f"'{self}').")
      out.append((i, fresh[0][1]))
    values = next((i for i in range(len(self.outputs)) if i not in kept), None)
    if values is not None and values not in dict(out):
      raise ValueError(
          f"{owner}: reduce {op!r} over the dim(s) {name}: result {values} (the values) has "
          "no core dim k that no operand has, to hold each part's k candidates; declare it "
          f"in the signature, e.g. '(n)->(k),(k)' (signature '{self}').")
    return tuple(out)

  def halos(self, halo, reductions, *, owner: str) -> tuple[HaloDim, ...]:
    """The checked ``halo={name: width}`` of a call with this signature: each
    name a core dim of at least one operand and of every result, at most
    once per array, and not reduced."""
    if halo is None:
      return ()
    out = []
    reduced = {r.name for r in reductions}
    for name, h in check_halo_mapping(owner, halo).items():
      where = {kind: [(i, axis) for i, group in enumerate(groups)
                      for n, axis in _core_axes(group) if n == name]
               for kind, groups in (("o", self.inputs), ("r", self.outputs))}
      missing = [i for i, group in enumerate(self.outputs)
                 if not any(n == name for n, _ in _core_axes(group))]
      problem = None
      if name.isdigit() or name == ELLIPSIS:
        problem = "is not a named core dim"
      elif name in reduced:
        problem = ("is also reduced (reduce=); a halo dim is kept by every result, a "
                   "reduced dim by none")
      elif not where["o"]:
        problem = "is not a core dim of any operand"
      elif missing:
        problem = (f"is missing from result {missing[0]}; every result keeps a halo dim, "
                   "with the operands' size")
      elif any(len({i for i, _ in w}) != len(w) for w in where.values()):
        problem = "appears twice in one array"
      if problem:
        raise ValueError(f"{owner}: halo names the dim '{name}', which {problem} "
                         f"(signature '{self}').")
      out.append(HaloDim(name, h.lo, h.hi, h.periodic, tuple(where["o"]),
                         tuple(where["r"]), h.ends, h.cval))
    return tuple(out)

  def scans(self, scan, reductions, halos, *, owner: str) -> tuple[ScanDim, ...]:
    """The checked ``scan={name: Scan(...)}`` of a call with this signature:
    the name a core dim of at least one operand, at most once per array,
    neither reduced nor a halo; the state operand and result without it;
    without a merge, every other result has it (a per-step result)."""
    if scan is None:
      return ()
    out = []
    taken = {r.name for r in reductions} | {h.name for h in halos}
    for name, sc in check_scan_mapping(owner, scan).items():
      where = {kind: [(i, axis) for i, group in enumerate(groups)
                      for n, axis in _core_axes(group) if n == name]
               for kind, groups in (("o", self.inputs), ("r", self.outputs))}
      k, j = sc.state
      problem = None
      if name.isdigit() or name == ELLIPSIS:
        problem = "is not a named core dim"
      elif taken:
        problem = ("is declared with reduce= or halo= as well; a call with a scanned dim "
                   "declares no reduced or halo dims")
      elif not where["o"]:
        problem = "is not a core dim of any operand"
      elif any(len({i for i, _ in w}) != len(w) for w in where.values()):
        problem = "appears twice in one array"
      elif k >= len(self.inputs):
        problem = f"starts from operand {k}, but the call has {len(self.inputs)} operands"
      elif j >= len(self.outputs):
        problem = f"ends in result {j}, but the call has {len(self.outputs)} results"
      elif any(i == k for i, _ in where["o"]):
        problem = (f"is a dim of the state operand {k}; the state the call starts from "
                   "has no scanned dim")
      elif any(i == j for i, _ in where["r"]):
        problem = (f"is a dim of the state result {j}; the state the call ends in has no "
                   "scanned dim")
      elif not sc.parallel and (missing := [
          i for i in range(len(self.outputs))
          if i != j and all(r != i for r, _ in where["r"])]):
        problem = (f"is missing from result {missing[0]}; without a merge every result "
                   "but the state is a per-step result, with the scanned dim")
      if problem:
        raise ValueError(f"{owner}: scan names the dim '{name}', which {problem} "
                         f"(signature '{self}').")
      out.append(ScanDim(name, sc.state, sc.reverse, tuple(where["o"]), tuple(where["r"]),
                         sc if sc.parallel else ""))
    return tuple(out)

  def __str__(self):
    fmt = lambda cores: ",".join("(" + ",".join(c) + ")" for c in cores)
    return f"{fmt(self.inputs)}->{fmt(self.outputs)}"


def _split(group: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """A group's core dims before and after its ``...`` (none before without one)."""
  if ELLIPSIS not in group:
    return (), group
  i = group.index(ELLIPSIS)
  return group[:i], group[i + 1:]


def _core_axes(group: tuple[str, ...]) -> list[tuple[str, int]]:
  """Each core dim of a group with its core axis: ``>= 0`` before the
  ``...``, negative (from the end) after it."""
  lead, trail = _split(group)
  return ([(n, j) for j, n in enumerate(lead)] +
          [(n, j - len(trail)) for j, n in enumerate(trail)])


def parse_signature(signature: str, *, owner: str) -> Signature:
  if not isinstance(signature, str) or not _SIGNATURE.match(signature):
    raise ValueError(
        f"{owner}: signature={signature!r} is not a "
        "gufunc signature like '(m,n),(n)->(m)' (one parenthesised, "
        "comma-separated group of core dims per operand and per result, with "
        "'...' where batch dims are not leading: '(a,...,n)->(...,n)').")
  ins, outs = signature.split("->")

  def groups(text: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(d.strip() for d in g.split(",") if d.strip())
                 for g in re.findall(r"\(([^)]*)\)", text))

  parsed = Signature(groups(ins), groups(outs))
  for group in parsed.inputs + parsed.outputs:
    if group.count(ELLIPSIS) > 1:
      raise ValueError(
          f"{owner}: signature={signature!r} has more than one '...' in the group "
          f"({','.join(group)}); '...' marks where that array's batch dims are, once.")
  return parsed


def batch_rank(owner: str, num_batch_dims) -> int:
  """``num_batch_dims`` as an int: any integer type (``np.int64(1)``), not a
  bool."""
  if isinstance(num_batch_dims, (bool, np.bool_)) or not isinstance(
      num_batch_dims, (int, np.integer)) or num_batch_dims < 0:
    raise ValueError(f"{owner}: num_batch_dims must be a non-negative int, got "
                     f"{num_batch_dims!r}.")
  return int(num_batch_dims)


def spec_from_num_batch_dims(owner: str, num_batch_dims, operand_shapes,
                             result_shapes) -> BatchSpec:
  k = batch_rank(owner, num_batch_dims)
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if len(shape) < k:
        raise ValueError(
            f"{owner}: num_batch_dims={k} exceeds the "
            f"rank of {what} {i} with shape {_fmt(shape)}.")
  batch = tuple(operand_shapes[0][:k]) if operand_shapes else None
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if batch is not None and tuple(shape[:k]) != batch:
        raise ValueError(
            f"{owner}: with num_batch_dims={k} every "
            f"operand and result must have the same leading {k} dims; {what} {i} "
            f"has shape {_fmt(shape)}, operand 0 has batch shape {_fmt(batch)}. "
            "Use signature=... for operands whose batch dims broadcast.")
  return BatchSpec(tuple(len(s) - k for s in operand_shapes),
                   tuple(len(s) - k for s in result_shapes))


def parse_declaration(owner: str, num_batch_dims, signature, reduce=None, *, halo=None,
                      scan=None) -> tuple[Signature | None, tuple[Reduction, ...],
                                          tuple[HaloDim, ...], tuple[ScanDim, ...]]:
  """The checked batch declaration of an entry point: exactly one of
  ``num_batch_dims`` and ``signature``, the signature parsed (None with
  ``num_batch_dims``), and its ``reduce=``, ``halo=`` and ``scan=`` (which
  name core dims, so only a signature declares them)."""
  if (num_batch_dims is None) == (signature is None):
    raise ValueError(f"{owner}: pass exactly one of num_batch_dims and signature "
                     f"(got num_batch_dims={num_batch_dims!r}, signature={signature!r}).")
  parsed = None if signature is None else parse_signature(signature, owner=owner)
  for option, value, example in (
      ("reduce", reduce, "signature='(n),(n)->()', reduce={'n': 'sum'}"),
      ("halo", halo, "signature='(n)->(n)', halo={'n': 1}"),
      ("scan", scan, "signature='(t),()->(t),()', scan={'t': bp.Scan(state=(1, 1))}")):
    if value is not None and parsed is None:
      raise ValueError(
          f"{owner}: {option}={value!r} names core dims, which only a signature declares; "
          f"pass signature=... (e.g. {example}) instead of num_batch_dims.")
  if parsed is None:
    return None, (), (), ()
  reductions = parsed.reductions(reduce, owner=owner)
  halos = parsed.halos(halo, reductions, owner=owner)
  return parsed, reductions, halos, parsed.scans(scan, reductions, halos, owner=owner)


def declared_spec(owner: str, signature: Signature | None, num_batch_dims,
                  operand_shapes, result_shapes, reductions: tuple[Reduction, ...] = (),
                  halos: tuple[HaloDim, ...] = (), scans: tuple[ScanDim, ...] = ()
                  ) -> BatchSpec:
  """The batch spec a parsed declaration gives operands and results of these
  shapes."""
  if signature is None:
    return spec_from_num_batch_dims(owner, num_batch_dims, operand_shapes, result_shapes)
  return spec_from_signature(owner, signature, operand_shapes, result_shapes, reductions,
                             halos, scans)


# jax's vmap_method values (jax.ffi.ffi_call, jax.pure_callback).
_VMAP_METHODS = (None, "sequential", "sequential_unrolled", "expand_dims",
                 "broadcast_all", "legacy_vectorized")


def check_vmap_method(owner: str, vmap_method, jax_function: str) -> None:
  """``vmap_method`` is one of ``jax_function``'s values: accepted for
  compatibility, though the declared batch dims define vmap either way."""
  if vmap_method not in _VMAP_METHODS:
    raise ValueError(
        f"{owner}: vmap_method={vmap_method!r} is not one of {_VMAP_METHODS[1:]} "
        f"({jax_function}'s values; batchpart's declared batch dims define vmap either "
        "way).")


def spec_from_signature(owner: str, signature: Signature, operand_shapes,
                        result_shapes, reductions: tuple[Reduction, ...] = (),
                        halos: tuple[HaloDim, ...] = (), scans: tuple[ScanDim, ...] = ()
                        ) -> BatchSpec:
  if len(signature.inputs) != len(operand_shapes):
    raise ValueError(
        f"{owner}: signature '{signature}' names "
        f"{len(signature.inputs)} operands but the call got {len(operand_shapes)}.")
  if len(signature.outputs) != len(result_shapes):
    raise ValueError(
        f"{owner}: signature '{signature}' names "
        f"{len(signature.outputs)} results but result_shape_dtypes has "
        f"{len(result_shapes)}.")
  sizes: dict[str, tuple[int, str]] = {}

  def bind(what: str, i: int, shape, group) -> tuple[int, ...]:
    lead, trail = _split(group)
    cores = lead + trail
    if len(shape) < len(cores):
      raise ValueError(
          f"{owner}: {what} {i} has shape {_fmt(shape)}, "
          f"rank {len(shape)}, below the {len(cores)} core dims "
          f"({','.join(cores)}) of signature '{signature}'.")
    core_shape = tuple(shape[:len(lead)]) + tuple(shape[len(shape) - len(trail):])
    for name, size in zip(cores, core_shape):
      expected = int(name) if name.isdigit() else sizes.get(name, (size, ""))[0]
      if size != expected:
        where = sizes.get(name, (None, "the signature"))[1]
        raise ValueError(
            f"{owner}: core dim '{name}' of {what} {i} "
            f"(shape {_fmt(shape)}) has size {size}, but {where} fixes it at "
            f"{expected} (signature '{signature}').")
      if not name.isdigit():
        sizes.setdefault(name, (size, f"{what} {i} (shape {_fmt(shape)})"))
    return tuple(shape[len(lead):len(shape) - len(trail)])

  batch_shapes = [bind("operand", i, s, c)
                  for i, (s, c) in enumerate(zip(operand_shapes, signature.inputs))]
  batch = broadcast_batch_shapes(owner, batch_shapes)
  for i, (shape, cores) in enumerate(zip(result_shapes, signature.outputs)):
    result_batch = bind("result", i, shape, cores)
    if result_batch != batch:
      raise ValueError(
          f"{owner}: result {i} has shape {_fmt(shape)}; "
          f"its batch dims {_fmt(result_batch)} must equal the operands' broadcast "
          f"batch shape {_fmt(batch)} (signature '{signature}').")
  return signature.spec(reductions, halos=halos, scans=scans)
