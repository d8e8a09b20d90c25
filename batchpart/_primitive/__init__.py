"""The ``batchpart_ffi_call`` primitive: definition and abstract evaluation,
lowering to a derived-name custom call, and vmap."""

from batchpart._primitive import (
    batching as _batching,  # noqa: F401  (registers)
    lowering as _lowering,  # noqa: F401  (registers)
)
from batchpart._primitive.primitive import (
    batchpart_ffi_call_p,
    bind,
    ffi_call_owner,
    reshard_core_to_batch,
    typed_attributes,
)

__all__ = ["batchpart_ffi_call_p", "bind", "ffi_call_owner", "reshard_core_to_batch",
           "typed_attributes"]
