"""Batch dims: where each array's batch dims lie, between its leading core
dims (those before a signature's ``...``) and its trailing ones.

An array of rank n with ``lead`` leading and ``core`` trailing core dims has
batch dims [lead, n - core). Lead ranks that are all zero (batch dims
leading, as without ``...``) are stored as ``()``.
"""

from __future__ import annotations


def normalize_leads(leads, n: int, what: str = "lead ranks") -> tuple[int, ...]:
  """``leads`` as a tuple of n ints, or ``()`` where all are zero."""
  leads = tuple(int(v) for v in leads)
  if not any(leads):
    return ()
  if len(leads) != n or min(leads) < 0:
    raise ValueError(f"{what} {leads} do not fit {n} arrays")
  return leads


def normalize_lead_fields(obj, num_operands: int, num_results: int, owner: str = ""
                          ) -> None:
  """Normalizes (``normalize_leads``) the ``operand_lead_ranks`` and
  ``result_lead_ranks`` of a frozen dataclass in place; ``owner`` leads the
  message."""
  for field, n in (("operand_lead_ranks", num_operands), ("result_lead_ranks", num_results)):
    object.__setattr__(obj, field, normalize_leads(getattr(obj, field), n, owner + field))


def full_leads(leads, n: int) -> tuple[int, ...]:
  """Normalized lead ranks expanded to one per array."""
  return tuple(leads) if leads else (0,) * n


def batch_slice(shape, lead: int, core: int) -> tuple[int, ...]:
  """The batch dims of an array: between its lead and trailing core dims."""
  return tuple(shape[lead:len(shape) - core])


def batch_first(rank: int, lead: int, batch_rank: int) -> list[int]:
  """The dim order that puts an array's batch dims [lead, lead + batch_rank)
  first, then its leading core dims, then its trailing ones."""
  return [*range(lead, lead + batch_rank), *range(lead), *range(lead + batch_rank, rank)]


def inverse(perm) -> list[int]:
  """The permutation that undoes ``perm``."""
  out = [0] * len(perm)
  for i, p in enumerate(perm):
    out[p] = i
  return out
