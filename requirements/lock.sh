#!/usr/bin/env bash
# Regenerates requirements/constraints.txt, the lock that ./dev, CI and every image install from:
# all extras of pyproject.toml resolved together and pinned, so one file constrains every image.
#   ./dev lock                          add what pyproject.toml asks for, keep the other pins
#   ./dev lock --upgrade                move every pin to the newest allowed release
#   ./dev lock --upgrade-package NAME   move one (pip-compile's options pass through)
# pip-compile (pip-tools) runs from a throw-away virtualenv and resolves with pip's own index
# settings for Linux and the Python that runs it (3.11, as the images). No hashes: ./dev installs
# the project editable, which pip's hash-checking mode refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP_TOOLS="pip-tools==7.6.2"
PIP="pip==26.3"

tools=$(mktemp -d "${TMPDIR:-/tmp}/modelfleet-lock.XXXXXX")
trap 'rm -rf "$tools"' EXIT
"$PY" -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install -q "$PIP" "$PIP_TOOLS"

out=requirements/constraints.txt
CUSTOM_COMPILE_COMMAND="./dev lock" "$tools/venv/bin/pip-compile" --quiet --all-extras --strip-extras --annotation-style=line \
  --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
  --output-file="$out" "$@" pyproject.toml

# pip-compile writes its own header; say what the file is for above it. The self-referencing
# extras make it list the project itself (modelfleet @ file://<this checkout>): never a pin.
{
  echo "# The lock: every third-party package of every extra of pyproject.toml, pinned."
  echo "# ./dev installs with it (pip install -c requirements/constraints.txt -e \".[dev]\"), and so"
  echo "# does each image for its own extra. Do not edit by hand: change pyproject.toml, then run"
  echo "# ./dev lock (requirements/lock.sh) and commit both."
  grep -v -e '^# \(The lock:\|\./dev installs with it\|does each image\|\./dev lock (requirements\)' \
    -e '^modelfleet *[@=]' "$out"
} > "$tools/constraints.txt"
mv "$tools/constraints.txt" "$out"
echo "lock: wrote $out ($(grep -c '==' "$out") pins)" >&2
