"""The errors a host callback raises on the user's side: its name as errors
give it, and the exception that names the callback (and the block it failed
on)."""

from __future__ import annotations


def callback_name(fn) -> str:
  name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
  if name is None:
    inner = getattr(fn, "func", None)   # functools.partial
    name = callback_name(inner) if inner is not None else type(fn).__name__
  return str(name)


class CallbackError(RuntimeError):
  """An exception raised by the user's callback, or results that do not fit
  the block; the message names the callback."""


def raised_on_block(owner: str, e: Exception, index) -> CallbackError:
  """The error for the user's function raising ``e`` on the block ``index``."""
  return CallbackError(f"{owner} raised {type(e).__name__}: {e} (on the block "
                       f"{fmt_index(index)} of the batch)")


def fmt_index(index) -> str:
  """A block's index as text; a halo dim's ``(window, kept)`` pair as
  ``window->kept``."""
  return "[" + ", ".join(_fmt_entry(s) for s in index) + "]"


def _fmt_entry(s) -> str:
  if isinstance(s, slice):
    return f"{s.start}:{s.stop}"
  return f"{_fmt_entry(s[0])}->{_fmt_entry(s[1])}"
