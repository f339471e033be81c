"""``python -m dsbuild``: the ``dsbuild`` command."""

from .cli import entry

if __name__ == "__main__":
    entry()
