"""Sphinx configuration of batchpart's docs site.

Build (from the repository root, after ``pip install -e ".[docs]"``):

    python -m sphinx -W -b html docs docs/_build/html

Every ``{code-cell}`` in a page with MyST-NB front matter runs during the build (MyST-NB, in a
fresh Jupyter kernel per page, in this directory): an example that raises fails the build. The
pages have no stored outputs; what they show is what the build computed. Nothing is set behind
the pages' backs: a page that needs 8 CPU devices says so in its first cell
(``jax.config.update("jax_num_cpu_devices", 8)``), exactly as a reader would run it, and
``tests/test_docs_examples.py`` runs every page's code as a plain script in a fresh process.
"""

import importlib.metadata
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / "_ext"))

project = "batchpart"
author = "the batchpart authors"
copyright = "2026, the batchpart authors. Apache-2.0"  # noqa: A001 (Sphinx's name)
release = importlib.metadata.version("batchpart")
version = release

extensions = [
    "myst_nb",               # MyST Markdown pages, executed code cells
    "sphinx.ext.autodoc",    # the API reference from the docstrings
    "sphinx.ext.napoleon",   # Google-style docstrings
    "sphinx.ext.viewcode",   # a [source] link on every entry, to the highlighted module
    "batchpart_refs",        # docs/_ext: jax/NumPy/Python links offline, the report classes
    "sphinx_copybutton",     # a copy button on every code block
    "batchpart_wrap",        # docs/_ext: long inline code breaks after "_", ".", "/", not inside
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "benchmarks-*.json"]

# Links between pages (`[x](callbacks.md#anchor)`) resolve to heading anchors, GitHub's slugs.
myst_heading_anchors = 4
# Formulas in prose are MyST math (`$\lceil n / p \rceil$`), rendered by MathJax; MyST-NB's
# pages read the same setting.
myst_enable_extensions = ["dollarmath"]

# Execution: every run, every cell; an error fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 300
nb_merge_streams = True

# The API reference: signatures as written, members in source order, Google-style sections.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# Entries are named as users import them (`batchpart.Halo`, never its defining module's path);
# the report classes, which users get from `bp.explain` but do not import, go by their bare
# names (docs/_ext/batchpart_refs.py's `report-class`).
add_module_names = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Every cross-reference must resolve. The build runs offline, so there is no intersphinx (its
# inventories would have to be downloaded): docs/_ext/batchpart_refs.py links `jax.*`, `numpy.*`
# (`np.*`, `jnp.*`) and standard-library names to those sites' pages by their URL patterns
# (https://docs.jax.dev/en/latest/_autosummary/jax.ffi.ffi_call.html). What it cannot place
# (jaxlib's and scipy's internals, bare names from string annotations) stays plain text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jaxlib|scipy)(\..*)?"),
    (r"py:class", r"(Callable|Sequence|Mapping|Any|Iterable|ShapeDtypeStruct|Array)"),
]

# The look JAX users know (jax's own docs use sphinx-book-theme): the pages on the left, the
# page's own contents on the right, a copy button on code (not on outputs).
html_theme = "sphinx_book_theme"
html_title = f"batchpart {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "toc_title": "On this page",
    "use_fullscreen_button": False,
    "use_download_button": False,
}
copybutton_selector = "div:not(.output) > div.highlight pre"
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = False
