#!/usr/bin/env bash
# Regenerates constraints.txt: the lock of the tested set (every package, transitive too, of dsbuild[train,dev]).
#
#   tools/lock.sh            # newest releases pyproject.toml's ranges allow, torch held at the pinned release
#   TORCH=2.14.1 tools/lock.sh
#
# Locked with pip-tools' pip-compile, because it resolves with pip itself: the same resolver, index and wheel
# configuration that installs the lock (README quick start: pip install -c constraints.txt). On machines without
# CUDA a local CPU wheel of torch is what pip finds, so the lock holds torch's CPU dependencies and no nvidia-*
# packages; uv's resolver does not read pip's configuration and would lock the CUDA build's gigabytes.
# torch is written without its local label (2.13.0, not 2.13.0+cpu): the same line then takes the CPU wheel here
# and the normal build elsewhere. No hashes: they would pin one of those two builds.
# After regenerating, run the suite on the new lock (docs/compatibility.md) before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
torch=${TORCH:-2.13.0}
venv=${LOCK_VENV:-.venv-lock}
if [ ! -x "$venv/bin/pip-compile" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'pip-tools==7.6.2'
fi
CUSTOM_COMPILE_COMMAND="tools/lock.sh" "$venv/bin/pip-compile" --quiet --upgrade --upgrade-package "torch==$torch" \
  --extra train --extra dev --strip-extras --no-emit-index-url --no-emit-find-links \
  --output-file constraints.txt pyproject.toml
header='# The tested set, locked: the versions the whole suite passed with (docs/compatibility.md).\n# The README quick start and CI install exactly these: pip install -c constraints.txt -e ".[train,dev]".\n# torch carries no local label, so this line takes the CPU wheel where there is one and the normal build elsewhere.'
sed -i "1i $header" constraints.txt
sed -i -E 's/^(torch==[0-9][0-9.]*)\+[A-Za-z0-9.]+$/\1/' constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) packages locked"
