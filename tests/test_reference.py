"""The reference material stays complete: docs/reference.md names every
public name, and the docstrings that list the ``reduce=`` ops list every op
the entry points accept."""

import pathlib
import re

import pytest

import batchpart as bp
from batchpart._vocab.dims.reduced import ALL_OPS

REFERENCE = pathlib.Path(__file__).parent.parent / "docs" / "reference.md"

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
def test_reference_page_documents_every_public_name(name):
  assert re.search(rf"batchpart\.{name}\b", REFERENCE.read_text()), (
      f"docs/reference.md does not document batchpart.{name}")
