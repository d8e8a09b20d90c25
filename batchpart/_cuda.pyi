# The nanobind module compiled from cc/ carries no stubs of its own; the
# package reaches it only through typed Python wrappers.
from typing import Any

def __getattr__(name: str) -> Any: ...
