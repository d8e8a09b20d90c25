"""Sphinx helpers of batchpart's API reference; they need no network.

* Links to jax's, NumPy's and Python's own pages. The build runs offline (no intersphinx
  inventories to download), so a ``missing-reference`` handler writes those sites' URL patterns
  for the ``jax.*``, ``numpy.*`` and standard-library targets that autodoc leaves unresolved:
  ``jax.ffi.ffi_call`` -> https://docs.jax.dev/en/latest/_autosummary/jax.ffi.ffi_call.html.
  The patterns are those of the sites' autosummary pages; a name they have no page for gets a
  dead link, so cite jax's and NumPy's public API only.
* ``.. report-class:: batchpart._explain.report.ExplainReport``: a class that users get (from
  ``bp.explain``) but cannot import, documented under its bare name (``ExplainReport``) with
  its docstring (Google style, through napoleon), never under its private module path. The
  private path is registered as ``:canonical:``, so annotations that name it still link here,
  and viewcode still finds its source.
* Docstrings' plain-text guide references (``(docs/reductions.md)``, which ``help()`` shows as
  written) become links to those pages.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

from docutils import nodes
from docutils.statemachine import StringList
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
  if parts[0] == "jax" and not any(p.startswith("_") for p in parts):
    if reftype == "mod":   # jax.lax.linalg: a section of jax.lax's page
      page = ".".join(parts[:2])
      return f"{JAX}{page}.html" + (f"#module-{target}" if len(parts) > 2 else "")
    if reftype in ("meth", "attr") and len(parts) > 2:   # a member: its class's page
      return f"{JAX}_autosummary/{'.'.join(parts[:-1])}.html#{target}"
    return f"{JAX}_autosummary/{target}.html"
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
  app.connect("doctree-resolved", on_doctree_resolved)
  app.connect("viewcode-follow-imported", on_follow_imported)
  app.add_directive("report-class", ReportClass)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
