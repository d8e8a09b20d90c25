"""The report ``batchpart.explain`` returns: one ``CallReport`` per FFI
call, with the ``Collective``s XLA put around it."""

from __future__ import annotations

import dataclasses

from batchpart._explain import render

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Collective:
  """A collective XLA put in front of or behind an FFI call.

  Attributes:
    kind: the HLO opcode, e.g. ``"all-gather"``, ``"all-to-all"``,
      ``"collective-permute"``, ``"all-reduce"`` (async ``-start``/``-done``
      pairs count once, under the plain name).
    bytes: bytes of the collective's result on each device (for a combined,
      tuple-shaped collective: all of its results).
    name: the instruction's name in the compiled HLO.
    op_name: the jax operation XLA attributes it to (its metadata), e.g.
      ``"jit(f)/ffi_call"``; a collective inserted for another operation on
      the way (a ``reduce_sum`` over a sharded axis) names that operation.
  """
  kind: str
  bytes: int
  name: str = ""
  op_name: str = ""
  #: an all-reduce that combines the partial results of a call's declared
  #: reduced dims (``reduce=``): the reduction as declared, not a surprise
  declared_reduction: bool = False
  #: a collective-permute of a declared halo dim's edge slabs (``halo=``):
  #: the exchange as declared, not a surprise
  declared_halo: bool = False


@dataclasses.dataclass(frozen=True)
class CallReport:
  """One FFI call of the program.

  Attributes:
    target: the FFI target name.
    num_batch_dims: the leading dims batchpart treats as batch dims (the
      call's ``num_batch_dims`` frontend attribute), or None for a call that
      does not carry one (a plain ``jax.ffi.ffi_call``).
    operand_dtypes, result_dtypes: NumPy dtype names.
    global_operand_shapes, global_result_shapes: shapes in the program as
      written (inside ``shard_map``: the per-shard shapes the body sees).
      None for a compiled call explain could not tie to the lowered program.
    device_operand_shapes, device_result_shapes: what the kernel gets and
      returns on each device after partitioning; None if XLA removed the call.
    collectives_before: collectives feeding the call's operands.
    collectives_after: collectives consuming its results.
    replication: how many devices compute each batch element (1: no
      redundant work; ``num_devices``: every device computes everything);
      None inside ``shard_map``, for removed calls, or when the shapes do not
      determine it.
    num_devices: devices the program is partitioned over.
    source: ``file:line (function)`` of the call site in user code.
    hlo_name: the custom call's instruction name in the compiled HLO.
    op_name: the jax operation XLA attributes the call to, e.g.
      ``"jit(f)/ffi_call"``.
    in_shard_map: the call runs inside a ``shard_map`` body.
    removed: the call is not in the compiled program (XLA dropped it as
      unused or merged it with an identical call).
    callback: for a host callback, the entry point that made it:
      ``"batchpart.pure_callback(fn)"``, or for jax's own
      ``"jax.pure_callback"``, ``"jax.experimental.io_callback"`` (with
      ``" (ordered)"`` when it threads a token), ``"jax.debug.callback"``,
      ``"jax.experimental.buffer_callback"``. Operands are the user's
      arrays only (batchpart's block vector and jax's ordering token are
      left out). None for an FFI call.
    leading_core_dims: for a call whose signature puts batch dims after some
      core dims (``"(a,...,n)->(...)"``), the operands' and the results'
      number of core dims before their batch dims, e.g. ``((1,), (0,))``;
      None where every array's batch dims lead.
    reduced_dims: the call's reduced core dims (``reduce=``), each as
      ``ReducedDim``; () for none.
    declaration: the batch declaration as the user wrote it,
      ``"signature='(n)->()'"``, ``"num_batch_dims=1"``, with
      ``", reduce={'n': 'sum'}"``; None for a plain call, or a batchpart call
      whose declaration the program does not carry (one the decorator
      placed from its wrapper's declaration).
    single_device: the one device that runs the call where XLA runs it on
      one device only (jax's ``pure_callback``, ``io_callback`` and
      ``debug.callback`` under sharding: on device 0, after collectives that
      bring it every operand whole); None where every device runs it.
  """
  target: str
  num_batch_dims: int | None
  operand_dtypes: tuple[str, ...]
  result_dtypes: tuple[str, ...]
  global_operand_shapes: tuple[Shape, ...] | None
  global_result_shapes: tuple[Shape, ...] | None
  device_operand_shapes: tuple[Shape, ...] | None
  device_result_shapes: tuple[Shape, ...] | None
  collectives_before: tuple[Collective, ...]
  collectives_after: tuple[Collective, ...]
  replication: int | None
  num_devices: int
  source: str = ""
  hlo_name: str | None = None
  op_name: str = ""
  in_shard_map: bool = False
  removed: bool = False
  callback: str | None = None
  leading_core_dims: tuple[tuple[int, ...], tuple[int, ...]] | None = None
  reduced_dims: tuple[ReducedDim, ...] = ()
  declaration: str | None = None
  single_device: int | None = None
  halo_dims: tuple[HaloDimReport, ...] = ()
  scan_dims: tuple[ScanDimReport, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReducedDim:
  """A declared reduced core dim of one call.

  Attributes:
    name: its name in the signature.
    op: ``"sum"``, ``"max"``, ``"min"`` or a combiner (``"argmax"``,
      ``"argmin"``, ``"logsumexp"``).
    size: its global size (None where unknown).
    parts: how many parts the devices split it into (1: whole on every
      device, so nothing to combine; None where unknown).
  """
  name: str
  op: str
  size: int | None
  parts: int | None


@dataclasses.dataclass(frozen=True)
class HaloDimReport:
  """A declared halo dim of one call.

  Attributes:
    name: its name in the signature.
    lo, hi, periodic: its window, as declared.
    size: its global size (None where unknown).
    parts: how many parts the devices split it into (1: whole on every
      device, so nothing is exchanged; None where unknown); uneven where
      ``size`` is not a multiple, each ``ceil(size / parts)`` but the last.
    ends, cval: the stated rule at the array's ends (``bp.Halo``'s; None:
      unstated, the end windows shifted inward).
  """
  name: str
  lo: int
  hi: int
  periodic: bool
  size: int | None
  parts: int | None
  ends: str | None = None
  cval: float = 0.0


@dataclasses.dataclass(frozen=True)
class ScanDimReport:
  """A declared scanned dim of one call: ``name``, ``size`` and ``parts``
  as a ``HaloDimReport``'s.

  Attributes:
    parallel: True for two passes around one all-gather of the parts'
      summaries (the scan has a merge), False for the state handed from part
      to part by collective-permutes.
    reverse: the state flows from the end.
    moved_bytes: what the scan's own collectives bring each device (the
      summaries, or the states).
  """
  name: str
  parallel: bool
  reverse: bool
  size: int | None
  parts: int | None
  moved_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ExplainReport:
  """What ``batchpart.explain`` found; ``str()`` renders it as text.

  Attributes:
    calls: one ``CallReport`` per FFI call, in program order (a call XLA
      copied, e.g. by unrolling a loop, appears once per copy).
    num_devices: devices the program is partitioned over.
    partitioner: ``"shardy"`` or ``"gspmd"``, as configured when compiling.
    hlo_text: the compiled module's text.
  """
  calls: tuple[CallReport, ...]
  num_devices: int
  partitioner: str
  hlo_text: str = dataclasses.field(default="", repr=False, compare=False)

  def __str__(self) -> str:
    return render.render(self)
