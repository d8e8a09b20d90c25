"""The Python side of a host callback: what the callback custom call calls.

jax's typed-FFI callback target (``xla_ffi_python_cpu_callback``) calls
``host_callbacks[index](*args)`` with NumPy copies of the operand buffers of
the device it runs for, and copies the returned tuple of arrays into the
result buffers, trusting their sizes. The object registered there is a
``HostCall``: it reads the block vector (operand 0), trims the padding of an
uneven shard, calls the user's function on the block, checks the results'
shapes and dtypes in Python (a wrong size would otherwise be copied as is)
and pads them back to the local shape. Nothing goes through a device: with
``arrays="jax"`` the NumPy copies become ``jax.Array``s on the CPU device
over the same memory (``_aligned``), never by a transfer, which is what
stalls jax's own callbacks in programs whose devices meet in a collective.

Per call, only what depends on the call is done: a ``HostCall`` works out
once per distinct block vector (one per partition) what that block needs
(``_Block``: which operands to trim, the ``index``, the result shapes to
check, whether to pad), and a ``FlatCallback`` knows from its trees whether
the user's arguments and results need pytree work at all.

Lifetime: the primitive's ``callback`` parameter is a ``FlatCallback``, a
callable object comparing equal for the same function and argument
structure (so jit caches hit); each lowering registers a fresh ``HostCall``
holding it with the module, and the compiled executable holds that. Nothing
is kept in a table here.
"""

from __future__ import annotations

import jax
import numpy as np

from batchpart import _compat as compat
from batchpart._callback.agreement import Agreement, together
from batchpart._callback.errors import CallbackError, callback_name, fmt_index, raised_on_block
from batchpart._vocab.batch_spec import fmt
from batchpart._vocab.blocks import block_extent, halo_extents, reduced_parts
from batchpart._vocab.dims.batch import batch_first, inverse


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


ARRAYS = ("jax", "numpy")
# NumPy by default: importing operands as jax.Arrays is safe (no transfer)
# but costs tens of microseconds per call under eight device threads, more
# than the whole call path otherwise (docs/callbacks.md, "What the callback
# gets").
DEFAULT_ARRAYS = "numpy"


def check_arrays(owner: str, arrays) -> str:
  """``arrays=`` as given, or a ValueError naming the callback."""
  if arrays not in ARRAYS:
    raise ValueError(f"{owner}: arrays={arrays!r}; expected 'jax' (jax.Array operands, as "
                     "jax's callbacks get) or 'numpy' (NumPy operands).")
  return arrays


def _aligned(x) -> np.ndarray:
  """``x`` as a C-contiguous array aligned for jaxlib to alias: ``x`` itself
  where it is one, else a copy made on the host."""
  x = np.asarray(x)
  align = compat.HOST_ARRAY_ALIGNMENT
  if not x.size or (x.flags.c_contiguous and x.ctypes.data % align == 0):
    return x
  raw = np.empty(x.nbytes + align, np.uint8)
  start = -raw.ctypes.data % align
  out = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
  np.copyto(out, x)
  return out


def _leaf_arity(tree) -> int | None:
  """-1 where ``tree`` is one leaf, ``n`` where it is a tuple of ``n``
  leaves, None for any other structure (then results are flattened)."""
  if tree == jax.tree_util.tree_structure(0):
    return -1
  n = tree.num_leaves
  if tree == jax.tree_util.tree_structure((0,) * n):
    return n
  return None


_ARRAY_TYPES = (np.ndarray, np.generic, jax.Array)


class FlatCallback:
  """The user's function with flat operands and results: the primitive's
  ``callback`` parameter. Equal for the same function, pytrees and options.

  ``arrays``: what the function gets, ``"jax"`` (``jax.Array``s on the CPU
  device, as jax's callbacks) or ``"numpy"`` (the NumPy arrays as they are)."""

  __slots__ = ("fn", "in_tree", "out_tree", "with_index", "kind", "layouts", "arrays",
               "owner", "_positional", "_out_arity", "__weakref__")

  def __init__(self, fn, in_tree, out_tree, *, with_index: bool, kind: str,
               layouts: Layouts | None = None, arrays: str = DEFAULT_ARRAYS):
    self.fn, self.in_tree, self.out_tree = fn, in_tree, out_tree
    self.with_index, self.kind, self.layouts = bool(with_index), kind, layouts
    self.owner = f"batchpart.{kind}({callback_name(fn)})"
    self.arrays = check_arrays(self.owner, arrays)
    # Positional leaves only (no nesting, no kwargs): the flat list is the
    # argument list, nothing to unflatten.
    self._positional = in_tree == jax.tree_util.tree_structure(
        (tuple(range(in_tree.num_leaves)), {}))
    self._out_arity = _leaf_arity(out_tree)

  def _key(self):
    return (self.fn, self.in_tree, self.out_tree, self.with_index, self.kind,
            self.layouts, self.arrays)

  def __eq__(self, other):
    return isinstance(other, FlatCallback) and self._key() == other._key()

  def __hash__(self):
    return hash(self._key())

  def __repr__(self):
    return self.owner

  def __call__(self, *flat_args, index=None):
    """The user's results' leaves (batch dims in front) for these flat
    operands (batch dims in front), in the user's types and layout."""
    if self.layouts is not None:
      flat_args = self.layouts.to_user(flat_args)
    if self.arrays == "jax":
      device = compat.callback_cpu_device()
      flat_args = [compat.import_host_array(_aligned(x), device) for x in flat_args]
      with compat.jax_callback_scope(device):
        out = self._call_user(flat_args, index)
    else:
      out = self._call_user(flat_args, index)
    leaves = self._leaves(out)
    return leaves if self.layouts is None else self.layouts.from_user(leaves)

  def _call_user(self, flat_args, index):
    if self._positional:
      args, kwargs = flat_args, {}
    else:
      args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, list(flat_args))
    if self.with_index:
      kwargs = {**kwargs, "index": index}
    return self.fn(*args, **kwargs)

  def _leaves(self, out) -> list:
    """``out``'s leaves, or CallbackError where its structure is not
    ``out_tree``'s."""
    arity = self._out_arity
    if arity == -1 and isinstance(out, _ARRAY_TYPES):
      return [out]
    if (arity is not None and arity >= 0 and type(out) is tuple and len(out) == arity
        and all(isinstance(r, _ARRAY_TYPES) for r in out)):
      return list(out)
    leaves, tree = jax.tree_util.tree_flatten(out)
    if tree != self.out_tree:
      raise CallbackError(
          f"{self.owner} returned a result with structure {tree}, but "
          f"result_shape_dtypes has structure {self.out_tree}.")
    return leaves


class _Block:
  """What one block vector means for a ``HostCall``, worked out once: the
  ``index`` passed to the user, each operand's cut (None: nothing to trim),
  each result's shape as the user must return it, and its padded local
  shape (None: no padding); ``empty``: all padding, with ``zeros`` to return."""

  __slots__ = ("empty", "zeros", "index", "cuts", "wants", "pads")
  empty: bool
  zeros: tuple
  index: tuple
  cuts: list | None
  wants: list
  pads: list


class HostCall:
  """What one lowered callback custom call calls, on every device.

  Static: the global batch shape, each operand's global shape and batch rank
  (batch dims right-aligned, a size-1 one broadcast), each result's global
  shape and dtype, and ``unit``: the call has no batch dims of its own and
  was given a leading one of size 1 (so that a replicated call is still
  made once); its block vector has that dim, its buffers do not.
  ``agreement``: where XLA partitions the call, how its devices
  holding only padding learn that the others failed; None where each call
  stands alone. ``reduced``: how many reduced dims the block vector
  carries parts of (``index`` adds a slice per reduced dim), ``kept``: the
  result dims that keep one (result, dim, reduction). ``halos``: per halo
  dim, its dim in each result; the block vector then ends with each one's
  window and kept part (``_vocab/blocks``), the results are the window's,
  and ``index`` adds ``(window, kept)`` slices per halo dim, after the
  reduced dims' slices. ``scans``: per scanned dim, its dim in each result
  (None in a result without it); the block vector carries its part as a
  halo dim of width 0, the results with it are the part's, and ``index``
  adds the part's slice last."""

  __slots__ = ("flat", "batch", "operand_shapes", "operand_batch_ranks",
               "result_shapes", "result_dtypes", "unit", "halos", "scans", "_trimmed_dims",
               "_blocks", "_agreement", "_kept", "_reduced", "__weakref__")

  # One entry per partition is all a program makes; the cap only bounds a
  # caller that invents block vectors.
  _MAX_BLOCKS = 1 << 16

  def __init__(self, flat: FlatCallback, *, batch, operand_shapes, operand_batch_ranks,
               result_shapes, result_dtypes, unit: bool, agreement: Agreement | None = None,
               kept=(), reduced: int = 0, halos=(), scans=()):
    self.flat = flat
    self._kept = tuple(kept)
    self._reduced = int(reduced)
    self.halos = tuple(tuple(int(d) for d in dims) for dims in halos)
    self.scans = tuple(tuple(None if d is None else int(d) for d in dims) for dims in scans)
    self._agreement = agreement
    self.batch = tuple(int(b) for b in batch)
    self.operand_shapes = [tuple(int(d) for d in s) for s in operand_shapes]
    self.operand_batch_ranks = tuple(operand_batch_ranks)
    self.result_shapes = [tuple(int(d) for d in s) for s in result_shapes]
    self.result_dtypes = [np.dtype(t) for t in result_dtypes]
    self.unit = bool(unit)
    rank = len(self.batch)
    # Per operand, the (dim, batch dim) pairs that span the whole batch (not
    # broadcast): those a short block trims.
    self._trimmed_dims = [
        tuple((m, rank - b + m) for m in range(b)
              if shape[m] == self.batch[rank - b + m] != 1)
        for shape, b in zip(self.operand_shapes, self.operand_batch_ranks)]
    self._blocks: dict[bytes, _Block] = {}

  def _block(self, block) -> _Block:
    """The ``_Block`` of this block vector, made on its first call."""
    key = block.tobytes()
    found = self._blocks.get(key)
    if found is None:
      found = self._make_block(block)
      if len(self._blocks) < self._MAX_BLOCKS:
        self._blocks[key] = found
    return found

  def _make_block(self, block) -> _Block:
    rank = len(self.batch)
    offsets, local, valid = block_extent(self.batch, block)
    parts = reduced_parts(self.batch, block, self._reduced)
    windows = halo_extents(self.batch, block, self._reduced,
                           len(self.halos) + len(self.scans))
    cores = self._part_cores(parts, windows)
    windows, scanned = windows[:len(self.halos)], windows[len(self.halos):]
    # A unit call's buffers have the user's shapes: its batch dim is the
    # block vector's alone.
    drop = int(self.unit)
    local_results = [(*local[drop:], *c) for c in cores]
    out = _Block()
    out.empty = bool(rank) and any(v == 0 for v in valid)
    out.zeros = (tuple(_frozen_zeros(s, t) for s, t in zip(local_results, self.result_dtypes))
                 if out.empty else ())
    out.cuts = [_cut(b, dims, valid, local) for b, dims in
                zip(self.operand_batch_ranks, self._trimmed_dims)]
    if all(c is None for c in out.cuts):
      out.cuts = None
    index = tuple(slice(o, o + v) for o, v in zip(offsets, valid))
    out.index = (*index[drop:], *parts,
                 *((slice(a, b), slice(c, e)) for a, b, c, e in windows),
                 *(slice(c, e) for _, _, c, e in scanned))
    out.wants = [(*valid[drop:], *c) for c in cores]
    out.pads = [None if w == full else full for w, full in zip(out.wants, local_results)]
    return out

  def _part_cores(self, parts, windows) -> list[tuple[int, ...]]:
    """Each result's core shape for this block: a dim that keeps a reduced
    dim (``kept``: result, dim, reduction) has the size of the part
    (``parts``), a halo or scanned dim the size of the window (``windows``,
    the halo dims' then the scanned dims')."""
    rank = len(self.batch)
    cores = [list(s[rank:]) for s in self.result_shapes]
    for i, dim, r in self._kept:
      cores[i][dim - rank] = parts[r].stop - parts[r].start
    for dims, (start, stop, _, _) in zip((*self.halos, *self.scans), windows):
      for k, dim in enumerate(dims):
        if dim is not None:
          cores[k][dim - rank] = stop - start
    return [tuple(c) for c in cores]

  def __call__(self, block, *args):
    b = self._block(block)
    if self._agreement is None or not self._agreement.needed:
      return self._call(b, args)
    return together(self._agreement, self.flat.owner, lambda: self._call(b, args),
                    block.tobytes(), lambda: block_start(self.batch, block), wait=b.empty)

  def _call(self, b: _Block, args) -> tuple:
    """The padded results of this block, or CallbackError."""
    if b.empty:
      # All padding: nothing of the batch is here, and nothing is called.
      return b.zeros
    if b.cuts is not None:
      args = [x if c is None else x[c] for x, c in zip(args, b.cuts)]
    try:
      outs = self.flat(*args, index=b.index)
    except CallbackError:
      raise
    except Exception as e:
      raise raised_on_block(self.flat.owner, e, b.index) from e
    if len(outs) != len(self.result_shapes):
      raise CallbackError(f"{self.flat.owner} returned {len(outs)} results; "
                          f"result_shape_dtypes has {len(self.result_shapes)}.")
    results = []
    for i, r in enumerate(outs):
      if type(r) is not np.ndarray:
        r = np.asarray(r)
      dtype = self.result_dtypes[i]
      if r.dtype != dtype:
        r = np.asarray(compat.canonicalize_value(r))
      if r.shape != b.wants[i] or r.dtype != dtype:
        raise self._mismatch(i, r, b)
      if b.pads[i] is not None:
        full = np.zeros(b.pads[i], dtype)
        full[tuple(slice(0, n) for n in r.shape)] = r
        r = full
      results.append(r)
    return tuple(results)

  def _mismatch(self, i: int, r, b: _Block) -> CallbackError:
    """The error for result ``i`` not fitting the block."""
    shape, dtype = self.result_shapes[i], self.result_dtypes[i]
    return CallbackError(
        f"{self.flat.owner}: result {i} has shape {fmt(r.shape)} and dtype {r.dtype}, but "
        f"the block {fmt_index(b.index)} of the batch needs shape {fmt(b.wants[i])} "
        f"and dtype {dtype} (the global result is {fmt(shape[1:] if self.unit else shape)}"
        f" {dtype}).")


def _cut(batch_rank: int, dims, valid, local):
  """An operand's slice to the valid part of its block, or None where the
  block is whole along every dim it spans."""
  if not any(valid[k] < local[k] for _, k in dims):
    return None
  cut = [slice(None)] * batch_rank
  for m, k in dims:
    cut[m] = slice(0, valid[k])
  return tuple(cut)


def _frozen_zeros(shape, dtype) -> np.ndarray:
  """Zeros returned for every all-padding call: read-only, since shared."""
  z = np.zeros(shape, dtype)
  z.flags.writeable = False
  return z


def block_start(batch, block) -> tuple[int, ...]:
  """Where a block vector's block starts in the global batch: the order in
  which a round's errors are preferred."""
  return tuple(block_extent(batch, block)[0])
