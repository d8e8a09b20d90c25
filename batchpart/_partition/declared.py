"""The FFI targets declared batch partitionable in this process: marked by
the user, or called through batchpart. It only answers
``batchpart.is_batch_partitionable``; no partitioning decision reads it."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_names: set[str] = set()


def declare(name: str) -> None:
  with _lock:
    _names.add(name)


def is_declared(name: str) -> bool:
  with _lock:
    return name in _names
