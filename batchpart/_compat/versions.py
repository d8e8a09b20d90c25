"""Which jax versions batchpart supports, and the one check of it at import.

Every module of ``batchpart._compat`` states the versions it was checked
against at its top and holds the branches its own concern needs where jax
differs across them; this module holds the range and its check, which
``batchpart._compat`` runs before any of those modules touches jax.

The policy, as pyproject.toml's dependency bounds and docs/faq.md state it:

- jax or jaxlib older than ``OLDEST_SUPPORTED``: ``ImportError`` naming the
  installed and supported versions. batchpart reads jax internals that older
  releases lack or spell differently, so it would otherwise fail later, deep
  inside a lowering, with an error that names neither.
- a jax release newer than the newest checked (``NEWEST_CHECKED``, a
  major.minor series): a ``RuntimeWarning``, not an error. jax releases often
  and most releases change nothing batchpart reads; refusing them would block
  users where nothing is broken, and pip could not resolve an upper bound
  against packages that need the newer jax. Where something did change, the
  failure comes from one ``_compat`` module, which the warning points to.
"""

from __future__ import annotations

import re
import warnings

import jax
import jaxlib

# The oldest jax/jaxlib checked (on Python 3.11) and the newest series checked
# (0.12.x, on Python 3.12 and 3.13); .ci/run tests both ends.
OLDEST_SUPPORTED = "0.10.2"
NEWEST_CHECKED = "0.12"


def version_key(version: str) -> tuple[int, ...]:
  """``"0.12.0.1"`` -> ``(0, 12, 0)``; a pre-release or dev suffix counts as its
  release (``"0.13.0rc1"`` -> ``(0, 13, 0)``)."""
  key = []
  for part in version.split(".")[:3]:
    digits = re.match(r"\d+", part)
    if digits is None:
      break
    key.append(int(digits.group()))
  return tuple(key)


def check_versions(jax_version: str | None = None, jaxlib_version: str | None = None) -> None:
  """Raises ``ImportError`` where jax or jaxlib is older than the oldest supported
  version; warns where jax is newer than the newest series checked. The
  versions default to the installed ones."""
  jax_version = jax.__version__ if jax_version is None else jax_version
  jaxlib_version = jaxlib.__version__ if jaxlib_version is None else jaxlib_version
  supported = (f"batchpart supports jax and jaxlib >= {OLDEST_SUPPORTED} (checked on "
               f"{OLDEST_SUPPORTED} to {NEWEST_CHECKED}.x)")
  for name, version in (("jax", jax_version), ("jaxlib", jaxlib_version)):
    if version_key(version) < version_key(OLDEST_SUPPORTED):
      raise ImportError(
          f"{supported}; this is {name} {version} (jax {jax_version}, jaxlib "
          f"{jaxlib_version}). Upgrade with: pip install -U 'jax>={OLDEST_SUPPORTED}'")
  if version_key(jax_version)[:2] > version_key(NEWEST_CHECKED):
    warnings.warn(
        f"{supported}; this is jax {jax_version}, newer than any version checked. "
        f"It may well work; a failure inside batchpart/_compat is the place to look.",
        RuntimeWarning, stacklevel=2)
