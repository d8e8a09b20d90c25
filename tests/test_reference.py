"""The reference material stays complete: docs/reference.md's summary names
every public name, one of the docs/reference-*.md pages documents each, and
the docstrings that list the ``reduce=`` ops list every op the entry points
accept."""

import pathlib
import re

import pytest

import batchpart as bp
from batchpart._vocab.dims.reduced import ALL_OPS

DOCS = pathlib.Path(__file__).parent.parent / "docs"
REFERENCE = DOCS / "reference.md"
# The pages the summary links to, one per group of names.
REFERENCE_PAGES = sorted(DOCS.glob("reference-*.md"))

# The entry points whose docstrings list the ops; the others say "as for" one
# of these.
LISTING_OPS = [bp.ffi_call, bp.pure_callback, bp.batch_partitionable, bp.partition_primitive]


@pytest.mark.parametrize("fn", LISTING_OPS, ids=lambda fn: fn.__name__)
def test_docstrings_list_every_reduce_op(fn):
  text = fn.__doc__
  reduce_doc = re.search(r"\n    reduce: (.*?)\n    \w+:", text, re.S)
  assert reduce_doc, f"bp.{fn.__name__}: no reduce: entry in its docstring"
  missing = [op for op in ALL_OPS if f'``"{op}"``' not in reduce_doc.group(1)]
  assert not missing, f"bp.{fn.__name__}'s reduce: docs do not name {missing}"
  assert "Combiner" in reduce_doc.group(1), f"bp.{fn.__name__}'s reduce: docs omit Combiner"


@pytest.mark.parametrize("name", bp.__all__)
def test_reference_summary_lists_every_public_name(name):
  assert re.search(rf"batchpart\.{name}\b", REFERENCE.read_text()), (
      f"docs/reference.md's summary does not list batchpart.{name}")


@pytest.mark.parametrize("name", bp.__all__)
def test_reference_pages_document_every_public_name(name):
  entry = re.compile(rf"^\.\. auto(function|class|module):: batchpart\.{name}$", re.M)
  pages = [p.name for p in REFERENCE_PAGES if entry.search(p.read_text())]
  assert len(pages) == 1, (
      f"batchpart.{name} has an entry on {pages or 'no page'} of docs/reference-*.md")


@pytest.mark.parametrize("name", bp.linalg.__all__)
def test_reference_documents_every_linalg_name(name):
  assert re.search(rf"batchpart\.linalg\.{name}\b", REFERENCE.read_text())
  assert any(re.search(rf"^\.\. autofunction:: batchpart\.linalg\.{name}$", p.read_text(), re.M)
             for p in REFERENCE_PAGES), f"no docs/reference-*.md entry for batchpart.linalg.{name}"
