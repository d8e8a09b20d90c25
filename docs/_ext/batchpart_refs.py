"""Sphinx helpers of batchpart's API reference; they need no network.

* Links to jax's, NumPy's and Python's own pages. The build runs offline (no intersphinx
  inventories to download), so a ``missing-reference`` handler writes those sites' URL patterns
  for the ``jax.*``, ``numpy.*`` and standard-library targets that autodoc leaves unresolved:
  ``jax.ffi.ffi_call`` -> https://docs.jax.dev/en/latest/_autosummary/jax.ffi.ffi_call.html.
  The patterns are those of the sites' autosummary pages. jax names link only when listed in
  ``JAX_PAGES`` (checked against the autosummary lists of jax's docs sources); any other jax
  name stays plain text and, the build being nitpicky, fails it until checked and listed, so
  no link goes nowhere.
* ``.. report-class:: batchpart._explain.report.ExplainReport``: a class that users get (from
  ``bp.explain``) but cannot import, documented under its bare name (``ExplainReport``) with
  its docstring (Google style, through napoleon), never under its private module path. The
  private path is registered as ``:canonical:``, so annotations that name it still link here,
  and viewcode still finds its source.
* Docstrings' plain-text guide references (``(docs/reductions.md)``, which ``help()`` shows as
  written) become links to those pages.
* The guides' inline code that names a public entry (``bp.ffi_call``, ``bp.Halo(1, 2)``,
  ``@bp.batch_partitionable``, ``batchpart.linalg.qr``) links to its reference entry, and a jax
  name of ``JAX_PAGES`` (``jax.pure_callback``) to jax's page, so the guides need no link
  markup; any other name stays plain code.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.ext.napoleon import GoogleDocstring
from sphinx.util.docutils import SphinxDirective

JAX = "https://docs.jax.dev/en/latest/"
NUMPY = "https://numpy.org/doc/stable/reference/"
PYTHON = "https://docs.python.org/3/library/"
ALIASES = {"np": "numpy", "jnp": "jax.numpy"}
STDLIB = ("collections.abc", "typing", "types", "functools")
#: jax's private homes of public names, as annotations resolve them -> the public names
JAX_PUBLIC = {"jax._src.core.Primitive": "jax.extend.core.Primitive",
              "jax.jaxlib._jax.Array": "jax.Array", "jaxlib._jax.Array": "jax.Array"}
#: jax's names that these pages cite and that have a page of their own on docs.jax.dev (in the
#: autosummary lists of jax's docs/*.rst). jax.experimental.buffer_callback has none.
JAX_PAGES = frozenset({
    "jax.Array", "jax.pure_callback", "jax.experimental.io_callback", "jax.debug.callback",
    "jax.extend.core.Primitive", "jax.ffi.ffi_call", "jax.ffi.ffi_lowering", "jax.jit",
    "jax.shard_map", "jax.export.export",
    "jax.lax.linalg.eigh", "jax.lax.linalg.lu", "jax.lax.linalg.qr", "jax.lax.linalg.svd",
    "jax.lax.linalg.triangular_solve", "jax.lax.linalg.cholesky",
    "jax.numpy.linalg.cholesky", "jax.numpy.linalg.eigh", "jax.numpy.linalg.qr",
    "jax.numpy.linalg.solve", "jax.numpy.linalg.svd", "jax.scipy.linalg.solve",
})
#: jax's modules documented as a section of their parent's page (``.. automodule::`` there)
JAX_MODULES = frozenset({"jax.lax.linalg", "jax.numpy.linalg", "jax.scipy.linalg"})
#: NumPy's scalar types, documented together on one page
NUMPY_SCALARS = {"generic", "number", "integer", "signedinteger", "unsignedinteger", "inexact",
                 "floating", "complexfloating", "bool", "bool_"}
BUILTINS = {"int", "float", "complex", "str", "bytes", "bool", "tuple", "list", "dict", "set",
            "frozenset", "object", "type", "slice", "range"}


def external_url(reftype: str, target: str) -> str | None:
  """The page of a jax, NumPy or standard-library name, or None for any other name."""
  target = JAX_PUBLIC.get(target, target)
  head, _, rest = target.partition(".")
  if head in ALIASES:
    target = ALIASES[head] + ("." + rest if rest else "")
  parts = target.split(".")
  if parts[0] == "jax":
    if reftype == "mod":   # jax.lax.linalg: a section of jax.lax's page
      return f"{JAX}{'.'.join(parts[:-1])}.html#module-{target}" if target in JAX_MODULES else None
    if reftype in ("meth", "attr") and ".".join(parts[:-1]) in JAX_PAGES:   # a class member
      return f"{JAX}_autosummary/{'.'.join(parts[:-1])}.html#{target}"
    return f"{JAX}_autosummary/{target}.html" if target in JAX_PAGES else None
  if parts[0] == "numpy":
    if reftype == "mod":
      return f"{NUMPY}index.html"
    if len(parts) == 2 and parts[1] in NUMPY_SCALARS:
      return f"{NUMPY}arrays.scalars.html#{target}"
    return f"{NUMPY}generated/{target}.html"
  for module in STDLIB:
    if target.startswith(module + "."):
      return f"{PYTHON}{module}.html#{target}"
  if target in BUILTINS:
    return f"{PYTHON}functions.html#{target}"
  if target == "None":
    return f"{PYTHON}constants.html#None"
  return None


def on_missing_reference(app, env, node, contnode):
  if node.get("refdomain") != "py":
    return None
  url = external_url(node.get("reftype", ""), node.get("reftarget", ""))
  if url is None:
    return None
  ref = nodes.reference("", "", internal=False, refuri=url, reftitle=node["reftarget"])
  ref += contnode
  return ref


#: inline code that names an entry: ``bp.X``, ``batchpart.X.y``, ``jax.X``, a call of it, a
#: decorator
NAMED = re.compile(r"@?(bp|batchpart|jax)\.([A-Za-z_][\w.]*)(?:\(.*\))?")


def link_named_code(app, doctree, docname):
  """Inline code naming a documented ``batchpart`` entry -> a link to that entry; naming a jax
  function with a page of its own (``JAX_PAGES``) -> a link to that page."""
  objects = app.env.get_domain("py").objects
  for literal in list(doctree.findall(nodes.literal)):
    m = NAMED.fullmatch(literal.astext())
    if m is None or _inside(literal, (nodes.reference, nodes.title, addnodes.desc_signature)):
      continue
    if m[1] == "jax":
      name = f"jax.{m[2]}"
      uri = external_url("func", name)
    else:
      name = f"batchpart.{m[2]}"
      entry = objects.get(name)
      uri = (app.builder.get_relative_uri(docname, entry.docname) + "#" + entry.node_id
             if entry is not None else None)
    if uri is None:
      continue
    ref = nodes.reference("", "", internal=m[1] != "jax", refuri=uri, reftitle=name)
    literal.replace_self(ref)
    ref += literal


def _inside(node, kinds) -> bool:
  while node is not None:
    if isinstance(node, kinds):
      return True
    node = node.parent
  return False


def on_doctree_resolved(app, doctree, docname):
  """A link's hover title names the public entry it goes to, not the private path that an
  annotation named (``batchpart._vocab.dims.halo.Halo`` -> ``batchpart.Halo``)."""
  for ref in doctree.findall(nodes.reference):
    title = ref.get("reftitle", "")
    uri = ref.get("refuri") or "#" + ref.get("refid", "")
    if title.startswith("batchpart._") and uri.rpartition("#")[2]:
      ref["reftitle"] = uri.rpartition("#")[2]


#: bare name -> defining module, of the classes documented with ``report-class``
REPORT_CLASSES: dict[str, str] = {}


class ReportClass(SphinxDirective):
  """``.. report-class:: module.Class``: the class under its bare name, not its module's."""
  required_arguments = 1

  def run(self):
    path = self.arguments[0]
    modname, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(modname), name)
    REPORT_CLASSES[name] = modname
    doc = GUIDE.sub(guide_link(self.env.app), inspect.getdoc(cls) or "")
    doc = str(GoogleDocstring(doc, self.config, self.env.app, "class", name, cls))
    doc = doc.replace(modname + ".", "")   # attribute types: ``tuple[CallReport, ...]``
    lines = [f".. py:class:: {name}", "   :module:", f"   :canonical: {path}", ""]
    lines += ["   " + line if line else "" for line in doc.splitlines()]
    node = nodes.container()
    self.state.nested_parse(StringList(lines, source=path), self.content_offset, node)
    return node.children


def on_follow_imported(app, modname, fullname):
  """viewcode: a report class's source is in its own module."""
  if not modname and fullname and fullname.split(".")[0] in REPORT_CLASSES:
    return REPORT_CLASSES[fullname.split(".")[0]]
  return None


GUIDE = re.compile(r"\bdocs/([a-z0-9-]+)\.md\b")


def on_docstring(app, what, name, obj, options, lines):
  """``docs/halos.md`` in a docstring -> a link to that page (where the page exists)."""
  lines[:] = [GUIDE.sub(guide_link(app), line) for line in lines]


def guide_link(app):
  srcdir = pathlib.Path(app.srcdir)

  def link(m):
    return f":doc:`{m[1]} guide </{m[1]}>`" if (srcdir / f"{m[1]}.md").exists() else m[0]
  return link


def setup(app):
  app.connect("missing-reference", on_missing_reference)
  app.connect("autodoc-process-docstring", on_docstring)
  app.connect("doctree-resolved", link_named_code)
  app.connect("doctree-resolved", on_doctree_resolved)
  app.connect("viewcode-follow-imported", on_follow_imported)
  app.add_directive("report-class", ReportClass)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
