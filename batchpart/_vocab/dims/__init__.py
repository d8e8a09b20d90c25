"""One module per kind of dim a call declares:

- ``batch``: where each array's batch dims lie (independent problems);
- ``core``: core axes, and where a named core dim first appears;
- ``reduced``: core dims the results combine over (``reduce=``), their
  checks and where they may stay split;
- ``named_combiners``: the combiners named by a string (``"argmax"``,
  ``"max_k"``, ``"logsumexp"``, ...), whose results merge together;
- ``user_combiner``: a user's ``bp.Combiner``, its checks and digest;
- ``halo``: core dims along which a call is local (``halo=``), each part's
  window and kept part.

A new kind is one more module here, which ``batch_spec``, ``description``
and ``derived_names`` then carry."""
