"""Host callbacks that run per batch shard: ``bp.pure_callback`` and
``bp.io_callback`` (``api``), their primitive (``primitive``), lowering
(``lowering``), the Python side XLA calls (``host``) and the per-partition
blocks (``blocks``)."""
