#!/usr/bin/env bash
# Builds .venv-oldest with the oldest releases pyproject.toml allows for the training stack (tools/oldest.txt)
# and runs the fast suite there (-m "not slow"); extra arguments go to pytest.
#
#   tools/check_oldest.sh                 # then raise a bound in pyproject.toml where a release fails
#
# torch stays at the lock's release: every older torch on PyPI for x86_64 is a CUDA build of several GB
# (docs/compatibility.md says what that means for torch's lower bound).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${OLDEST_VENV:-.venv-oldest}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet -c tools/oldest.txt -e '.[train,dev]'
"$venv/bin/pip" freeze | grep -iE '^(torch|deepspeed|transformers|peft|datasets|accelerate)=='
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" "$@"
