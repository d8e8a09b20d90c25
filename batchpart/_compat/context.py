"""What is in force while jax traces and lowers: the partitioner option, the
context mesh (Explicit-mode types and resharding), and the declarations
snapshot as part of jax's cache keys.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.config.use_shardy_partitioner``: Shardy or GSPMD.
- ``jax._src.core``: the context mesh's sharding for result types, and the
  resharding jax inserts when operands' Explicit shardings disagree.
- ``jax._src.mesh``: no context mesh while a ``jax.numpy`` function is
  lowered for the per-device module, whose program has no mesh.
- ``jax.make_user_context`` (public, but set globally with ``set_global``):
  the declarations snapshot in jax's jit and trace-cache keys.
"""

from __future__ import annotations

import jax
from jax._src import config as jax_config, core, mesh as mesh_lib

get_cur_mesh_sharding = core.get_cur_mesh_sharding
auto_insert_reshard = core.auto_insert_reshard


def without_mesh():
  """A context in which no mesh is in force (Explicit mode's sharding
  constraints would name a mesh the per-device module lacks)."""
  return mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh)


def use_shardy() -> bool:
  """Whether jax lowers for the Shardy partitioner (else GSPMD)."""
  return bool(jax_config.use_shardy_partitioner.value)


# A jax user context, not a config option: jax makes every option an absl
# flag and a JAX_* environment variable, which hold strings, and this value
# is an object. It is part of jax's jit and trace-cache keys.
_declarations_key = jax.make_user_context(default_value=None)


def set_declarations_key(snapshot) -> None:
  """Puts ``snapshot`` (an immutable object, or None) in force as the
  declarations part of jax's cache keys, for every thread."""
  _declarations_key.set_global(snapshot)


def declarations_key():
  """The declarations snapshot in force for this thread (None until set)."""
  # jax's jit reads this value into its key when a call starts (C++, thread
  # override else global) and reads it again for each cache it consults, but
  # never pins it: a global change in between is seen here (jax 0.10.2, 0.12).
  return _declarations_key.value
