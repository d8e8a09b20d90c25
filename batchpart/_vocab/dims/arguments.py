"""The types of the ``reduce=``, ``halo=`` and ``scan=`` arguments, which
every entry point takes (``bp.ffi_call``, the decorators, the callbacks, the
adopting functions): defined once here, so that they cannot drift apart.

Mappings rather than dicts: ``Mapping`` is covariant in its values, so a
``dict[str, str]`` or ``dict[str, int]`` the user built beforehand is
accepted, which ``dict[str, str | Combiner]`` would refuse. The ops stay
``str`` rather than a ``Literal`` of the named ones for the same reason (an
op read from a variable is a ``str``); the entry points check the names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from batchpart._vocab.dims.halo import Halo
from batchpart._vocab.dims.scan import Scan
from batchpart._vocab.dims.user_combiner import Combiner

#: One reduced dim's op: a named op (``"sum"``, ``"max"``, ``"min"``,
#: ``"argmax"``, ``"argmin"``, ``"max_k"``, ``"min_k"``, ``"logsumexp"``) or a
#: ``batchpart.Combiner``.
ReduceOp: TypeAlias = str | Combiner
#: ``reduce=``: core dim name -> op.
ReduceSpec: TypeAlias = Mapping[str, ReduceOp]
#: ``halo=``: core dim name -> width ``w`` (``Halo(w, w)``) or a ``batchpart.Halo``.
HaloSpec: TypeAlias = Mapping[str, int | Halo]
#: ``scan=``: core dim name -> ``batchpart.Scan``.
ScanSpec: TypeAlias = Mapping[str, Scan]
