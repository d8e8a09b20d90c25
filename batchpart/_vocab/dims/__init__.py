"""One module per kind of dim a call declares: ``batch`` (where each array's
batch dims lie), ``core`` (core axes and named core dims) and ``reduced``
(core dims the results combine over). A new kind is one more module here,
which ``batch_spec``, ``description`` and ``derived_names`` then carry."""
