"""The supported jax range, checked at import: too old fails there, naming the
versions; newer than checked warns; the range itself is what pyproject.toml
and the docs state."""

import pathlib
import re
import subprocess
import sys
import tomllib
import warnings

import pytest

from batchpart._compat import versions

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_version_key_reads_releases_and_pre_releases():
  assert versions.version_key("0.10.2") == (0, 10, 2)
  assert versions.version_key("0.12.0.1") == (0, 12, 0)
  assert versions.version_key("0.13.0rc1") == (0, 13, 0)
  assert versions.version_key("0.13.0.dev20270101") == (0, 13, 0)
  assert versions.version_key("0.12") == (0, 12)


@pytest.mark.parametrize("jax_version", ["0.10.2", "0.11.0", "0.12.0.1", "0.12.9"])
def test_versions_in_range_pass_silently(jax_version):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    versions.check_versions(jax_version, jax_version)


@pytest.mark.parametrize("jax_version, jaxlib_version, culprit", [
    ("0.10.1", "0.10.2", "jax 0.10.1"),
    ("0.9.0", "0.9.0", "jax 0.9.0"),
    ("0.10.2", "0.10.0", "jaxlib 0.10.0"),
])
def test_older_than_supported_raises_naming_both_versions(jax_version, jaxlib_version, culprit):
  with pytest.raises(ImportError) as info:
    versions.check_versions(jax_version, jaxlib_version)
  message = str(info.value)
  assert culprit in message
  assert f">= {versions.OLDEST_SUPPORTED}" in message


def test_newer_than_checked_warns_naming_both_versions():
  with pytest.warns(RuntimeWarning, match=r"jax 0\.13\.0.*newer than any version checked") as w:
    versions.check_versions("0.13.0", "0.13.0")
  assert f">= {versions.OLDEST_SUPPORTED}" in str(w[0].message)
  assert f"{versions.NEWEST_CHECKED}.x" in str(w[0].message)


def _import_with_jax_version(version):
  code = ("import jax, jaxlib\n"
          f"jax.__version__ = jaxlib.__version__ = {version!r}\n"
          "import batchpart\n"
          "print('imported')\n")
  return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                        text=True, timeout=120)


def test_import_with_an_old_jax_fails_at_import_naming_the_versions():
  run = _import_with_jax_version("0.9.5")
  assert run.returncode != 0
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("ImportError:"), run.stderr
  assert "jax 0.9.5" in last and f">= {versions.OLDEST_SUPPORTED}" in last


def test_import_with_a_newer_jax_warns_and_imports():
  run = _import_with_jax_version("0.99.0")
  assert run.returncode == 0, run.stderr
  assert "imported" in run.stdout
  assert "RuntimeWarning" in run.stderr and "jax 0.99.0" in run.stderr


def test_pyproject_states_the_oldest_supported_version():
  with open(REPO / "pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
  for name in ("jax", "jaxlib"):
    assert f"{name}>={versions.OLDEST_SUPPORTED}" in project["dependencies"]


def test_the_docs_state_the_range():
  faq = (REPO / "docs" / "faq.md").read_text()
  assert re.search(rf"jax >= {re.escape(versions.OLDEST_SUPPORTED)}", faq)
  assert f"{versions.NEWEST_CHECKED}.x" in faq
