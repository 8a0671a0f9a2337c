#!/usr/bin/env bash
# MaxText, the peer of `lnjax compile` (issue: compile for TPU slices on a CPU host), in a
# virtual environment of its own: maxtext on the package index needs Python >= 3.12, lnjax
# runs on 3.11. Then benchmarks/maxtext_peer.py compiles Llama-2-7B with MaxText's own
# train_compile for a TPU topology and writes its per-chip memory and FLOPs as JSON.
#
#   bash benchmarks/maxtext_peer.sh install                  # the venv (minutes; once)
#   bash benchmarks/maxtext_peer.sh run v5e:2x4 fsdp out.json
#
# MAXTEXT_PYTHON: a Python >= 3.12 (default: pyenv's 3.12.1, else python3.12 on PATH).
# MAXTEXT_VENV: where the venv goes (default ~/.cache/lnjax/maxtext_venv).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${MAXTEXT_VENV:-$HOME/.cache/lnjax/maxtext_venv}"
py="${MAXTEXT_PYTHON:-}"
if [ -z "$py" ]; then
  for c in /root/.pyenv/versions/3.12.1/bin/python "$(command -v python3.12 || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then py="$c"; break; fi
  done
fi
case "${1:-}" in
  install)
    [ -n "$py" ] || { echo "maxtext_peer.sh: no Python >= 3.12 (set MAXTEXT_PYTHON)" >&2; exit 2; }
    "$py" -m venv "$venv"
    # MaxText's TPU extra brings its own JAX and libtpu (jax 0.12.0.1 and libtpu 0.0.52 on
    # 2026-12-05, newer than lnjax's 0.10.2 / 0.0.42.1: the two compile with different
    # XLAs). pip's resolver backtracked over google-cloud-aiplatform for 40 minutes after
    # installing the rest (stopped by hand that day); train_compile then lacked tokamax
    # and xprof, installed here without their dependencies.
    timeout "${MAXTEXT_INSTALL_SECONDS:-1800}" "$venv/bin/pip" install --quiet \
        --disable-pip-version-check "maxtext[tpu]==0.2.5" || true
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps tokamax xprof
    # lnjax itself, for its plans compiled by this venv's jax and libtpu (BENCHMARKS.md,
    # TPU plans): its data builders import tensorflow_datasets, which MaxText does not pin.
    "$venv/bin/pip" install --quiet --disable-pip-version-check tensorflow-datasets
    "$venv/bin/python" -c "import maxtext, jax; print('maxtext ok, jax', jax.__version__)";;
  run)
    shift
    [ -x "$venv/bin/python" ] || { echo "maxtext_peer.sh: run '$0 install' first" >&2; exit 2; }
    "$venv/bin/python" "$here/maxtext_peer.py" "$@";;
  *) echo "usage: $0 install | run TOPOLOGY MESH OUT.json" >&2; exit 2;;
esac
