"""batchpart: make XLA FFI calls shard like native JAX ops.

Call an FFI target with ``batchpart.ffi_call`` (or decorate an existing
``jax.ffi.ffi_call`` wrapper), and under ``jax.jit`` every device runs the
kernel on its own slice of the batch.
"""

import importlib.metadata as _metadata

# First: _compat checks the jax version before anything reads jax's internals.
from batchpart import (
    _compat,  # noqa: F401
    linalg,
)
from batchpart._callback.adopt import partition_callback
from batchpart._callback.api import io_callback, pure_callback
from batchpart._callback.buffer import buffer_callback
from batchpart._explain import explain
from batchpart._frontend.adopt import (
    ffi_lowering,
    partition_ffi_target,
    partition_primitive,
    unpartition,
)
from batchpart._frontend.decorator import batch_partitionable
from batchpart._frontend.ffi_call import ffi_call
from batchpart._frontend.registry import (
    is_batch_partitionable,
    mark_batch_partitionable,
    register_ffi_target,
)
from batchpart._partition import export as _export
from batchpart._vocab.dims.halo import Halo
from batchpart._vocab.dims.scan import Scan
from batchpart._vocab.dims.user_combiner import Combiner

_export.install()

__all__ = [
    "Combiner",
    "batch_partitionable",
    "buffer_callback",
    "explain",
    "ffi_call",
    "ffi_lowering",
    "Halo",
    "io_callback",
    "is_batch_partitionable",
    "linalg",
    "mark_batch_partitionable",
    "partition_callback",
    "partition_ffi_target",
    "partition_primitive",
    "pure_callback",
    "register_ffi_target",
    "Scan",
    "unpartition",
]
# The version lives in pyproject.toml only; the installed metadata carries it.
__version__ = _metadata.version("batchpart")
