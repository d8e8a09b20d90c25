"""The typed public API: py.typed ships, and every public function has every
parameter and its return annotated (mypy checks the annotations themselves;
pyproject.toml's [tool.mypy])."""

import inspect
import pathlib

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
