"""The kinds of core dims a call declares, which its batch spec
(``batch_spec``) and its description (``description``) both carry."""

from __future__ import annotations

import dataclasses

from batchpart._vocab.dims.core import DimName
from batchpart._vocab.dims.halo import HaloDim
from batchpart._vocab.dims.reduced import Reduction
from batchpart._vocab.dims.scan import ScanDim


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeclaredDims:
  """``reductions``: the reduced core dims (``dims/reduced``); ``dim_names``:
  where each named core dim is (``dims/core``), where a reduction or a
  per-shard attribute rule needs it; ``halos``: the halo dims
  (``dims/halo``); ``scans``: the scanned dims (``dims/scan``). Keyword
  fields, after each class's own."""
  reductions: tuple[Reduction, ...] = ()
  dim_names: tuple[DimName, ...] = ()
  halos: tuple[HaloDim, ...] = ()
  scans: tuple[ScanDim, ...] = ()
