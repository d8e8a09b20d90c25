"""What users call: ``ffi_call``, the ``batch_partitionable`` decorator,
target registration, and the batch specs (``num_batch_dims`` / gufunc
signatures) they share."""
