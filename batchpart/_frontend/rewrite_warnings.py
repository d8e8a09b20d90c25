"""What the decorator's rewrite tells the user: a warning, once per trace of
the wrapper, where its ``jax.ffi.ffi_call``s stay unpartitioned, and one per
call whose batch dims it cannot tell."""

from __future__ import annotations

import warnings


class RewriteWarnings:
  """The counts a rewrite keeps of the calls it rewrote and left plain, and
  the warnings they give (``batch_partitionable``'s rewriter derives from it)."""

  def __init__(self, name, qualname, batch_shape):
    self.name = name
    self.qualname = qualname
    self.batch_shape = batch_shape
    self.rewritten = 0
    self.left_alone = []   # why calls stayed plain jax.ffi.ffi_calls
    self.unclear = 0       # calls left plain because their batch dims are unclear
    self.hidden = {}       # primitive name -> ffi_calls inside it, not entered
    self.tracing = True
    self.warned = False

  def _unpartitioned_vmap_rule(self, rule):
    """``rule`` (a custom_vmap rule), warning that its calls are not rewritten."""
    def warned_rule(*args):
      self._warn(f"under jax.vmap, a jax.custom_batching.custom_vmap function inside "
                 f"it runs its own vmap rule ({getattr(rule, '__name__', rule)}), "
                 f"whose jax.ffi.ffi_calls the decorator does not rewrite")
      return rule(*args)
    return warned_rule

  def _hidden_message(self):
    return "; ".join(
        f"{n} jax.ffi.ffi_call(s) inside {prim!r}, which it does not enter, stay "
        f"unpartitioned" for prim, n in sorted(self.hidden.items()))

  def _warn(self, message):
    """Warns once per trace of the wrapper."""
    if not self.warned:
      self.warned = True
      warnings.warn(f"batchpart.batch_partitionable({self.name}): {message}.",
                    UserWarning, stacklevel=4)

  def _warn_unclear(self, target, reason, partitioned=False):
    """Warns that a call stays unpartitioned (or, ``partitioned``, keeps a
    reduced dim whole) because where its dims are is unclear."""
    what = ("keeps the reduced dim whole" if partitioned else
            "stays unpartitioned (every device computes it whole)")
    if not partitioned:
      self.unclear += 1
    warnings.warn(
        f"batchpart.batch_partitionable({self.qualname}): the jax.ffi.ffi_call to "
        f"{target!r} {what}: {reason}. Call batchpart.ffi_call with the kernel's own "
        "signature there to partition it.", UserWarning, stacklevel=2)

  def _report_deferred(self):
    """After a rule traced after the wrapper (forward, JVP, backward): warns
    of calls it could not reach."""
    if not self.tracing and self.hidden:
      self._warn(self._hidden_message())

  def finish_trace(self):
    """At the end of the wrapper's trace: warns where calls stay unpartitioned
    (calls with unclear batch dims have had their own warning)."""
    self.tracing = False
    if self.rewritten == 0 and not self.unclear:
      reasons = list(dict.fromkeys(self.left_alone))[:3]
      if self.hidden:
        reasons.append(self._hidden_message())
      detail = "; ".join(reasons) or "it calls no jax.ffi.ffi_call"
      self._warn(f"found no jax.ffi.ffi_call with the batch shape {self.batch_shape} "
                 f"to partition; {detail}")
    elif self.hidden:
      self._warn(self._hidden_message())
