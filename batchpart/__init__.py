"""batchpart: make XLA FFI calls shard like native JAX ops."""
