"""The Python side of a host callback: what the callback custom call calls.

jax's typed-FFI callback target (``xla_ffi_python_cpu_callback``) calls
``host_callbacks[index](*args)`` with NumPy copies of the operand buffers of
the device it runs for, and copies the returned tuple of arrays into the
result buffers, trusting their sizes. The object registered there is a
``HostCall``: it reads the block vector (operand 0), trims the padding of an
uneven shard, calls the user's function on the block, checks the results'
shapes and dtypes in Python (a wrong size would otherwise be copied as is)
and pads them back to the local shape. Nothing goes through a device (jax's
own callbacks ``device_put`` every operand onto CPU device 0 first, which
stalls programs whose devices meet in a collective afterwards).

Lifetime: the primitive's ``callback`` parameter is a ``FlatCallback``, a
callable object comparing equal for the same function and argument
structure (so jit caches hit); each lowering registers a fresh ``HostCall``
holding it with the module, and the compiled executable holds that. Nothing
is kept in a table here.
"""

from __future__ import annotations

import numpy as np

from batchpart import _compat as compat
from batchpart._primitive.batch_spec import batch_first, fmt, inverse


def callback_name(fn) -> str:
  name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
  if name is None:
    inner = getattr(fn, "func", None)   # functools.partial
    name = callback_name(inner) if inner is not None else type(fn).__name__
  return str(name)


class CallbackError(RuntimeError):
  """An exception raised by the user's callback, or results that do not fit
  the block; the message names the callback."""


class Layouts(tuple):
  """Where a signature's '...' puts the batch dims of each flat operand and
  result in the user's layout: (operand leads, operand trailing core ranks,
  result leads, result trailing core ranks). The primitive sees them in
  front; the user's function sees its own layout."""

  def __new__(cls, op_leads, op_cores, res_leads, res_cores):
    return super().__new__(cls, (tuple(op_leads), tuple(op_cores), tuple(res_leads),
                                 tuple(res_cores)))

  def to_user(self, args):
    """Blocks with batch dims in front -> the user's layout."""
    return [_move_batch(x, lead, core, to_front=False)
            for x, lead, core in zip(args, self[0], self[1])]

  def from_user(self, results):
    """The user's results -> batch dims in front (left as they are where the
    rank is wrong: the shape check reports them)."""
    return [_move_batch(r, lead, core, to_front=True)
            for r, lead, core in zip(results, self[2], self[3])]


def _move_batch(x, lead: int, core: int, *, to_front: bool):
  x = np.asarray(x)
  batch = x.ndim - lead - core
  if not lead or batch <= 0:
    return x
  order = batch_first(x.ndim, lead, batch)
  return np.transpose(x, order if to_front else inverse(order))


class FlatCallback:
  """The user's function with flat operands and results: the primitive's
  ``callback`` parameter. Equal for the same function, pytrees and options."""

  __slots__ = ("fn", "in_tree", "out_tree", "with_index", "kind", "layouts",
               "__weakref__")

  def __init__(self, fn, in_tree, out_tree, *, with_index: bool, kind: str,
               layouts: Layouts | None = None):
    self.fn, self.in_tree, self.out_tree = fn, in_tree, out_tree
    self.with_index, self.kind, self.layouts = bool(with_index), kind, layouts

  def _key(self):
    return (self.fn, self.in_tree, self.out_tree, self.with_index, self.kind,
            self.layouts)

  def __eq__(self, other):
    return isinstance(other, FlatCallback) and self._key() == other._key()

  def __hash__(self):
    return hash(self._key())

  def __repr__(self):
    return f"{self.owner}"

  @property
  def owner(self) -> str:
    return f"batchpart.{self.kind}({callback_name(self.fn)})"

  def __call__(self, *flat_args, index=None):
    import jax
    if self.layouts is not None:
      flat_args = self.layouts.to_user(flat_args)
    args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, list(flat_args))
    if self.with_index:
      kwargs = {**kwargs, "index": index}
    out = self.fn(*args, **kwargs)
    leaves, tree = jax.tree_util.tree_flatten(out)
    if tree != self.out_tree:
      raise CallbackError(
          f"{self.owner} returned a result with structure {tree}, but "
          f"result_shape_dtypes has structure {self.out_tree}.")
    return leaves if self.layouts is None else self.layouts.from_user(leaves)


class HostCall:
  """What one lowered callback custom call calls, on every device.

  Static: the global batch shape, each operand's global shape and batch rank
  (batch dims right-aligned, a size-1 one broadcast), each result's global
  shape and dtype, and ``unit``: the call has no batch dims of its own and
  was given a leading one of size 1 (so that a replicated call is still
  made once)."""

  __slots__ = ("flat", "batch", "operand_shapes", "operand_batch_ranks",
               "result_shapes", "result_dtypes", "unit", "__weakref__")

  def __init__(self, flat: FlatCallback, *, batch, operand_shapes, operand_batch_ranks,
               result_shapes, result_dtypes, unit: bool):
    self.flat = flat
    self.batch = tuple(int(b) for b in batch)
    self.operand_shapes = [tuple(int(d) for d in s) for s in operand_shapes]
    self.operand_batch_ranks = tuple(operand_batch_ranks)
    self.result_shapes = [tuple(int(d) for d in s) for s in result_shapes]
    self.result_dtypes = [np.dtype(t) for t in result_dtypes]
    self.unit = bool(unit)

  def __call__(self, block, *args):
    rank = len(self.batch)
    block = np.asarray(block).reshape(-1)
    offsets = [int(v) for v in block[:rank]]
    local = [int(v) for v in block[rank:2 * rank]]
    valid = [max(0, min(b - o, n)) for b, o, n in zip(self.batch, offsets, local)]
    local_results = [tuple(local) + s[rank:] for s in self.result_shapes]
    if any(v == 0 for v in valid) and rank:
      # All padding: nothing of the batch is here, and nothing is called.
      return tuple(np.zeros(s, t) for s, t in zip(local_results, self.result_dtypes))
    trimmed = []
    for x, shape, b in zip(args, self.operand_shapes, self.operand_batch_ranks):
      cut = tuple(slice(0, valid[rank - b + m])
                  if shape[m] == self.batch[rank - b + m] != 1 else slice(None)
                  for m in range(b))
      x = x[cut] if any(c.stop is not None and c.stop < n
                        for c, n in zip(cut, x.shape)) else x
      trimmed.append(x[0] if self.unit else x)
    index = tuple(slice(o, o + v) for o, v in zip(offsets, valid))
    if self.unit:
      index = index[1:]
    owner = self.flat.owner
    try:
      outs = self.flat(*trimmed, index=index)
    except CallbackError:
      raise
    except Exception as e:
      raise CallbackError(
          f"{owner} raised {type(e).__name__}: {e} (on the block {_fmt_index(index)} "
          "of the batch)") from e
    if len(outs) != len(self.result_shapes):
      raise CallbackError(f"{owner} returned {len(outs)} results; "
                          f"result_shape_dtypes has {len(self.result_shapes)}.")
    block_shape = tuple(valid)
    padded = []
    for i, (r, shape, dtype, local_shape) in enumerate(
        zip(outs, self.result_shapes, self.result_dtypes, local_results)):
      r = compat.canonicalize_value(np.asarray(r))
      want = block_shape + shape[rank:]
      got = ((1,) + tuple(r.shape)) if self.unit else tuple(r.shape)
      if got != want or r.dtype != dtype:
        user_want = want[1:] if self.unit else want
        raise CallbackError(
            f"{owner}: result {i} has shape {fmt(r.shape)} and dtype {r.dtype}, but "
            f"the block {_fmt_index(index)} of the batch needs shape {fmt(user_want)} "
            f"and dtype {dtype} (the global result is {fmt(shape[1:] if self.unit else shape)}"
            f" {dtype}).")
      r = r.reshape(want)
      if want != local_shape:
        full = np.zeros(local_shape, dtype)
        full[tuple(slice(0, n) for n in want)] = r
        r = full
      padded.append(r)
    return tuple(padded)


def _fmt_index(index) -> str:
  return "[" + ", ".join(f"{s.start}:{s.stop}" for s in index) + "]"
