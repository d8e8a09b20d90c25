"""The call's vocabulary, which every layer above reads: the batch spec
(``batch_spec``), one module per kind of dim (``dims``), the call's
description (``description``), the derived target name that carries it
(``derived_names``) and which block of the batch each partition's host
callback gets (``blocks``). It imports nothing of batchpart but ``_compat``."""
