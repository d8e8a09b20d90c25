"""The docs site's Sphinx helpers (docs/_ext): links to jax's pages only where jax has one, and
break points in long inline code only between its pieces. The built site itself is checked in
a browser by scripts/screenshot_docs.py (CI runs it after the build)."""

import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "docs" / "_ext"))
refs = pytest.importorskip("batchpart_refs", reason="Sphinx (the docs extra) is not installed")
import batchpart_wrap  # noqa: E402 (after the path it lives on)


@pytest.mark.parametrize("name", sorted(refs.JAX_PAGES))
def test_jax_names_with_a_page_link_to_it(name):
  assert refs.external_url("func", name) == (
      f"https://docs.jax.dev/en/latest/_autosummary/{name}.html")


@pytest.mark.parametrize("name", ["jax.experimental.buffer_callback", "jax.sharding.Mesh",
                                  "jax._src.core.Tracer"])
def test_jax_names_without_a_known_page_get_no_link(name):
  assert refs.external_url("func", name) is None


def test_module_and_member_links():
  assert refs.external_url("mod", "jax.lax.linalg") == (
      "https://docs.jax.dev/en/latest/jax.lax.html#module-jax.lax.linalg")
  assert refs.external_url("mod", "jax.random") is None
  assert refs.external_url("attr", "jax.Array.shape") == (
      "https://docs.jax.dev/en/latest/_autosummary/jax.Array.html#jax.Array.shape")
  assert refs.external_url("class", "np.ndarray") == (
      "https://numpy.org/doc/stable/reference/generated/numpy.ndarray.html")


def _pieces(html: str) -> list[str]:
  return re.findall(r'<span class="pre">([^<]*)</span>', html)


def test_long_inline_code_is_cut_after_its_separators():
  pre = '<span class="pre">{}</span>'.format
  html = batchpart_wrap.with_breaks(pre("mark_batch_partitionable()") + " " + pre("a_b"))
  assert _pieces(html) == ["mark_", "batch_", "partitionable()", "a_b"]
  assert html.count("<wbr>") == 2
  assert _pieces(batchpart_wrap.with_breaks(pre("jax.ShapeDtypeStruct"))) == [
      "jax.", "Shape", "Dtype", "Struct"]
  # no break inside a word, nor after the hyphen of all-reduce
  assert _pieces(batchpart_wrap.with_breaks(pre("all-reduce-scatter"))) == [
      "all-reduce-scatter"]


def test_cutting_twice_changes_nothing():
  once = batchpart_wrap.with_breaks('<span class="pre">jax.ffi.ffi_call(x)</span>')
  assert batchpart_wrap.with_breaks(once) == once
