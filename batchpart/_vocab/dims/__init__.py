"""One module per kind of dim a call declares beside its batch dims:
``reduced`` (core dims the results combine over)."""
