"""The built-in demo job of ``dsbuild train``: ``demo.toml`` and its arithmetic data (written by ``make_data.py``)."""
