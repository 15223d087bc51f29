#!/usr/bin/env bash
# Install the peer frameworks, each pinned, each in its own venv:
#   bash bench/peers/install.sh [DEST]      (DEST defaults to bench/peers/.venvs/, git-ignored)
# Every venv gets the CPU build of torch first, exactly as the Makefile installs it
# (`pip install -q torch==2.13.0`: pip's config here resolves that to 2.13.0+cpu from find-links),
# then the peer, with torch re-pinned on the same command line so no resolver step can move it.
# Idempotent: a venv that already holds the pinned versions (and a CPU torch) is skipped.
# Env: PYTHON (default python3) picks the interpreter for new venvs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${1:-$HERE/.venvs}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
NUMPY_PIN="numpy==2.4.6"  # ours' numpy: torch DCP's save needs numpy, which torch does not pull

# venv name | distribution | pinned version
PEERS=(
  "nvrx|nvidia-resiliency-ext|0.4.1"
  "torchft|torchft|0.2.0"
  "lightning|lightning|2.6.6"
)

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }

# pip, minus the one-line-per-package noise from this machine's pip config (an extra index
# folder that lacks most packages); pip's exit status is kept (pipefail).
pipq() {  # venv_dir pip-args...
  local py="$1/bin/python"; shift
  { "$py" -m pip "$@" 2>&1; } | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# Prints "torch=<v> cuda=<v> <dist>=<v>"; exit 0 only if the pins hold and torch is a CPU build.
check_venv() {  # venv_dir dist version
  PYTHONWARNINGS=ignore "$1/bin/python" -W ignore - "$2" "$3" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
dist, want = sys.argv[1], sys.argv[2]
try:
    tv, pv = version("torch"), version(dist)
except PackageNotFoundError as e:
    print(f"missing {e}"); sys.exit(1)
import numpy  # noqa: F401  (the benchmark's DCP checkpoints need it)
import torch
cuda = torch.version.cuda
print(f"torch={tv} cuda={cuda} {dist}={pv}")
ok = tv.split("+")[0] == "2.13.0" and cuda is None and pv == want
sys.exit(0 if ok else 1)
PY
}

command -v "$PYTHON" >/dev/null || die "no interpreter '$PYTHON' (set PYTHON=...)"
mkdir -p "$DEST"

for entry in "${PEERS[@]}"; do
  IFS='|' read -r name dist ver <<<"$entry"
  venv="$DEST/$name"
  if [[ -x "$venv/bin/python" ]] && info="$(check_venv "$venv" "$dist" "$ver" 2>/dev/null)"; then
    echo "[$name] already installed: $info  ($venv)"
    continue
  fi
  echo "[$name] installing $TORCH_PIN (CPU) + $dist==$ver into $venv ..."
  t0=$SECONDS
  [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv" || die "[$name] could not create venv $venv"
  pipq "$venv" install -q --upgrade pip \
    || echo "[$name] warning: pip upgrade failed; going on with the venv's pip" >&2
  pipq "$venv" install -q "$TORCH_PIN" \
    || die "[$name] '$TORCH_PIN' did not install (is the CPU wheel still in pip's find-links / index?)"
  pipq "$venv" install -q "$TORCH_PIN" "$NUMPY_PIN" "$dist==$ver" \
    || die "[$name] '$dist==$ver' did not install with $TORCH_PIN on $("$venv/bin/python" -V 2>&1) (see pip's output above)"
  info="$(check_venv "$venv" "$dist" "$ver")" \
    || die "[$name] installed, but the pins do not hold or torch is not a CPU build: $info"
  echo "[$name] installed in $((SECONDS - t0)) s: $info"
done

echo "peer venvs under $DEST:"
for entry in "${PEERS[@]}"; do
  IFS='|' read -r name dist ver <<<"$entry"
  printf '  %-10s %s\n' "$name" "$(check_venv "$DEST/$name" "$dist" "$ver" || true)"
done
