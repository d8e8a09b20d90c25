"""Scanned dims: ``scan={"t": Scan(state=(k, j), merge=None, apply=None,
reverse=False)}``.

A scanned dim is a core dim along which a call carries a state: operand
``k`` is the state the call starts from and result ``j`` the state it ends
in (neither has the dim; one shape and dtype). The contract: running the
call on ``[0, T)`` from state ``s`` gives the same per-step results and
final state as running it on ``[0, m)`` from ``s`` and then on ``[m, T)``
from the first run's final state, for every ``m``. The results without the
dim are a part's *summary*.

Where the dim is split, the per-device module either runs two passes
(``merge`` given: each part from a zero state, one all-gather of the
summaries, a fold, each part again from its true state) or hands the state
from part to part (no ``merge``). ``reverse``: the state flows from the end.

A scan's merge and apply are identified by what they compute: when a call
is lowered they are lowered on one element's summary and state and the
digest of that text names them (``scan_<digest>`` in the derived name); the
per-device module looks them up by that digest (``registered``), and an
exported program carries them (``lowered_functions``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping

import jax
import numpy as np

from batchpart._vocab.dims.core import absolute_dim, core_shape
from batchpart._vocab.dims.halo import HaloDim
from batchpart._vocab.lowered_functions import (
  Registry,
  check_closure,
  check_same,
  export_batched,
  fmt,
  lowered_text,
  restore_batched,
)

OP_PREFIX = "scan_"


@dataclasses.dataclass(frozen=True)
class Scan:
  """A scanned dim's state and how parts compose.

  Args:
    state: ``(k, j)``: operand ``k`` is the state the call starts from,
      result ``j`` the state it ends in (one shape and dtype, neither with
      the scanned dim).
    merge: None (sequential: the state is handed from part to part), or
      ``merge(a, b) -> c`` composing the summaries of two consecutive parts
      (``a`` the earlier; each a tuple of one batch element's results
      without the scanned dim, in result order): associative, in
      ``jax.numpy``.
    apply: ``apply(summary, state) -> state``: the state after a stretch
      with that summary, entered with ``state``. Default (where the summary
      is the final state alone): ``merge((state,), summary)[0]``.
    reverse: the state flows from the end of the dim to its start.
  """
  state: tuple[int, int]
  merge: Callable | None = None
  apply: Callable | None = None
  reverse: bool = False

  def __post_init__(self):
    state = self.state
    if (not isinstance(state, (tuple, list)) or len(state) != 2 or any(
        isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 for v in state)):
      raise TypeError(f"batchpart.Scan: state must be a pair (k, j) of an operand and a "
                      f"result index, got {state!r}.")
    object.__setattr__(self, "state", (int(state[0]), int(state[1])))
    for field in ("merge", "apply"):
      value = getattr(self, field)
      if value is not None and not callable(value):
        raise TypeError(f"batchpart.Scan: {field} must be callable or None, got "
                        f"{type(value).__name__}.")
    if self.apply is not None and self.merge is None:
      raise ValueError("batchpart.Scan: apply needs a merge; without one the scan is "
                       "sequential and the state itself is handed on.")
    object.__setattr__(self, "reverse", bool(self.reverse))

  @property
  def parallel(self) -> bool:
    return self.merge is not None

  def __repr__(self):
    name = lambda f: None if f is None else getattr(f, "__qualname__", type(f).__name__)
    fns = "".join(f", {k}={name(getattr(self, k))}" for k in ("merge", "apply")
                  if getattr(self, k) is not None)
    return f"Scan(state={self.state}{fns}{', reverse=True' if self.reverse else ''})"


@dataclasses.dataclass(frozen=True)
class ScanDim:
  """One declared scanned dim: its name, the state operand and result, the
  direction, where each operand and result that has it holds it
  (``(array, core axis)`` pairs) and ``fold``: the ``Scan`` (parallel,
  before lowering), its lowered name ``scan_<digest>`` (after), or ``""``
  (sequential)."""
  name: str
  state: tuple[int, int]
  reverse: bool
  operand_dims: tuple[tuple[int, int], ...]
  result_dims: tuple[tuple[int, int], ...]
  fold: Scan | str = ""

  @property
  def parallel(self) -> bool:
    return self.fold != ""

  def summary_results(self, num_results: int) -> list[int]:
    """The results without the dim (the state result among them), in order."""
    per_step = {k for k, _ in self.result_dims}
    return [k for k in range(num_results) if k not in per_step]


def as_halos(scans) -> tuple[HaloDim, ...]:
  """Each scanned dim as a halo dim of width 0: where the planner and the
  sharding rule are concerned, the dim stays split on the arrays that have
  it, and the state (which lacks it) is replicated over its parts."""
  return tuple(HaloDim(s.name, 0, 0, False, s.operand_dims, s.result_dims) for s in scans)


def check_scan_mapping(owner: str, scan) -> dict[str, Scan]:
  """``scan`` as a dict of dim name -> ``Scan``, checked for shape."""
  if not isinstance(scan, Mapping) or not all(isinstance(k, str) for k in scan) or not all(
      isinstance(v, Scan) for v in scan.values()):
    raise TypeError(f"{owner}: scan must be a dict of core dim name -> batchpart.Scan("
                    f"state=(k, j), merge=None, apply=None, reverse=False), e.g. "
                    f"scan={{'t': bp.Scan(state=(2, 1))}}; got {scan!r}.")
  if len(scan) > 1:
    raise ValueError(f"{owner}: scan={scan!r} declares {len(scan)} scanned dims; a call "
                     "carries its state along one dim.")
  return dict(scan)


def refuse_parallel(owner: str, scan, call: str, hint: str = "") -> None:
  """Raises where the ``scan=`` mapping has a merge for ``call``, a call with
  side effects: a parallel scan runs every part twice."""
  if isinstance(scan, Mapping) and any(getattr(s, "merge", None) is not None
                                    for s in scan.values()):
    raise ValueError(f"{owner}: scan={scan!r} over the dim(s) {', '.join(map(repr, scan))} "
                     f"has a merge; {call}, and a parallel scan runs every part twice, so its "
                     f"side effects would happen twice. Declare the scan without a merge{hint}.")


def scan_text(scans) -> str:
  """The declaration's ``scan=`` as written back, for messages and explain."""
  def one(s):
    how = "merge=..." if s.parallel else "merge=None"
    rev = ", reverse=True" if s.reverse else ""
    return f"{s.name!r}: Scan(state={s.state}, {how}{rev})"
  return "{" + ", ".join(one(s) for s in scans) + "}"


def check_scan_arrays(owner: str, scans, operand_shapes, operand_dtypes, result_shapes,
                      result_dtypes) -> None:
  """Every array that has a scanned dim has it with one size; the state
  operand and result have one shape and dtype."""
  for s in scans:
    sizes = [(f"{what} {k}", int(shapes[k][absolute_dim(axis, len(shapes[k]))]))
             for what, dims, shapes in (("operand", s.operand_dims, operand_shapes),
                                        ("result", s.result_dims, result_shapes))
             for k, axis in dims]
    for where, size in sizes[1:]:
      if size != sizes[0][1]:
        raise ValueError(f"{owner}: the scanned dim '{s.name}' has size {size} in {where} "
                         f"and {sizes[0][1]} in {sizes[0][0]}; the operands and per-step "
                         "results must have it with one size.")
    k, j = s.state
    ks, js = tuple(operand_shapes[k]), tuple(result_shapes[j])
    kt, jt = np.dtype(operand_dtypes[k]), np.dtype(result_dtypes[j])
    if ks != js or kt != jt:
      raise ValueError(f"{owner}: the scanned dim '{s.name}' starts from operand {k} "
                       f"({kt.name}{list(ks)}) and ends in result {j} ({jt.name}"
                       f"{list(js)}); the state operand and result must have one shape and "
                       "dtype.")


@dataclasses.dataclass(frozen=True)
class Registered:
  """A lowered parallel scan: ``merge(a, b)`` and ``apply(summary, state)
  -> state`` on one element, one element's summary types (the results
  without the dim, in order), the state's, where the state result sits
  among the summary, and whether 64-bit types were on."""
  merge: Callable
  apply: Callable
  summary_types: tuple[jax.ShapeDtypeStruct, ...]
  state_type: jax.ShapeDtypeStruct
  state_slot: int
  x64: bool


def _apply(scan: Scan) -> Callable:
  """``scan``'s apply as a function returning the state alone: its own,
  or (where the summary is the final state alone) the merge's."""
  merge, apply = scan.merge, scan.apply
  assert merge is not None, "a registered scan is parallel"
  if apply is None:
    return lambda summary, state: merge((state,), tuple(summary))[0]

  def applied(summary, state):
    out = apply(tuple(summary), state)
    return out[0] if isinstance(out, (tuple, list)) else out
  return applied


def _carry(reg: Registered, platform: str) -> dict:
  """What an exported call carries of ``reg``: the merge and apply
  exported, where the state sits in the summary and the 64-bit mode."""
  types, state = reg.summary_types, reg.state_type
  return {"merge": export_batched(reg.merge, platform, reg.x64, types, types),
          "apply": export_batched(reg.apply, platform, reg.x64, types, state),
          "state_slot": reg.state_slot, "x64": reg.x64}


def _restore(data: dict) -> Registered:
  """The scan ``_carry`` wrote, its merge and apply the exported ones."""
  merge, (types, _) = restore_batched(data["merge"])
  apply, (_, state) = restore_batched(data["apply"])
  return Registered(merge, apply, tuple(types), state, int(data["state_slot"]),
                    bool(data["x64"]))


SCANS: Registry[Registered] = Registry(OP_PREFIX, "scans with the merge", _carry, _restore)


def is_scan_op(name) -> bool:
  return SCANS.is_name(name)


def lowered_name(where: str, scan: Scan, summary_types, state_type, state_slot: int) -> str:
  """The name ``scan_<digest>`` of a parallel scan's merge and apply on one
  element's ``summary_types`` and ``state_type``, registered for the
  per-device module.

  Raises:
    ValueError: naming ``where``, where the merge or apply closes over traced
      values, fails to trace or changes the summary's or the state's tree,
      shape or dtype, or where apply is left out but the summary is more than
      the state.
  """
  types = tuple(jax.ShapeDtypeStruct(tuple(t.shape), np.dtype(t.dtype)) for t in summary_types)
  state = jax.ShapeDtypeStruct(tuple(state_type.shape), np.dtype(state_type.dtype))
  x64 = bool(jax.config.read("jax_enable_x64"))
  merge = scan.merge
  assert merge is not None, "only a parallel scan is lowered"

  def lower() -> tuple[str, Registered]:
    if scan.apply is None and len(types) != 1:
      raise ValueError(f"{where}: the summary (the results without the scanned dim) is "
                       f"{fmt(types)}, more than the state; pass apply=(summary, state) -> "
                       "state to say how a summary moves a state.")
    check_closure(where, "the Scan's merge", merge, types, types)
    try:
      out = jax.eval_shape(merge, types, types)
    except Exception as e:
      raise ValueError(f"{where}: the Scan's merge fails on two summaries {fmt(types)}: "
                       f"{e}") from e
    check_same(where, "the Scan's merge", out, types)
    reg = Registered(merge, _apply(scan), types, state, state_slot, x64)
    if scan.apply is not None:
      check_closure(where, "the Scan's apply", scan.apply, types, state)
    try:
      applied = jax.eval_shape(reg.apply, types, state)
    except Exception as e:
      raise ValueError(f"{where}: the Scan's apply fails on a summary {fmt(types)} and a "
                       f"state {fmt(state)}: {e}") from e
    check_same(where, "the Scan's apply", (applied,), (state,))
    fold = lambda a, b, s: (merge(a, b), reg.apply(a, s))
    return lowered_text(fold, types, types, state), reg

  return SCANS.name((scan, tuple((t.shape, t.dtype.str) for t in types), state.shape,
                     state.dtype.str, state_slot, x64), lower)


def registered(name: str, target: str) -> Registered:
  """The scan lowered under ``name`` (raises ``ValueError`` naming
  ``target`` where this process never lowered it)."""
  return SCANS.get(name, target)


def lower_scans(owner: str, scans, result_shapes, result_core_ranks, result_leads,
                result_dtypes) -> tuple:
  """``scans`` with a parallel ``Scan`` replaced by its lowered name (on one
  batch element's summary and state): what a description carries."""
  out = []
  for s in scans:
    if isinstance(s.fold, Scan):
      where = f"{owner}: scan over the dim '{s.name}'"
      summary = s.summary_results(len(result_shapes))
      if any(result_leads[k] for k in summary):
        raise ValueError(f"{where}: the results without the scanned dim need their batch "
                         "dims in front (no core dims before the signature's '...').")
      types = [jax.ShapeDtypeStruct(core_shape(result_shapes[k], 0, result_core_ranks[k]),
                                    result_dtypes[k]) for k in summary]
      j = s.state[1]
      s = dataclasses.replace(s, fold=lowered_name(where, s.fold, types, types[
          summary.index(j)], summary.index(j)))
    out.append(s)
  return tuple(out)
