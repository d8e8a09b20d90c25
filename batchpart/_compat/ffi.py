"""``jax.ffi.ffi_call``'s own helpers, and XLA's registry of FFI handlers.

Checked against jax/jaxlib 0.10.2 and 0.12.x (``versions``).

- ``jax._src.ffi``: the attribute, layout and result helpers of
  ``jax.ffi.ffi_call``, so ``bp.ffi_call`` accepts exactly what it accepts,
  its effect, and ``ffi_call_p`` so the decorator finds plain calls in a
  jaxpr.
- ``jax._src.lib.xla_client``: ``custom_call_targets``, the queue of
  registrations jax holds until a platform's backend starts, and the
  platforms' registration handlers, to tell whether a target has a typed-FFI
  handler or a legacy one.

XLA keeps one handler registry per binary: jaxlib's own, which serves the CPU
client, and one inside each PJRT plugin (the CUDA and ROCm plugins).
``custom_call_targets`` reads jaxlib's only, so once a plugin's backend has
started, what was registered for its platform cannot be read back. There the
registrations batchpart made itself are known, and any other target is
``"unknown"``: batchpart lets the call through, and if no handler exists
XLA's compile fails naming the target (nothing runs).
"""

from __future__ import annotations

import threading

from jax._src import ffi as jax_ffi
from jax._src.lib import xla_client

jax_ffi_call_p = jax_ffi.ffi_call_p
ffi_effect = jax_ffi._FfiEffect
wrap_kwargs_hashable = jax_ffi._wrap_kwargs_hashable
unwrap_kwargs_hashable = jax_ffi._unwrap_kwargs_hashable
convert_layout_for_lowering = jax_ffi._convert_layout_for_lowering
convert_layouts_for_ffi_call = jax_ffi._convert_layouts_for_ffi_call
check_compatible_avals = jax_ffi._check_compatible_avals
result_avals_from_shape_dtypes = jax_ffi._result_avals


def xla_platform_name(platform: str) -> str:
  """jax's platform name (``cpu``, ``cuda``) as XLA's handler registry keys it."""
  return {"cpu": "Host", "cuda": "CUDA", "gpu": "CUDA", "rocm": "ROCM"}.get(
      platform.lower(), platform)


# The platforms whose handler registry custom_call_targets reads.
_READABLE_REGISTRIES = frozenset({"Host"})

_noted_lock = threading.Lock()
_noted: dict[tuple[str, str], str] = {}   # (name, XLA platform) -> "ffi" | "legacy"


def note_registered(name: str, platform: str, api_version: int) -> None:
  """Records a registration batchpart made (``jax.ffi.register_ffi_target``
  succeeded), for the platforms whose registry cannot be read back."""
  with _noted_lock:
    _noted[(name, xla_platform_name(platform))] = "ffi" if api_version == 1 else "legacy"


def handler_api(name: str, platform: str) -> str | None:
  """How ``name`` is registered on ``platform``: ``"ffi"`` (a typed-FFI
  handler), ``"legacy"`` (the legacy custom-call API), None (not registered),
  or ``"unknown"`` (a plugin platform whose registry cannot be read, for a
  target batchpart did not register). Registrations jax still queues (its
  backend not started yet) count too."""
  xla_name = xla_platform_name(platform)
  with _noted_lock:
    noted = _noted.get((name, xla_name))
  if noted is not None:
    return noted
  with xla_client._custom_callback_lock:
    for queued_name, _fn, api_version, _ in xla_client._custom_callback.get(xla_name, ()):
      if queued_name == name:
        return "ffi" if api_version == 1 else "legacy"
    started = xla_name in xla_client._custom_callback_handler
  if not started:
    return None  # no backend for this platform in this process
  if xla_name not in _READABLE_REGISTRIES:
    return "unknown"
  try:
    found = xla_client.custom_call_targets(xla_name).get(name)
  except Exception:  # noqa: BLE001 - a platform without a handler registry
    return None
  # A typed-FFI handler comes back as its bundle (a dict), a legacy target as
  # its bare function capsule.
  return None if found is None else "ffi" if isinstance(found, dict) else "legacy"


def platforms_with_handler(name: str, api: str = "ffi") -> list[str]:
  """The platforms (XLA names) on which ``name`` has a handler of ``api``
  (``"ffi"``: typed FFI, counting ``"unknown"`` plugin registrations;
  ``"legacy"``)."""
  with xla_client._custom_callback_lock:
    platforms = set(xla_client._custom_callback_handler) | set(xla_client._custom_callback)
  accepted = {"ffi", "unknown"} if api == "ffi" else {api}
  return sorted(p for p in platforms if handler_api(name, p) in accepted)
