"""Reduced core dims on one device: ``reduce={"n": op}``.

What a reduction declares must be checked where it is declared, because a
wrong declaration gives wrong numbers only once a program is sharded: so
every malformed ``reduce=`` (a dim that a result has, that the signature
lacks, that one operand has twice, a numeric dim, an unknown op, mixed ops,
``num_batch_dims``, results the op cannot combine) is refused by
``bp.ffi_call`` and by each adoption entry point, naming the dim and the
declaring call. The declaration travels in the derived target name (``$x``
and ``$k`` fields), which must round-trip, and in the Shardy rule, where the
reduced dim is one reduction factor shared by every operand that has it and
by no result. Under vmap the reduced dim stays reduced. Values of
``batchpart_test_reduce_rows`` (op over n of ``w[n] * x[n, k]``) are checked
against NumPy for every op and dtype.
"""

import itertools
import re

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.interpreters import mlir

import batchpart as bp
from batchpart import _compat as compat, testing as kernels
from batchpart._frontend.signature import parse_signature
from batchpart._partition import sharding_rule
from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription, default_layout
from batchpart._vocab.dims.core import DimName
from batchpart._vocab.dims.reduced import ALL_OPS, Reduction

TARGET = "batchpart_test_reduce_rows"
OWNER = re.escape(f"batchpart.ffi_call('{TARGET}')")
SIG = "(n,k),(n)->(k)"
S = jax.ShapeDtypeStruct
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.complex64, np.complex128]
OPS = ["sum", "max", "min"]


def _attrs(op):
  return {"op": np.int64(kernels.REDUCE_OPS[op]), "rows": np.int64(-1)}


_operands = kernels.reduce_rows_operands


def _assert_close(actual, expected, dtype=None):
  """``actual`` has ``dtype`` (``expected``'s if None: NumPy sums small
  integers in int64) and ``expected``'s values."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  if dtype is not None:
    expected = expected.astype(dtype)
  assert actual.shape == expected.shape and actual.dtype == expected.dtype
  if expected.dtype.kind == "i":
    np.testing.assert_array_equal(actual, expected)
  else:
    tol = 1e-5 if expected.dtype in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * 10)


def _derived_name(text: str) -> str:
  (name,) = re.findall(r'batchpart.derived_name = "([^"]+)"', text)
  return name


# ---- reduce= checks: bp.ffi_call ---------------------------------------------------

BAD_REDUCE = [
    # (signature, reduce, exception, message pattern)
    ("(n,k),(n)->(k),(n,n)", {"n": "sum"}, ValueError,
     "dim 'n', which appears twice in one result"),
    (SIG, {"m": "sum"}, ValueError, "dim 'm', which is not a core dim of any operand"),
    ("(n,n),(n)->(k)", {"n": "sum"}, ValueError, "dim 'n', which appears twice in one operand"),
    ("(n,3),(n)->(3)", {"3": "sum"}, ValueError, "dim '3', which is not a named core dim"),
    (SIG, {"...": "sum"}, ValueError, r"dim '\.\.\.', which is not a named core dim"),
    (SIG, {"n": "avg"}, ValueError, "reduced dim 'n' has the unknown op 'avg'"),
    (SIG, {"n": "mean"}, ValueError, "reduced dim 'n' has the unknown op 'mean'"),
    ("(n,m,k),(n,m)->(k)", {"n": "sum", "m": "max"}, ValueError,
     "combines dims with different ops"),
    (SIG, ["n"], TypeError, "reduce must be a dict of core dim name -> op"),
    (SIG, {1: "sum"}, TypeError, "reduce must be a dict of core dim name -> op"),
]


@pytest.mark.parametrize("signature, reduce, error, message", BAD_REDUCE)
def test_ffi_call_refuses_a_bad_reduce_naming_the_dim_and_target(signature, reduce, error,
                                                                 message):
  with pytest.raises(error, match=OWNER + ".*" + message):
    bp.ffi_call(TARGET, S((4, 3), np.float32), signature=signature, reduce=reduce)


def test_ffi_call_refuses_reduce_with_num_batch_dims():
  with pytest.raises(ValueError, match=OWNER + r".*reduce=\{'n': 'sum'\} names core dims, "
                     "which only a signature declares"):
    bp.ffi_call(TARGET, S((4, 3), np.float32), num_batch_dims=1, reduce={"n": "sum"})


@pytest.mark.parametrize("dtype, op", [
    (np.bool_, "sum"), (np.bool_, "max"), (np.bool_, "min"),
    (np.complex64, "max"), (np.complex64, "min"), (np.complex128, "max"),
    (np.complex128, "min"),
])
def test_ffi_call_refuses_results_the_op_cannot_combine(dtype, op):
  name = np.dtype(dtype).name
  with pytest.raises(ValueError, match=OWNER + f".*result 0 has dtype {name}, which "
                     f"reduce '{op}' over the dim\\(s\\) n cannot combine"):
    bp.ffi_call(TARGET, S((4, 3), dtype), signature=SIG, reduce={"n": op})


def test_ffi_call_checks_every_result_dtype():
  results = (S((4, 3), np.float32), S((4, 3), np.complex64))
  with pytest.raises(ValueError, match=OWNER + ".*result 1 has dtype complex64"):
    bp.ffi_call(TARGET, results, signature="(n,k),(n)->(k),(k)", reduce={"n": "min"})


@pytest.mark.parametrize("dtype, op", [(np.complex64, "sum"), (np.complex128, "sum"),
                                       (np.int32, "max"), (np.int64, "min"),
                                       (np.float32, "max")])
def test_results_the_op_combines_are_accepted(dtype, op):
  bp.ffi_call(TARGET, S((4, 3), dtype), signature=SIG, reduce={"n": op})


def test_empty_reduce_declares_nothing():
  x, w = _operands(np.random.default_rng(0), (4,), 5, 3, np.float32)

  def call(reduce):
    return bp.ffi_call(TARGET, S((4, 3), np.float32), signature=SIG, reduce=reduce)(
        x, w, **_attrs("sum"))

  assert _derived_name(jax.jit(lambda: call({})).lower().as_text()) == \
      _derived_name(jax.jit(lambda: call(None)).lower().as_text())


# ---- reduce= checks: the adoption entry points ----------------------------------------

_primitive_count = itertools.count()


def _reduce_rows_primitive():
  """A package-style primitive lowering to the reduce_rows kernel with
  jax's own ffi_lowering."""
  p = compat.Primitive(f"reductions_reduce_rows_{next(_primitive_count)}")
  p.def_abstract_eval(lambda x, w, **_: compat.ShapedArray(
      (*x.shape[:-2], x.shape[-1]), x.dtype))
  p.def_impl(lambda *args, **params: jax.jit(lambda *a: p.bind(*a, **params))(*args))
  mlir.register_lowering(p, jax.ffi.ffi_lowering(TARGET), platform="cpu")
  return p


def _declare(entry, **kwargs):
  """Declares through one adoption entry point; returns the name its errors
  carry and an undo."""
  if entry == "partition_ffi_target":
    bp.partition_ffi_target(TARGET, **kwargs)
    return f"batchpart.partition_ffi_target('{TARGET}')", lambda: bp.unpartition(TARGET)
  if entry == "partition_primitive":
    p = _reduce_rows_primitive()
    bp.partition_primitive(p, **kwargs)
    return f"batchpart.partition_primitive('{p.name}')", lambda: bp.unpartition(p)
  bp.ffi_lowering(TARGET, **kwargs)
  return f"batchpart.ffi_lowering('{TARGET}')", lambda: None


ENTRIES = ["partition_ffi_target", "partition_primitive", "ffi_lowering"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("signature, reduce, error, message", BAD_REDUCE)
def test_adoption_refuses_a_bad_reduce_naming_the_dim_and_declaration(entry, signature, reduce,
                                                                       error, message):
  owner = {"partition_ffi_target": re.escape(f"batchpart.partition_ffi_target('{TARGET}')"),
           "partition_primitive": r"batchpart\.partition_primitive\('reductions_reduce_rows_\d+'\)",
           "ffi_lowering": re.escape(f"batchpart.ffi_lowering('{TARGET}')")}[entry]
  with pytest.raises(error, match=owner + ".*" + message):
    _declare(entry, signature=signature, reduce=reduce)
  if entry == "partition_ffi_target":   # nothing was declared
    assert _plain_call_is_not_retargeted()


def _plain_call_is_not_retargeted() -> bool:
  """A plain jax.ffi.ffi_call to the target lowers without a derived name."""
  f = jax.jit(lambda x, w: jax.ffi.ffi_call(TARGET, S((4, 3), np.float32))(x, w, **_attrs("sum")))
  text = f.lower(np.ones((4, 5, 3), np.float32), np.ones((4, 5), np.float32)).as_text()
  return "batchpart.derived_name" not in text


@pytest.mark.parametrize("entry", ENTRIES)
def test_adoption_refuses_reduce_with_num_batch_dims(entry):
  with pytest.raises(ValueError, match="names core dims, which only a signature declares"):
    _declare(entry, num_batch_dims=1, reduce={"n": "sum"})


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype, op", [(np.complex64, "max"), (np.bool_, "sum")])
def test_adopted_calls_refuse_results_the_op_cannot_combine(entry, dtype, op):
  """The adopted call's dtypes are known only when it is lowered: the error
  names the declaration and its call."""
  x = np.ones((4, 5, 3), dtype)
  w = np.ones((4, 5), dtype)
  if entry == "ffi_lowering":
    p = _reduce_rows_primitive()
    mlir.register_lowering(p, bp.ffi_lowering(TARGET, signature=SIG, reduce={"n": op}),
                           platform="cpu")
    owner, undo = f"batchpart.ffi_lowering('{TARGET}')", lambda: None
    f = jax.jit(lambda x, w: p.bind(x, w, **_attrs(op)))
  elif entry == "partition_primitive":
    p = _reduce_rows_primitive()
    bp.partition_primitive(p, signature=SIG, reduce={"n": op})
    owner, undo = f"batchpart.partition_primitive('{p.name}')", lambda: bp.unpartition(p)
    f = jax.jit(lambda x, w: p.bind(x, w, **_attrs(op)))
  else:
    owner, undo = _declare(entry, signature=SIG, reduce={"n": op})
    f = jax.jit(lambda x, w: jax.ffi.ffi_call(TARGET, S((4, 3), dtype))(x, w, **_attrs(op)))
  try:
    with pytest.raises(ValueError, match=re.escape(f"{owner} (its call to '{TARGET}')") +
                       f".*result 0 has dtype {np.dtype(dtype).name}, which reduce '{op}'"):
      f.lower(x, w)
  finally:
    undo()


@pytest.mark.parametrize("entry", ENTRIES)
def test_adopted_calls_carry_the_reduction_and_compute_it(entry):
  rng = np.random.default_rng(3)
  x, w = _operands(rng, (4,), 6, 3, np.float32)
  if entry == "partition_ffi_target":
    bp.partition_ffi_target(TARGET, signature=SIG, reduce={"n": "max"})
    undo = lambda: bp.unpartition(TARGET)
    f = jax.jit(lambda x, w: jax.ffi.ffi_call(TARGET, S((4, 3), x.dtype))(x, w, **_attrs("max")))
  else:
    p = _reduce_rows_primitive()
    if entry == "partition_primitive":
      bp.partition_primitive(p, signature=SIG, reduce={"n": "max"})
      undo = lambda: bp.unpartition(p)
    else:
      mlir.register_lowering(p, bp.ffi_lowering(TARGET, signature=SIG, reduce={"n": "max"}),
                             platform="cpu")
      undo = lambda: None
    f = jax.jit(lambda x, w: p.bind(x, w, **_attrs("max")))
  try:
    name = _derived_name(f.lower(x, w).as_text())
    assert "$x:n=max:0.-2,1.-1" in name
    _assert_close(f(x, w), kernels.reduce_rows_reference(x, w, "max"))
  finally:
    undo()


# ---- derived names -----------------------------------------------------------------

def test_the_lowered_call_names_its_reduction_and_dims():
  x, w = _operands(np.random.default_rng(0), (4,), 5, 3, np.float32)
  text = jax.jit(lambda x, w: kernels.reduce_rows(x, w, "min")).lower(x, w).as_text()
  name = _derived_name(text)
  assert name == ("batchpart_test_reduce_rows$bp1$o1,1$r1$no3,2$nr2"
                  "$x:n=min:0.-2,1.-1$k:n=o0.-2$k:k=o0.-1")
  d = derived_names.decode(name)
  assert d.reductions == (Reduction("n", "min", ((0, -2), (1, -1))),)
  assert d.dim_names == (DimName("n", "o", 0, -2), DimName("k", "o", 0, -1))
  assert derived_names.encode(d) == name


def test_reductions_and_dim_names_give_distinct_names():
  base = CallDescription("k", (1, 1), (1,), ((2, 1, 0), (1, 0)), ((1, 0),))
  sums = CallDescription("k", (1, 1), (1,), ((2, 1, 0), (1, 0)), ((1, 0),),
                         reductions=(Reduction("n", "sum", ((0, -2), (1, -1))),))
  maxes = CallDescription("k", (1, 1), (1,), ((2, 1, 0), (1, 0)), ((1, 0),),
                          reductions=(Reduction("n", "max", ((0, -2), (1, -1))),))
  names = {derived_names.encode(d) for d in (base, sums, maxes)}
  assert len(names) == 3
  assert derived_names.encode(base) == "k$bp1$o1,1$r1$no3,2$nr2"
  assert derived_names.encode(sums) == "k$bp1$o1,1$r1$no3,2$nr2$x:n=sum:0.-2,1.-1"


@st.composite
def reduced_descriptions(draw):
  """Descriptions with leading and trailing core dims, reductions over some
  operands' core axes (one op, at most one axis per operand and reduction,
  no axis in two reductions) and named dims."""
  def arrays(n, min_rank=0):
    ranks = draw(st.lists(st.integers(min_rank, 4), min_size=n, max_size=n))
    batch = tuple(draw(st.integers(0, r)) for r in ranks)
    leads = tuple(draw(st.integers(0, r - b)) for r, b in zip(ranks, batch))
    layouts = tuple(default_layout(r) for r in ranks)
    return ranks, batch, leads, layouts

  def core_axes(rank, batch, lead):
    return list(range(lead)) + list(range(-(rank - lead - batch), 0))

  n_in, n_out = draw(st.integers(1, 3)), draw(st.integers(0, 2))
  ranks, ob, op, ol = arrays(n_in, min_rank=1)
  rranks, rb, rp, rl = arrays(n_out)
  free = {k: core_axes(r, b, p) for k, (r, b, p) in enumerate(zip(ranks, ob, op))}
  names = iter(["n", "m", "p", "q", "s"])
  reductions = []
  op_name = draw(st.sampled_from(ALL_OPS))
  for _ in range(draw(st.integers(0, 3))):
    dims = []
    for k in sorted(draw(st.sets(st.sampled_from(range(n_in)), min_size=1))):
      if free[k]:
        axis = draw(st.sampled_from(free[k]))
        free[k].remove(axis)
        dims.append((k, axis))
    if dims:
      reductions.append(Reduction(next(names), op_name, tuple(dims)))
  dim_names = []
  for kind, rs, bs, ps in (("o", ranks, ob, op), ("r", rranks, rb, rp)):
    for i, (r, b, p) in enumerate(zip(rs, bs, ps)):
      axes = core_axes(r, b, p)
      if axes and draw(st.booleans()):
        dim_names.append(DimName(f"{kind}{i}d", kind, i, draw(st.sampled_from(axes))))
  return CallDescription(
      target=draw(st.sampled_from(["k", "my_nufft", "a.b-c"])),
      operand_batch_ranks=ob, result_batch_ranks=rb, operand_layouts=ol,
      result_layouts=rl, has_side_effect=draw(st.booleans()),
      attribute_rule=draw(st.sampled_from(["", "rule-1"])),
      operand_lead_ranks=op, result_lead_ranks=rp,
      reductions=tuple(reductions), dim_names=tuple(dim_names))


@given(reduced_descriptions())
def test_decode_inverts_encode_with_reductions(d):
  name = derived_names.encode(d)
  assert derived_names.user_target(name) == d.target
  assert derived_names.decode(name) == d


@given(reduced_descriptions(), reduced_descriptions())
def test_distinct_reduced_descriptions_have_distinct_names(a, b):
  assert (derived_names.encode(a) == derived_names.encode(b)) == (a == b)


PLAIN = "k$bp1$o1$r1$no3$nr2"


@pytest.mark.parametrize("fields", [
    "$x:n=avg:0.-1",            # unknown op
    "$x:n=sum:",                # no dims
    "$x:n=sum",                 # no dims
    "$x:=sum:0.-1",             # no name
    "$x:n=sum:0.0",             # a batch dim, not a core axis
    "$x:n=sum:0.-3",            # past the core dims
    "$x:n=sum:1.-1",            # no operand 1
    "$x:n=sum:0.-1$x:m=max:0.-2",   # mixed ops
    "$x:n=sum:0.-1$x:n=sum:0.-2",   # one name twice
    "$x:n=sum:0.-1$x:m=sum:0.-1",   # one axis in two reductions
    "$x:n=sum:0.-1,0.-2",       # one operand twice
    "$k:n=o0.-1$k:n=o0.-2",     # one dim name twice
    "$k:n=r0.-2",               # past the result's core dims
    "$k:n=q0.-1",               # neither operand nor result
])
def test_malformed_reduction_fields_are_refused(fields):
  with pytest.raises(ValueError, match="cannot read the derived target name"):
    derived_names.decode(PLAIN + fields)


# ---- the Shardy rule -----------------------------------------------------------------

def _factors(signature, reduce, operand_shapes, result_shapes):
  parsed = parse_signature(signature, owner="test")
  reductions = parsed.reductions(reduce, owner="test")
  spec = parsed.spec(reductions)
  core = spec.operand_core_ranks
  lead = spec.operand_leads
  first = operand_shapes[0]
  batch_shape = first[lead[0]:len(first) - core[0]]
  return sharding_rule.factors(operand_shapes, core, result_shapes, spec.result_core_ranks,
                               batch_shape, spec.operand_lead_ranks, spec.result_lead_ranks,
                               reductions)


def test_rule_has_one_reduction_factor_shared_by_the_operands():
  lhs, rhs, need_replication, reduced = _factors(SIG, {"n": "sum"},
                                                 [(4, 64, 3), (4, 64)], [(4, 3)])
  assert sharding_rule.text(lhs, rhs) == "b0 x0 o0_2, b0 x0 -> b0 r0_1"
  assert reduced == ("x0",)
  assert "x0" not in need_replication and "x0" not in rhs[0]
  assert set(need_replication) == {"o0_2", "r0_1"}


def test_reduction_factor_is_never_a_result_core_dim_of_the_same_size():
  # n == k: the result's k, at n's core position in x, must not take n's factor.
  lhs, rhs, need_replication, reduced = _factors(SIG, {"n": "sum"},
                                                 [(4, 3, 3), (4, 3)], [(4, 3)])
  assert reduced == ("x0",)
  assert rhs == [["b0", "r0_1"]]
  assert lhs[0][1] == lhs[1][1] == "x0"
  assert "r0_1" in need_replication
  # The same call without a reduction shares that factor (an elementwise core dim).
  _, rhs, _, reduced = _factors(SIG, None, [(4, 3, 3), (4, 3)], [(4, 3)])
  assert reduced == () and rhs == [["b0", "o0_1"]]


def test_operand_without_the_reduced_dim_keeps_its_own_factors():
  lhs, rhs, need_replication, reduced = _factors(
      "(n,k),(n),(k)->(k)", {"n": "max"}, [(2, 8, 3), (2, 8), (2, 3)], [(2, 3)])
  assert reduced == ("x0",)
  assert lhs[0][1] == lhs[1][1] == "x0"
  assert "x0" not in lhs[2]
  assert rhs[0][0] == "b0"


def test_two_reduced_dims_are_two_factors():
  lhs, _, need_replication, reduced = _factors(
      "(n,m,k),(n,m)->(k)", {"n": "sum", "m": "sum"}, [(6, 4, 3), (6, 4)], [(3,)])
  assert reduced == ("x0", "x1")
  assert lhs == [["x0", "x1", "o0_2"], ["x0", "x1"]]
  assert not set(reduced) & set(need_replication)


def test_reduced_dim_among_batch_dims_in_the_middle():
  # k leads, n trails; the batch dims lie between them.
  lhs, rhs, _, reduced = _factors("(k,...,n),(n,...)->(...,k)", {"n": "max"},
                                  [(3, 4, 64), (64, 4)], [(4, 3)])
  assert reduced == ("x0",)
  assert lhs == [["o0_0", "b0", "x0"], ["x0", "b0"]]
  assert "x0" not in rhs[0]


def test_rule_attribute_names_the_reduction():
  parsed = parse_signature(SIG, owner="test")
  reductions = parsed.reductions({"n": "sum"}, owner="test")
  ir = compat.ir
  with compat.make_ir_context() as ctx, ir.Location.unknown(ctx):
    f32 = ir.F32Type.get()
    t = lambda shape: ir.RankedTensorType.get(shape, f32)
    attr = sharding_rule.attribute_for_types(
        [(4, 64, 3), (4, 64)], (2, 1), [(4, 3)], (1,), (4,), [t((4, 64, 3)), t((4, 64))],
        [t((4, 3))], reductions=reductions)
    text = str(attr)
  assert text == ("#sdy.op_sharding_rule<([i, j, k], [i, j])->([i, l]) "
                  "{i=4, j=64, k=3, l=3} reduction={j} need_replication={k, l}, custom>")


# ---- values ------------------------------------------------------------------------

@pytest.mark.parametrize("op, dtype", [
    (op, dtype) for op in OPS for dtype in DTYPES
    if op == "sum" or np.dtype(dtype).kind != "c"   # max and min do not order complex
], ids=lambda v: v if isinstance(v, str) else np.dtype(v).name)
def test_values_for_every_op_and_dtype(op, dtype):
  with jax.enable_x64(True):
    x, w = _operands(np.random.default_rng(7), (3, 2), 9, 4, dtype)
    out = jax.jit(lambda x, w: kernels.reduce_rows(x, w, op))(x, w)
    _assert_close(out, kernels.reduce_rows_reference(x, w, op), dtype)
    # Declaring n reduced does not change what the kernel computes here.
    _assert_close(out, kernels.reduce_rows(x, w, op, reduce=False), dtype)


@pytest.mark.parametrize("batch, n", [((), 7), ((5,), 1), ((2, 3, 2), 4)])
def test_values_for_other_batch_ranks_and_sizes(batch, n):
  x, w = _operands(np.random.default_rng(8), batch, n, 2, np.float32)
  for op in OPS:
    _assert_close(kernels.reduce_rows(x, w, op), kernels.reduce_rows_reference(x, w, op))


def test_rows_attribute_is_checked_by_the_kernel():
  x, w = _operands(np.random.default_rng(9), (2,), 6, 3, np.float32)
  _assert_close(kernels.reduce_rows(x, w, rows=6), kernels.reduce_rows_reference(x, w))
  with pytest.raises(Exception, match="rows=5 but the call has 6 rows"):
    np.asarray(kernels.reduce_rows(x, w, rows=5))


# ---- vmap --------------------------------------------------------------------------

@pytest.mark.parametrize("in_axes", [0, 1, 2, -1])
@pytest.mark.parametrize("op", OPS)
def test_vmap_adds_a_batch_dim_and_keeps_n_reduced(op, in_axes):
  rng = np.random.default_rng(10)
  x, w = _operands(rng, (5, 3), 6, 4, np.float32)   # vmapped over the 5
  xm, wm = np.moveaxis(x, 0, in_axes), np.moveaxis(w, 0, in_axes)
  f = jax.vmap(lambda x, w: kernels.reduce_rows(x, w, op), in_axes=(in_axes, in_axes))
  text = jax.jit(f).lower(xm, wm).as_text()
  assert text.count("stablehlo.custom_call") == 1 and "stablehlo.while" not in text
  d = derived_names.decode(_derived_name(text))
  assert d.reductions == (Reduction("n", op, ((0, -2), (1, -1))),)
  assert d.operand_batch_ranks == (2, 2) and d.result_batch_ranks == (2,)
  _assert_close(f(xm, wm), kernels.reduce_rows_reference(x, w, op))


def test_nested_vmap():
  x, w = _operands(np.random.default_rng(11), (2, 3, 4), 5, 2, np.float32)
  f = jax.vmap(jax.vmap(lambda x, w: kernels.reduce_rows(x, w, "max"), in_axes=(1, 1)))
  d = derived_names.decode(_derived_name(jax.jit(f).lower(x, w).as_text()))
  assert d.operand_batch_ranks == (3, 3)
  assert d.reductions == (Reduction("n", "max", ((0, -2), (1, -1))),)
  want = kernels.reduce_rows_reference(np.swapaxes(x, 1, 2), np.swapaxes(w, 1, 2), "max")
  _assert_close(f(x, w), want)


def test_vmap_with_unmapped_weights_broadcasts_them():
  x, w = _operands(np.random.default_rng(12), (2, 3), 5, 4, np.float32)
  w = w[0]
  f = jax.vmap(lambda x, w: kernels.reduce_rows(x, w, "sum"), in_axes=(0, None))
  _assert_close(f(x, w), kernels.reduce_rows_reference(x, np.broadcast_to(w, x.shape[:-1])))
