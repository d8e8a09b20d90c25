"""Sphinx configuration of batchpart's docs site.

Build (from the repository root, after ``pip install -e ".[docs]"``):

    python -m sphinx -W -b html docs docs/_build/html

Every ``{code-cell}`` in a page with MyST-NB front matter runs during the build (MyST-NB, in a
fresh Jupyter kernel per page), on 8 simulated CPU devices: an example that raises fails the
build. The pages have no stored outputs; what they show is what the build computed.
"""

import importlib.metadata
import os

# The kernels MyST-NB starts inherit this environment: 8 simulated CPU devices, and synchronous
# dispatch (programs that mix collectives and FFI calls can hang on simulated devices with async
# dispatch, docs/faq.md). jax reads each JAX_* variable as the option of the same name.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "8"
os.environ["JAX_CPU_ENABLE_ASYNC_DISPATCH"] = "false"

project = "batchpart"
author = "the batchpart authors"
release = importlib.metadata.version("batchpart")
version = release

extensions = [
    "myst_nb",               # MyST Markdown pages, executed code cells
    "sphinx.ext.autodoc",    # the API reference from the docstrings
    "sphinx.ext.napoleon",   # Google-style docstrings
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "benchmarks-scaling.json"]

# Links between pages (`[x](callbacks.md#anchor)`) resolve to heading anchors, GitHub's slugs.
myst_heading_anchors = 4

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
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Every cross-reference must resolve, except to jax, NumPy and the standard library: the docs
# cite nothing outside the repository (no intersphinx), so those stay plain text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|numpy|np|jnp|scipy)(\..*)?"),
    (r"py:.*", r"(collections\.abc|typing|types|functools)\..*"),
    (r"py:class", r"(Callable|Sequence|Mapping|Any|Iterable|ShapeDtypeStruct|Array)"),
]

html_theme = "alabaster"
html_title = f"batchpart {release}"
html_static_path: list[str] = []
html_theme_options = {"description": "Foreign calls in JAX that shard like native ops."}
