"""The host side of ``bp.buffer_callback``: what jax's in-place callback
target calls on every device.

jax's ``xla_buffer_python_{cpu,gpu}_callback`` calls
``host_callbacks[index](ctx, *operand Buffers, *result Buffers)`` with XLA's
own buffers of the device it runs for (host memory on CPU, device memory on
GPU) and expects the results written in place. The object registered there
is a ``BufferHostCall``: it reads the block vector (operand 0), hands the
user's function ``BlockBuffer`` views of the valid part of each buffer (the
padding of an uneven shard cut off, a signature's ``...`` layout restored),
and skips a block that is all padding. Nothing is copied, and nothing goes
through a device.

``BlockBuffer`` offers the protocols of jax's ``Buffer`` on such a view:
``shape``, ``dtype``, ``ndim``, ``writeable``, ``__array__`` and
``__dlpack__`` on CPU, ``__cuda_array_interface__`` (and ``__dlpack__``
where the view is the whole buffer) on GPU. Operands are read-only, results
writable.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from batchpart._callback.agreement import Agreement, together
from batchpart._callback.errors import CallbackError, callback_name, raised_on_block
from batchpart._vocab.blocks import block_extent, whole_block
from batchpart._vocab.dims.batch import batch_first, inverse

_CPU, _CUDA, _ROCM = 1, 2, 10   # DLPack device types


def view_layout(shape, strides, valid_lead, *, order=None):
  """The shape and byte strides of a view that keeps the first
  ``valid_lead[m]`` entries of each leading dim ``m`` (None: all of it),
  then permutes dims by ``order``. The view starts where the buffer does."""
  shape = [n if v is None else v for n, v in
           zip(shape, list(valid_lead) + [None] * (len(shape) - len(valid_lead)))]
  strides = list(strides)
  if order is not None:
    shape, strides = [shape[p] for p in order], [strides[p] for p in order]
  return tuple(shape), tuple(strides)


def c_strides(shape, itemsize: int) -> tuple[int, ...]:
  """Row-major byte strides of ``shape``."""
  out, step = [], itemsize
  for n in reversed(shape):
    out.append(step)
    step *= max(int(n), 1)
  return tuple(reversed(out))


class BlockBuffer:
  """A view of one of XLA's buffers for one call: the block's part of it,
  in the user's layout. Holds the buffer, valid during the call only."""

  __slots__ = ("_base", "_device", "shape", "strides", "dtype", "writeable", "_array")

  def __init__(self, base, shape, strides, *, writeable: bool, device=None, dtype=None):
    self._base = base
    self._device = tuple(device) if device is not None else tuple(base.__dlpack_device__())
    if dtype is None:
      self.shape, self.strides = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
      self.dtype = np.dtype(base.dtype)
    else:   # from a cached layout: int tuples already
      self.shape, self.strides, self.dtype = shape, strides, dtype
    self.writeable = bool(writeable)
    self._array = None

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  def __repr__(self):
    return (f"BlockBuffer(shape={self.shape}, dtype={self.dtype}, "
            f"writeable={self.writeable})")

  def _whole(self) -> bool:
    """Whether the view is the buffer as XLA laid it out."""
    return (self.shape == tuple(self._base.shape)
            and self.strides == c_strides(self._base.shape, self.dtype.itemsize))

  def _numpy(self, writeable: bool) -> np.ndarray:
    """The view as a NumPy array on the buffer's memory (CPU only)."""
    if self._device[0] != _CPU:
      raise TypeError(
          f"a {self._device_name()} buffer has no NumPy view: use "
          "__cuda_array_interface__ (CuPy, Numba, PyTorch) or __dlpack__.")
    base = np.asarray(self._base)
    return np.lib.stride_tricks.as_strided(base, self.shape, self.strides,
                                           writeable=writeable)

  def __array__(self, dtype=None, copy=None):
    if self._array is None:
      self._array = self._numpy(self.writeable)
    out = self._array
    if dtype is not None and np.dtype(dtype) != out.dtype:
      if copy is False:
        raise ValueError(f"a {out.dtype} buffer cannot be viewed as {np.dtype(dtype)} "
                         "without a copy.")
      return out.astype(dtype)
    return out.copy() if copy else out

  def __dlpack_device__(self):
    return self._device

  def __dlpack__(self, **kwargs):
    if self._device[0] == _CPU:
      # DLPack cannot mark a tensor read-only, as jax's own Buffer cannot.
      return self._numpy(True).__dlpack__(**kwargs)
    if self._whole():
      return self._base.__dlpack__(**kwargs)
    raise BufferError(
        f"this {self._device_name()} buffer view ({self.shape}, a block of a "
        f"{tuple(self._base.shape)} buffer) has no DLPack export; use "
        "__cuda_array_interface__ (CuPy, Numba, PyTorch's torch.as_tensor).")

  @property
  def __cuda_array_interface__(self) -> dict:
    if self._device[0] not in (_CUDA, _ROCM):
      raise AttributeError("__cuda_array_interface__ exists on CUDA and ROCm buffers only")
    return cuda_array_interface(self._base.__cuda_array_interface__, self.shape,
                                self.strides, self.dtype.itemsize, self.writeable)

  def _device_name(self) -> str:
    return {_CUDA: "CUDA", _ROCM: "ROCm"}.get(self._device[0], f"device {self._device}")


def cuda_array_interface(base: dict, shape, strides, itemsize: int, writeable: bool
                         ) -> dict:
  """The interface of a view starting where ``base``'s buffer does, with this
  shape and byte strides (None where they are row-major, as the protocol
  asks); ``base``'s other entries (type, stream) are kept."""
  out = dict(base)
  out["shape"] = tuple(shape)
  out["strides"] = None if tuple(strides) == c_strides(shape, itemsize) else tuple(strides)
  out["data"] = (int(base["data"][0]), not writeable)
  out["version"] = max(int(base.get("version", 3)), 3)
  return out


class BufferCallback:
  """The user's function and its argument structure: the primitive's
  ``callback`` parameter. Equal for the same function, pytrees and options
  (jit caches hit)."""

  __slots__ = ("fn", "in_tree", "out_tree", "with_index", "layouts", "__weakref__")
  kind = "buffer_callback"

  def __init__(self, fn, in_tree, out_tree, *, with_index: bool, layouts=None):
    self.fn, self.in_tree, self.out_tree = fn, in_tree, out_tree
    self.with_index, self.layouts = bool(with_index), layouts

  def _key(self):
    return (self.fn, self.in_tree, self.out_tree, self.with_index, self.layouts)

  def __eq__(self, other):
    return isinstance(other, BufferCallback) and self._key() == other._key()

  def __hash__(self):
    return hash(self._key())

  def __repr__(self):
    return self.owner

  @property
  def owner(self) -> str:
    return f"batchpart.buffer_callback({callback_name(self.fn)})"

  def __call__(self, ctx, ins, outs, index=None):
    """Calls ``fn(ctx, out, *args, **kwargs)`` on the views; it must write
    ``out`` and return None."""
    import jax
    args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, list(ins))
    out = jax.tree_util.tree_unflatten(self.out_tree, list(outs))
    if self.with_index:
      kwargs = {**kwargs, "index": index}
    if self.fn(ctx, out, *args, **kwargs) is not None:
      raise CallbackError(f"{self.owner} returned a value: a buffer callback writes its "
                          "results into `out` in place and must return None.")


class BufferHostCall:
  """What one lowered buffer callback calls, on every device.

  Static, as ``HostCall``'s: the global batch shape, each operand's global
  shape and batch rank (right-aligned; a size-1 batch dim is broadcast and
  passed whole), each result's global shape, ``unit`` (the call had no batch
  dims and was given a leading one of size 1, which its block vector has
  and its buffers do not) and, per operand and result,
  the dim order back to the user's layout (None where batch dims lead), and
  ``agreement`` (as ``HostCall``'s)."""

  __slots__ = ("flat", "batch", "operand_shapes", "operand_batch_ranks", "result_shapes",
               "unit", "operand_orders", "result_orders", "_whole", "_layouts", "_agreement",
               "__weakref__")

  def __init__(self, flat: BufferCallback, *, batch, operand_shapes, operand_batch_ranks,
               result_shapes, unit: bool, result_dtypes=None,
               agreement: Agreement | None = None):
    del result_dtypes   # XLA's buffers carry them: nothing to check or convert
    self.flat = flat
    self._agreement = agreement
    self.batch = tuple(int(b) for b in batch)
    self.operand_shapes = [tuple(int(d) for d in s) for s in operand_shapes]
    self.operand_batch_ranks = tuple(operand_batch_ranks)
    self.result_shapes = [tuple(int(d) for d in s) for s in result_shapes]
    self.unit = bool(unit)
    leads = flat.layouts or ((0,) * len(operand_shapes), (), (0,) * len(result_shapes), ())
    rank = len(self.batch)
    self.operand_orders = [_user_order(len(s) - self.unit, lead, b - self.unit)
                           for s, lead, b in zip(self.operand_shapes, leads[0],
                                                 self.operand_batch_ranks)]
    self.result_orders = [_user_order(len(s) - self.unit, lead, rank - self.unit)
                          for s, lead in zip(self.result_shapes, leads[2])]
    self._whole = block_extent(self.batch, whole_block(self.batch))
    # (buffer position, its shape, the valid rows) -> the view's shape, strides and dtype:
    # a program calls with the same few blocks every time.
    self._layouts: dict = {}

  def __call__(self, ctx, block, *buffers):
    whole = self._holds_whole(buffers)
    vector = None if whole else read_block_vector(block, ctx)
    offsets, _, valid = self._whole if whole else block_extent(self.batch, vector)
    # All padding: nothing of the batch is here, and nothing is called.
    empty = bool(self.batch) and any(v == 0 for v in valid)
    if self._agreement is None or not self._agreement.needed:
      return () if empty else self._call(ctx, offsets, valid, buffers)
    return together(self._agreement, self.flat.owner,
                    lambda: () if empty else self._call(ctx, offsets, valid, buffers),
                    None if whole else vector.tobytes(), lambda: tuple(offsets), wait=empty)

  def _call(self, ctx, offsets, valid, buffers) -> tuple:
    """Calls the user's function on the views of the block at ``offsets``
    with ``valid`` elements per batch dim; CallbackError where it raises."""
    rank = len(self.batch)
    n_in = len(self.operand_shapes)
    valid_key = tuple(valid)
    # A unit call's buffers have the user's shapes: its batch dim is the
    # block vector's alone.
    ins = [self._view(i, buf, shape, b - self.unit, valid_key, order, writeable=False)
           for i, (buf, shape, b, order) in enumerate(zip(
               buffers[:n_in], self.operand_shapes, self.operand_batch_ranks,
               self.operand_orders))]
    outs = [self._view(n_in + i, buf, shape, rank - self.unit, valid_key, order,
                       writeable=True)
            for i, (buf, shape, order) in enumerate(zip(buffers[n_in:], self.result_shapes,
                                                        self.result_orders))]
    index = tuple(slice(o, o + v) for o, v in zip(offsets, valid))[int(self.unit):]
    try:
      self.flat(ctx, ins, outs, index=index)
    except CallbackError:
      raise
    except Exception as e:
      raise raised_on_block(self.flat.owner, e, index) from e
    return ()

  def _holds_whole(self, buffers) -> bool:
    """Whether this device's buffers hold the whole batch, as on one device,
    so the block vector need not be read (on a GPU that is a copy and a wait
    for the stream). Whole means every batch dim at its global extent, at
    least 2: a partitioned program splits some batch dim over its devices
    (blocks.py never leaves them replicating one), which shortens it, while a
    dim of extent 1 keeps its extent on a device whose block is all padding."""
    rank = len(self.batch)
    if not rank or min(self.batch) < 2:
      return False
    n_in = len(self.operand_shapes)
    if len(buffers) > n_in:
      return tuple(buffers[n_in].shape[:rank]) == self.batch   # results lead with the batch
    return any(b == rank and tuple(buf.shape[:rank]) == self.batch
               for buf, b in zip(buffers, self.operand_batch_ranks))

  def _view(self, position, buf, global_shape, batch_rank, valid, order, *, writeable):
    """``buf`` cut to the block's valid rows (a batch dim the operand
    broadcasts is passed whole), in the user's layout."""
    key = (position, tuple(buf.shape), valid)
    layout = self._layouts.get(key)
    if layout is None:
      rank = len(self.batch)
      cut = [valid[rank - batch_rank + m]
             if global_shape[m] == self.batch[rank - batch_rank + m] != 1 else None
             for m in range(batch_rank)]
      dtype = np.dtype(buf.dtype)
      shape, strides = view_layout(key[1], c_strides(key[1], dtype.itemsize), cut,
                                   order=order)
      layout = self._layouts[key] = (shape, strides, dtype)
    shape, strides, dtype = layout
    return BlockBuffer(buf, shape, strides, writeable=writeable,
                       device=buf.__dlpack_device__(), dtype=dtype)


def _user_order(ndim: int, lead: int, batch_rank: int):
  """The dim order from batch-first back to the user's layout (None where
  batch dims already lead)."""
  if not lead or batch_rank <= 0:
    return None
  return inverse(batch_first(ndim, lead, batch_rank))


def read_block_vector(block, ctx) -> np.ndarray:
  """The block vector's int64 values, wherever its buffer lives: a NumPy view
  on CPU, a copy on the call's stream (``ctx.stream``, GPU only) on GPU."""
  device = tuple(block.__dlpack_device__())[0]
  if device == _CPU:
    return np.asarray(block).reshape(-1)
  interface = block.__cuda_array_interface__
  n = math.prod(interface["shape"])
  return device_to_host(int(interface["data"][0]), n, int(ctx.stream or 0),
                        _driver(device))


class _Driver:
  """The two GPU runtime calls reading the block vector needs: an async
  device-to-host copy on a stream and waiting for that stream."""

  def __init__(self, library: str, copy: str, sync: str):
    lib = ctypes.CDLL(library)
    self.copy = getattr(lib, copy)
    self.copy.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    self.sync = getattr(lib, sync)
    self.sync.argtypes = [ctypes.c_void_p]


_drivers: dict[int, _Driver] = {}


def _driver(device: int) -> _Driver:
  if device not in _drivers:
    if device == _CUDA:
      _drivers[device] = _Driver("libcuda.so.1", "cuMemcpyDtoHAsync_v2", "cuStreamSynchronize")
    elif device == _ROCM:
      _drivers[device] = _Driver("libamdhip64.so", "hipMemcpyDtoHAsync", "hipStreamSynchronize")
    else:
      raise CallbackError(f"buffer_callback: no block-vector reader for DLPack device {device}")
  return _drivers[device]


def device_to_host(pointer: int, n: int, stream: int, driver) -> np.ndarray:
  """``n`` int64 values at device address ``pointer``, copied on ``stream``
  (ordered after the work that wrote them) and waited for."""
  out = np.empty(n, np.int64)
  status = driver.copy(out.ctypes.data, pointer, out.nbytes, stream)
  if status == 0:
    status = driver.sync(stream)
  if status != 0:
    raise CallbackError(f"buffer_callback: reading the block vector from the GPU failed "
                        f"(status {status}).")
  return out
