"""dsbuild's own helpers, private to the package: "did you mean", version-dependent shims, atomic writes, the reader
of attribute docstrings, ``--set`` and dotted keys, and the safe reader of every file a user hands us."""
