"""batchpart: make XLA FFI calls shard like native JAX ops.

Mark an FFI target batch partitionable, call it with ``batchpart.ffi_call``
(or decorate an existing ``jax.ffi.ffi_call`` wrapper), and under ``jax.jit``
every device runs the kernel on its own slice of the batch.
"""

from batchpart import linalg
from batchpart._decorator import batch_partitionable
from batchpart._explain import explain
from batchpart._ffi_call import ffi_call
from batchpart._registry import (
    is_batch_partitionable,
    mark_batch_partitionable,
    register_ffi_target,
)

__all__ = [
    "batch_partitionable",
    "explain",
    "ffi_call",
    "is_batch_partitionable",
    "linalg",
    "mark_batch_partitionable",
    "register_ffi_target",
]
__version__ = "0.1.0"
