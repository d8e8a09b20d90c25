"""Which jax versions batchpart was checked against, and the one check of it.

Every module of ``batchpart._compat`` states the versions it was checked
against at its top and holds the branches its own concern needs where jax
differs across them; this module holds the range and the warning outside it.
"""

from __future__ import annotations

import warnings

import jax

# The oldest jax/jaxlib checked (on Python 3.11); the newest checked is the
# newest jax on Python 3.12 (0.12.x).
OLDEST_CHECKED = "0.10.2"


def _key(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in version.split(".")[:3] if p.isdigit())


def check_versions() -> None:
  """Warns where jax is older than the oldest version checked."""
  if _key(jax.__version__) < _key(OLDEST_CHECKED):
    warnings.warn(f"batchpart was checked against jax >= {OLDEST_CHECKED}; "
                  f"this is jax {jax.__version__}.", RuntimeWarning, stacklevel=2)
