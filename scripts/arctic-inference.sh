#!/usr/bin/env bash
# Build Arctic Inference (the package vLLM's `suffix` speculative method imports) for the vLLM CPU venv,
# without touching that venv: the package goes to its own folder, put on PYTHONPATH by the suffix parity test
# (tests/test_speceval_suffix_vllm.py) and by anyone running vLLM's suffix method on a CPU.
#
#   bash scripts/arctic-inference.sh [DEST]   # default: $DRAFTERKIT_HOME/arctic-inference
#
# PyPI has arctic-inference only as a source distribution (0.3.0); its build dependencies pin torch==2.10.0, which
# an isolated build would download (a CUDA wheel) only to read torch's cmake path. So it is built without
# isolation by the vLLM venv's python (torch 2.13 cpu), its other build requirements (nanobind 2.9.2, ninja,
# grpcio-tools, protobuf 5.29.5) installed into a scratch folder first. Only the suffix-tree extension
# (C++, nanobind) is compiled; no CUDA. Idempotent: a folder that already imports is left alone.
set -euo pipefail

HOME_DIR="${DRAFTERKIT_HOME:-$HOME/.cache/drafterkit}"
DEST="${1:-$HOME_DIR/arctic-inference}"
VENV="${DRAFTERKIT_VLLM_VENV:-$HOME_DIR/vllm-venv}"
PKG="${ARCTIC_INFERENCE_PACKAGE:-arctic-inference==0.3.0}"
if PYTHONPATH="$DEST" "$VENV/bin/python" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache" 2>/dev/null; then
    echo "arctic-inference: $DEST is ready (delete the folder to rebuild it)"
    exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$VENV/bin/pip" install -q --target "$WORK/deps" "nanobind==2.9.2" ninja grpcio-tools "protobuf==5.29.5" setuptools wheel
"$VENV/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation "$PKG" -d "$WORK/src"
tar xzf "$WORK"/src/*.tar.gz -C "$WORK/src"
(cd "$WORK"/src/*/ && PYTHONPATH="$WORK/deps" PATH="$WORK/deps/bin:$PATH" \
    "$VENV/bin/pip" wheel -q --no-build-isolation --no-deps -w "$WORK/wheel" .)
# installed beside DEST, then moved into place, so an interrupted build never leaves a half folder
"$VENV/bin/pip" install -q --no-deps --target "$WORK/dest" "$WORK"/wheel/*.whl
PYTHONPATH="$WORK/dest" "$VENV/bin/python" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$WORK/dest" "$DEST"
echo "arctic-inference: built into $DEST (run vLLM with PYTHONPATH=$DEST)"
