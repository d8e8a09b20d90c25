"""The typed public API: py.typed ships, and every public function has every
parameter and its return annotated (mypy checks the annotations themselves;
pyproject.toml's [tool.mypy])."""

import functools
import inspect
import pathlib
import runpy
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchpart as bp

PUBLIC = [(name, getattr(bp, name)) for name in bp.__all__ if name != "linalg"]
PUBLIC += [(f"linalg.{name}", getattr(bp.linalg, name)) for name in bp.linalg.__all__]


def test_py_typed_ships_with_the_package():
  assert (pathlib.Path(bp.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("name, fn", PUBLIC, ids=[name for name, _ in PUBLIC])
def test_every_public_function_is_fully_annotated(name, fn):
  signature = inspect.signature(fn)
  missing = [p.name for p in signature.parameters.values()
             if p.annotation is inspect.Parameter.empty]
  assert not missing, f"bp.{name}: parameters without annotations: {missing}"
  assert signature.return_annotation is not inspect.Signature.empty, (
      f"bp.{name}: no return annotation")


def test_version_is_a_string():
  assert isinstance(bp.__version__, str) and bp.__version__


def test_typed_example_runs():
  """examples/typed_declarations.py (which mypy checks) also declares what
  the entry points accept."""
  example = pathlib.Path(__file__).parent.parent / "examples" / "typed_declarations.py"
  assert runpy.run_path(str(example), run_name="typed_declarations")["main"]() == 0


def test_declarations_accept_any_mapping():
  """The annotations say Mapping (covariant, so a dict[str, str] built
  beforehand type-checks): a read-only mapping is accepted too."""
  x = jnp.ones((4, 8), np.float32)
  row, rows = jax.ShapeDtypeStruct((4,), x.dtype), jax.ShapeDtypeStruct((4, 8), x.dtype)
  frozen = types.MappingProxyType
  for result, fn, declared in (
      (row, lambda x: x.sum(-1), {"reduce": frozen({"n": "sum"})}),
      (rows, lambda x: x, {"halo": frozen({"n": bp.Halo(1, 1)})}),
      (rows, lambda x: x, {"halo": frozen({"n": 1})})):
    signature = "(n)->()" if result is row else "(n)->(n)"
    jax.make_jaxpr(functools.partial(bp.pure_callback, fn, result, signature=signature,
                                     **declared))(x)
  state = jnp.zeros((4,), np.float32)
  scan = frozen({"t": bp.Scan(state=(1, 1))})
  jax.make_jaxpr(lambda x, s: bp.io_callback(lambda x, s: (x, s), (rows, row), x, s,
                                             signature="(t),()->(t),()", scan=scan))(x, state)
