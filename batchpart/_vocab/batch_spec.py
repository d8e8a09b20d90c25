"""Batch specs: how many leading and trailing dims of each operand and result
are core dims (the dims between them are batch dims), and the checks every
layer shares.

A spec is the one description of a call's dims that the primitive, the
lowering, retargeted foreign calls and the partitioner all read; each kind
of dim it holds is a module of ``dims``. The frontend builds it from
``num_batch_dims`` or a gufunc signature (``_frontend/signature``). Every
check takes ``owner``, the entry point the user called
(``batchpart.ffi_call('t')``, ``batchpart.partition_primitive('p')``, ...),
so a message names what the user wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from batchpart import _compat as compat
from batchpart._vocab.declared_dims import DeclaredDims
from batchpart._vocab.dims.batch import batch_slice, full_leads, normalize_lead_fields


@dataclasses.dataclass(frozen=True)
class BatchSpec(DeclaredDims):
  """Where each operand's and result's batch dims are: ``*_core_ranks`` trailing
  core dims and ``*_lead_ranks`` leading core dims (the dims before a
  signature's ``...``); an array of rank n has batch dims [lead, n - core).

  Lead ranks that are all zero (batch dims leading, as without ``...``) are
  stored as ``()``, so such a spec equals one built without them. The
  declared kinds of core dims are ``DeclaredDims``' fields.
  """
  operand_core_ranks: tuple[int, ...]
  result_core_ranks: tuple[int, ...]
  operand_lead_ranks: tuple[int, ...] = ()
  result_lead_ranks: tuple[int, ...] = ()

  def __post_init__(self):
    normalize_lead_fields(self, len(self.operand_core_ranks), len(self.result_core_ranks))

  @classmethod
  def from_params(cls, params) -> BatchSpec:
    """The spec a batchpart primitive's parameters carry (``extra_params``
    and the core ranks)."""
    return cls(params["operand_core_ranks"], params["result_core_ranks"],
               params.get("operand_lead_ranks", ()), params.get("result_lead_ranks", ()),
               **{f.name: params.get(f.name, ()) for f in dataclasses.fields(DeclaredDims)})

  @property
  def operand_leads(self) -> tuple[int, ...]:
    """Each operand's leading core dims (zeros where none)."""
    return full_leads(self.operand_lead_ranks, len(self.operand_core_ranks))

  @property
  def result_leads(self) -> tuple[int, ...]:
    return full_leads(self.result_lead_ranks, len(self.result_core_ranks))

  def extra_params(self) -> dict:
    """The primitive parameters for the lead ranks, reductions and dim names:
    none where batch dims lead and nothing is reduced or named, so such calls
    keep the parameters they always had."""
    params: dict[str, Any] = {}
    if self.operand_lead_ranks or self.result_lead_ranks:
      params.update(operand_lead_ranks=self.operand_leads,
                    result_lead_ranks=self.result_leads)
    if self.reductions:
      params["reductions"] = self.reductions
    if self.dim_names:
      params["dim_names"] = self.dim_names
    if self.halos:
      params["halos"] = self.halos
    if self.scans:
      params["scans"] = self.scans
    return params


def fmt(shape) -> str:
  return str(tuple(int(d) for d in shape))


def require_arrays(owner: str, operands, hint: str = "") -> None:
  """Every operand is an array (or a Python scalar); ``hint`` follows the
  message."""
  for i, x in enumerate(operands):
    if not (hasattr(x, "shape") and hasattr(x, "dtype")) and not isinstance(
        x, (int, float, complex, bool)):
      raise TypeError(f"{owner}: operand {i} must be an array, got "
                      f"{type(x).__name__}.{hint}")


def require_static_shapes(owner: str, operand_shapes, result_shapes) -> None:
  """batchpart plans on concrete shapes; a symbolic (shape-polymorphic) dim
  is refused by name rather than failing deep inside jax."""
  for what, shapes in (("operand", operand_shapes), ("result", result_shapes)):
    for i, shape in enumerate(shapes):
      if not all(isinstance(d, (int, np.integer)) for d in shape):
        raise NotImplementedError(
            f"{owner}: {what} {i} has the symbolic shape "
            f"({', '.join(map(str, shape))}); shape-polymorphic export of batchpart "
            "calls is not supported. Export with concrete shapes.")


def checked_operand_avals(owner: str, operands, result_avals, hint: str = "") -> list:
  """The operands' avals, once every operand is an array (``hint`` follows
  that message) and no operand or result shape is symbolic."""
  require_arrays(owner, operands, hint)
  avals = [compat.typeof(x) for x in operands]
  require_static_shapes(owner, [tuple(a.shape) for a in avals],
                        [tuple(r.shape) for r in result_avals])
  return avals


def broadcast_batch_shapes(owner: str, batch_shapes: Sequence[tuple[int, ...]]
                           ) -> tuple[int, ...]:
  """The NumPy broadcast of the operands' batch shapes."""
  rank = max((len(s) for s in batch_shapes), default=0)
  out = [1] * rank
  for k, shape in enumerate(batch_shapes):
    for m, size in enumerate(shape):
      i = rank - len(shape) + m
      if size == out[i] or size == 1:
        continue
      if out[i] == 1:
        out[i] = size
        continue
      raise ValueError(
          f"{owner}: the batch shape {fmt(shape)} of operand {k} does not broadcast "
          f"with the other operands' batch shapes (size {size} against {out[i]}). "
          "Batch dims broadcast NumPy-style: equal sizes, size 1, or missing "
          "leading dims.")
  return tuple(out)


def check_spec(owner: str, spec: BatchSpec, operand_shapes, result_shapes
               ) -> tuple[int, ...]:
  """Checks a spec against (possibly vmapped) shapes; returns the batch shape."""
  if len(spec.operand_core_ranks) != len(operand_shapes) or len(
      spec.result_core_ranks) != len(result_shapes):
    raise ValueError(
        f"{owner}: the declaration has {len(spec.operand_core_ranks)} operands and "
        f"{len(spec.result_core_ranks)} results, but the call has "
        f"{len(operand_shapes)} and {len(result_shapes)}.")
  batch_shapes = []
  for i, (shape, c, lead) in enumerate(zip(operand_shapes, spec.operand_core_ranks,
                                           spec.operand_leads)):
    if len(shape) < c + lead:
      raise ValueError(
          f"{owner}: operand {i} with shape {fmt(shape)} has fewer dims than its "
          f"{c + lead} core dims.")
    batch_shapes.append(batch_slice(shape, lead, c))
  batch = broadcast_batch_shapes(owner, batch_shapes)
  for i, (shape, c, lead) in enumerate(zip(result_shapes, spec.result_core_ranks,
                                           spec.result_leads)):
    if len(shape) < c + lead or batch_slice(shape, lead, c) != batch:
      raise ValueError(
          f"{owner}: result {i} with shape {fmt(shape)} does not have the batch "
          f"shape {fmt(batch)} of the operands"
          + (f" at dims {lead}..{lead + len(batch) - 1}." if lead else "."))
  return batch
