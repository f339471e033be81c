"""``python -m dsbuild``: the ``dsbuild`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
