"""Which dims of each value in a jaxpr carry the decorated wrapper's batch dims.

A value's *dims* is a tuple with one entry per dim: the index of the
wrapper's batch dim that dim carries, the name of a reduced dim of the
wrapper's signature it carries (a string: ``reduce=``), None where it is a
core dim the declaration gives an argument (or follows from one), or
``BUILT`` where the wrapper made the dim itself (an iota, a constant or
closure, a dim a broadcast adds): such a dim may hold one entry per batch
element, which the flow cannot see, so a kernel could read it as a batch dim
as well as a core dim. None in place of
the tuple means the flow cannot tell: a primitive it does not know, or a
batch dim cut, merged, split or reordered on the way. The decorator runs it
forward from the wrapper's arguments (``forward``) and backward from its
results (``demands``), through the primitives that keep dims intact.
"""

from __future__ import annotations

from typing import Any

from batchpart import _compat as compat

# Two uses of one value that put different batch dims on one of its dims.
CLASH = -1
# A dim the wrapper made itself, not one of its arguments' (module docstring).
BUILT = -2

# Result dim d is operand dim d (operands of rank 0 broadcast).
_ELEMENTWISE = frozenset("""
    abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp
    conj convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv
    erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma log
    log1p logistic lt max min mul ne neg nextafter not or pow real
    reduce_precision rem round rsqrt select_n sharding_constraint shift_left
    shift_right_arithmetic shift_right_logical sign sin sinh sqrt square sub
    tan tanh xor""".split())
# Their `axes` leave the result; the other dims stay, in order.
_REDUCTIONS = frozenset("""
    argmax argmin reduce_and reduce_max reduce_min reduce_or reduce_prod
    reduce_sum reduce_xor""".split())
# Same shape, but elements along `axis` are combined.
_CUMULATIVE = frozenset("cumlogsumexp cummax cummin cumprod cumsum".split())


def of_array(ndim: int, lead: int, core: int, batch_rank: int) -> tuple:
  """The dims of an array with ``lead`` core dims, then batch dims, then
  ``core`` core dims: the wrapper's last batch dims, as batch dims broadcast."""
  rank = ndim - lead - core
  return (None,) * lead + tuple(range(batch_rank - rank, batch_rank)) + (None,) * core


def shared(ndim: int) -> tuple:
  """The dims of a value that carries no batch dim."""
  return (None,) * ndim


def built(ndim: int) -> tuple:
  """The dims of a value the wrapper made itself (a constant, a closure)."""
  return (BUILT,) * ndim


def is_batch(d) -> bool:
  """Whether a dims entry is one of the wrapper's batch dims."""
  return d is not None and not isinstance(d, str) and d != BUILT


def with_reduced(dims: tuple, reduced: dict[int, str]) -> tuple:
  """``dims`` with the reduced dims' names at their dims (dim -> name)."""
  return tuple(reduced.get(i, d) for i, d in enumerate(dims))


def reduced_at(dims, name: str) -> int | None:
  """The dim that carries the reduced dim ``name``, or None."""
  if dims is None:
    return None
  return next((i for i, d in enumerate(dims) if d == name), None)


def carries_none(dims) -> bool:
  """Whether the flow knows the value carries no batch or reduced dim."""
  return dims is not None and all(d is None or d == BUILT for d in dims)


def block(dims, batch_rank: int):
  """``(lead, rank)`` where ``dims`` hold the wrapper's last ``rank`` batch
  dims as one run, in order; ``(0, 0)`` where they hold none; None otherwise."""
  at = [i for i, d in enumerate(dims) if is_batch(d)]
  if not at:
    return 0, 0
  rank = len(at)
  in_order = [dims[i] for i in at] == list(range(batch_rank - rank, batch_rank))
  return (at[0], rank) if in_order and at[-1] - at[0] + 1 == rank else None


def forward(eqn, in_dims) -> list:
  """The dims of an eqn's results, from its operands' (None where it cannot
  tell). A result of values that carry no batch dim carries none; its dims
  are ``BUILT`` where the eqn makes them or a built dim feeds them."""
  maps = _dim_map(eqn)
  if all(map(carries_none, in_dims)):
    if maps is None:
      made = not in_dims or any(BUILT in d for d in in_dims)
      return [(BUILT if made else None,) * _ndim(v) for v in eqn.outvars]
  elif maps is None or any(d is None for d in in_dims):
    return [None] * len(eqn.outvars)
  out: list = [BUILT] * _ndim(eqn.outvars[0])
  for (sources, altered), dims in zip(maps, in_dims):
    if any(dims[d] is not None and dims[d] != BUILT for d in altered):
      return [None]   # a batch dim cut, merged or reordered
    # A dim no operand dim feeds intact is made here: built, unless it comes
    # from an argument's core dims cut or merged (a slice keeps a core dim core).
    fed = BUILT if not altered or any(dims[d] == BUILT for d in altered) else None
    for k, s in enumerate(sources):
      label = fed if s is None else dims[s]
      if label is None or label == BUILT:
        # An argument's core dim stays core where any operand feeds one.
        out[k] = None if label is None and out[k] == BUILT else out[k]
        continue
      if out[k] not in (None, BUILT, label):
        return [None]   # two batch dims on one dim
      out[k] = label
  return [tuple(out)]


def demands(jaxpr, out_dims) -> dict:
  """Where the uses of each value of ``jaxpr`` put the batch dims, walked back
  from its outputs' ``out_dims`` (missing or None: unknown). Values whose
  uses say nothing are left out; dims two uses disagree on are ``CLASH``."""
  want: dict[Any, Any] = {}

  def use(var, dims):
    if dims is None or isinstance(var, compat.Literal):
      return
    want[var] = _merge(want[var], dims) if var in want else tuple(dims)

  for var, dims in zip(jaxpr.outvars, out_dims):
    use(var, dims)
  for eqn in reversed(jaxpr.eqns):
    outs = [want.get(v) for v in eqn.outvars]
    if any(o is not None for o in outs):
      for var, dims in zip(eqn.invars, _backward(eqn, outs)):
        use(var, dims)
  return want


def _backward(eqn, out_dims) -> list:
  """What the dims of an eqn's results say of its operands' (None: nothing)."""
  inner = compat.called_jaxpr(eqn)
  if inner is not None:
    want = demands(inner.jaxpr, out_dims)
    return [want.get(v) for v in inner.jaxpr.invars]
  maps = _dim_map(eqn)
  if maps is None or out_dims[0] is None:
    return [None] * len(eqn.invars)
  found = []
  for (sources, _), var in zip(maps, eqn.invars):
    dims = [None] * _ndim(var)
    for k, s in enumerate(sources):
      if s is not None:
        dims[s] = out_dims[0][k]
    found.append(tuple(dims))
  return found


def _merge(a, b) -> tuple:
  """Two uses' dims of one value: each dim as either says, CLASH where both
  say and differ."""
  return tuple(x if y is None else y if x is None else x if x == y else CLASH
               for x, y in zip(a, b))


def _ndim(var) -> int:
  """The rank of a jaxpr variable or literal (0 for tokens)."""
  return len(_shape(var))


def _shape(var) -> tuple:
  """The shape of a jaxpr variable or literal (() for tokens)."""
  return tuple(getattr(var.aval, "shape", ()))


def _dim_map(eqn):
  """For each operand: the operand dim each result dim is an intact copy of
  (None: a dim it does not feed), and the operand dims it feeds otherwise
  (cut, merged, split, reordered along). Operand dims in neither (reduced,
  contracted) drop out. None for a primitive the flow does not know."""
  if len(eqn.outvars) != 1:
    return None
  name, params = eqn.primitive.name, eqn.params
  shapes, rank = [_shape(v) for v in eqn.invars], _ndim(eqn.outvars[0])
  same = tuple(range(rank))
  if name in _ELEMENTWISE:
    if any(len(s) not in (0, rank) for s in shapes):
      return None
    return [(same if s else (None,) * rank, frozenset()) for s in shapes]
  if name in _CUMULATIVE:
    return [(same, frozenset({params["axis"]}))]
  if name == "rev":
    return [(same, frozenset(params["dimensions"]))]
  if name == "transpose":
    return [(tuple(params["permutation"]), frozenset())]
  if name == "broadcast_in_dim" and len(shapes) == 1:
    sources: list[int | None] = [None] * rank
    for i, d in enumerate(params["broadcast_dimensions"]):
      sources[d] = i
    return [(tuple(sources), frozenset())]
  if name == "reshape" and params.get("dimensions") is None and len(shapes) == 1:
    mapped = _reshape_map(shapes[0], _shape(eqn.outvars[0]))
    return None if mapped is None else [mapped]
  if name == "squeeze":
    gone = {d % len(shapes[0]) for d in params["dimensions"]}
    return [(tuple(d for d in range(len(shapes[0])) if d not in gone), frozenset(gone))]
  if name in _REDUCTIONS:
    axes = set(params["axes"])
    return [(tuple(d for d in range(len(shapes[0])) if d not in axes), frozenset())]
  if name == "slice":
    strides = params["strides"] or (1,) * rank
    cut = {d for d, (start, stop, step) in enumerate(
        zip(params["start_indices"], params["limit_indices"], strides))
           if (start, stop, step) != (0, shapes[0][d], 1)}
    return [_all_but(rank, cut)]
  if name == "pad":
    cut = {d for d, lo_hi_in in enumerate(params["padding_config"])
           if tuple(lo_hi_in) != (0, 0, 0)}
    return [_all_but(rank, cut), ((None,) * rank, frozenset())]
  if name == "concatenate":
    return [_all_but(rank, {params["dimension"]})] * len(shapes)
  if name == "dot_general":
    return _dot_general_map(params["dimension_numbers"], *map(len, shapes))
  return None


def _all_but(rank: int, cut: set) -> tuple:
  """Every dim intact but those in ``cut``."""
  return tuple(None if d in cut else d for d in range(rank)), frozenset(cut)


def _reshape_map(shape, new_shape):
  """A reshape's dim map: a result dim is an operand dim intact where both
  have one size and start at the same offset in row-major order; None with
  zero-sized dims."""
  if 0 in shape or 0 in new_shape:
    return None
  sources: list[int | None] = [None] * len(new_shape)
  altered = set()
  i = j = 0
  while i < len(shape) and j < len(new_shape):
    if shape[i] == new_shape[j]:
      sources[j] = i
      i, j = i + 1, j + 1
    elif shape[i] == 1:
      altered.add(i)
      i += 1
    elif new_shape[j] == 1:
      j += 1
    else:
      # Dims merged or split: consume both sides until their sizes meet.
      size, new_size = shape[i], new_shape[j]
      altered.add(i)
      i, j = i + 1, j + 1
      while size != new_size:
        if size < new_size:
          size *= shape[i]
          altered.add(i)
          i += 1
        else:
          new_size *= new_shape[j]
          j += 1
  altered.update(range(i, len(shape)))
  return tuple(sources), frozenset(altered)


def _dot_general_map(dimension_numbers, lhs_rank: int, rhs_rank: int) -> list:
  """dot_general's dim map: the result is the batch dims, then the lhs's
  free dims, then the rhs's; contracted dims drop out."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_free = [d for d in range(lhs_rank) if d not in (*lhs_contract, *lhs_batch)]
  rhs_free = [d for d in range(rhs_rank) if d not in (*rhs_contract, *rhs_batch)]
  lhs = (*lhs_batch, *lhs_free, *(None,) * len(rhs_free))
  rhs = (*rhs_batch, *(None,) * len(lhs_free), *rhs_free)
  return [(tuple(lhs), frozenset()), (tuple(rhs), frozenset())]
