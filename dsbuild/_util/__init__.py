"""dsbuild's own helpers, private to the package: "did you mean", version-dependent shims, atomic writes, dsbuild's
folder in the user's cache, the reader of attribute docstrings, ``--set`` and dotted keys, and the safe reader of every
file a user hands us."""
