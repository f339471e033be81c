"""Config files in and out: the one converter (``convert``: dict to config and back), the reader and writer of config
files (``config_files``), the presets (``presets``: only where they are) and the JSON Schema of a ds_config
(``schema``)."""
