"""dsbuild's version (one place: the package, the CLI's --version and checkpoint manifests read it)."""

VERSION = "0.1.0"
