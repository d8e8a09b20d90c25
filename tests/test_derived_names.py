"""The derived-name codec: a call's description written into its target name."""

import pytest
from hypothesis import given, strategies as st

from batchpart._vocab import derived_names
from batchpart._vocab.description import CallDescription, default_layout


@st.composite
def descriptions(draw):
  target = draw(st.sampled_from(["k", "my_softmax", "lapack_spotrf_ffi",
                                 "__gpu$xla.gpu.triton", "a.b-c"]))

  def arrays(n):
    ranks = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    layouts = tuple(tuple(draw(st.permutations(range(r)))) if draw(st.booleans())
                    else default_layout(r) for r in ranks)
    batch = tuple(draw(st.integers(0, r)) for r in ranks)
    # Core dims before the batch dims (a signature's '...' not in front).
    leads = tuple(draw(st.integers(0, r - b)) if draw(st.booleans()) else 0
                  for r, b in zip(ranks, batch))
    return batch, layouts, leads

  n_in, n_out = draw(st.integers(0, 3)), draw(st.integers(0, 3))
  ob, ol, op = arrays(n_in)
  rb, rl, rp = arrays(n_out)
  pairs = [(i, o) for i in range(n_in) for o in range(n_out)]
  aliases = tuple(sorted(draw(st.lists(st.sampled_from(pairs), unique=True, max_size=2))
                         if pairs else []))
  return CallDescription(
      target=target, operand_batch_ranks=ob, result_batch_ranks=rb,
      operand_layouts=ol, result_layouts=rl, aliases=aliases,
      has_side_effect=draw(st.booleans()),
      attribute_rule=draw(st.sampled_from(["", "nufft.n_tot", "rule-1"])),
      unit_batch=draw(st.booleans()),
      operand_lead_ranks=op, result_lead_ranks=rp)


@given(descriptions())
def test_decode_inverts_encode(d):
  name = derived_names.encode(d)
  assert derived_names.is_derived(name)
  assert derived_names.user_target(name) == d.target
  assert derived_names.decode(name) == d


@given(descriptions(), descriptions())
def test_distinct_descriptions_have_distinct_names(a, b):
  assert (derived_names.encode(a) == derived_names.encode(b)) == (a == b)


def test_readable_example():
  d = CallDescription("my_softmax", (1,), (1, 1), ((1, 0),), ((1, 0), (0,)))
  assert derived_names.encode(d) == "my_softmax$bp1$o1$r1,1$no2$nr2,1"
  d = CallDescription("copy", (1,), (1,), ((1, 2, 0),), ((2, 1, 0),), aliases=((0, 0),),
                      has_side_effect=True)
  assert derived_names.encode(d) == "copy$bp1$o1$r1$no3$lo0:1.2.0$nr3$a0:0$s"


def test_leading_core_dims_only_where_there_are_some():
  # "(a,f,...,r),(a,f,...,r)->(p,f,...)" on batch rank 1
  d = CallDescription("vis", (1, 1), (1,), ((3, 2, 1, 0),) * 2, ((2, 1, 0),),
                      operand_lead_ranks=(2, 2), result_lead_ranks=(2,))
  assert derived_names.encode(d) == "vis$bp1$o1,1$r1$no4,4$nr3$po2,2$pr2"
  assert derived_names.decode(derived_names.encode(d)) == d
  zeros = CallDescription("k", (1,), (1,), ((1, 0),), ((1, 0),),
                          operand_lead_ranks=(0,), result_lead_ranks=(0,))
  assert zeros == CallDescription("k", (1,), (1,), ((1, 0),), ((1, 0),))
  assert derived_names.encode(zeros) == "k$bp1$o1$r1$no2$nr2"


def test_plain_names_are_not_derived():
  assert not derived_names.is_derived("lapack_spotrf_ffi")
  assert derived_names.user_target("lapack_spotrf_ffi") == "lapack_spotrf_ffi"


@pytest.mark.parametrize("name", [
    "k$bp1", "k$bp1$o1", "k$bp1$o1$r1$no2", "k$bp1$o1$r1$no2$nr2$zz",
    "k$bp1$o1$r1$no2$nr2$lo5:0.1", "k$bp1$o3$r1$no2$nr2", "k$bp1$ox$r1$no2$nr2",
    "k$bp1$o1$r1$no2$nr2$lo0:0.0", "k$bp1$o1$r1$no2$nr2$a0:3", "$bp1$o$r$no$nr",
    "k$bp1$o1$r1$no2$nr2$po2", "k$bp1$o1$r1$no2$nr2$po0", "k$bp1$o1$r1$no2$nr2$po1,1",
    "k$bp1$o1$r1$no2$nr2$po1$po1",
])
def test_malformed_names_raise_naming_the_target(name):
  with pytest.raises(ValueError, match="k|bp1"):
    derived_names.decode(name)
