"""The version has one source: pyproject.toml, read back through the
installed metadata."""

import pathlib
import tomllib

import batchpart


def test_version_is_pyproject_version():
  pyproject = pathlib.Path(__file__).parent.parent / "pyproject.toml"
  with open(pyproject, "rb") as f:
    assert batchpart.__version__ == tomllib.load(f)["project"]["version"]
