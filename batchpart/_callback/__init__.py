"""Host callbacks that run per batch shard: ``bp.pure_callback`` and
``bp.io_callback`` (``api``), their primitive (``primitive``), lowering
(``lowering``) and the Python side XLA calls (``host``); which block each
partition gets is ``_vocab/blocks``."""
