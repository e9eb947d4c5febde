#!/usr/bin/env bash
# Bring together, here (a machine with PyPI), what a lent GPU machine lacks for scripts/gpu-run.sh, in .whl/:
#
#   bash scripts/gpu-wheels.sh            # then: device run, carry [".whl"], command `bash scripts/gpu-run.sh`
#
# The GPU machine (docs/benchmarks/gpu.md) has Python 3.12, torch 2.11 (CUDA 13), transformers 5.17,
# accelerate 1.15, peft, pyarrow, pandas, xxhash, scipy and the like, no network, and no pydantic, datasets or
# deepspeed. This script downloads the pinned cp312 x86-64 wheels of what is missing (drafterkit's recipe schema:
# pydantic and its three needs; its data pipeline: datasets, dill, multiprocess), copies the default target's
# tokenizer (benchmarks/scale_check.py builds its random target with it; no weights) into .whl/tokenizer/, checks
# that the folder plus the working tree stay well under the 64 MiB that one device call carries, and adds /.whl/
# to git's exclude file so the folder never lands in a commit. The versions are the ones the CPU suite runs with.
#
# DeepSpeed only with GPU_WHEELS_DEEPSPEED=1 (a source package: built here into a pure-Python wheel, no op
# compiled, plus hjson). On one GPU it has nothing to run (ZeRO needs two processes, and NCCL refuses two on one
# GPU), and once it is importable accelerate imports it inside every save_pretrained (extract_model_from_parallel),
# so carrying it only adds a way to fail. Carry it for a machine of several GPUs.
#
# Environment: PYTHON (an interpreter with pip and drafterkit installed, for the download and the tokenizer's
# folder; default python3), GPU_WHEELS_MAX_MIB (the limit checked, default 40), GPU_WHEELS_DEEPSPEED=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
DEST=.whl
MAX_MIB="${GPU_WHEELS_MAX_MIB:-40}"
# Keep exactly one version of each: two wheels of one package stop the whole offline install on the device.
WHEELS=(
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  typing-extensions==4.16.0   # pydantic needs >= 4.14.1; newer than any the device may have, so safe to shadow it
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)
DEEPSPEED=deepspeed==0.19.8
if [ "${GPU_WHEELS_DEEPSPEED:-0}" = 1 ]; then
    WHEELS+=(hjson==3.1.0)  # DeepSpeed's config reader; its other needs (einops, ninja, msgpack...) are there
fi
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

export PIP_DISABLE_PIP_VERSION_CHECK=1
# git ignores the folder (the exclude file is shared by every worktree of the repository)
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
fi
rm -rf "$DEST"
mkdir -p "$DEST"
echo "gpu-wheels: downloading ${#WHEELS[@]} wheels for CPython 3.12, x86-64 Linux"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
if [ "${GPU_WHEELS_DEEPSPEED:-0}" = 1 ]; then
    echo "gpu-wheels: building $DEEPSPEED into a pure-Python wheel (DS_BUILD_OPS=0: no op compiled)"
    DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-binary deepspeed -w "$DEST" "$DEEPSPEED"
fi
count=$(find "$DEST" -maxdepth 1 -type f -name '*.whl' | wc -l)
want=$(( ${#WHEELS[@]} + ( ${GPU_WHEELS_DEEPSPEED:-0} == 1 ? 1 : 0 ) ))
if [ "$count" -ne "$want" ]; then
    echo "gpu-wheels: error: $count wheels in $DEST, expected $want (one per pinned package)" >&2
    ls "$DEST" >&2
    exit 1
fi
for whl in "$DEST"/*.whl; do  # platform wheels must be CPython 3.12 x86-64 Linux ones; the rest pure Python
    case "$(basename "$whl")" in
        *-none-any.whl|*-cp312-cp312-manylinux*x86_64.whl) ;;
        *) echo "gpu-wheels: error: $(basename "$whl") does not install on the device (CPython 3.12," \
                "x86-64 Linux)" >&2; exit 1 ;;
    esac
done

# The default target's tokenizer (no weights): scale_check.py --tokenizer .whl/tokenizer on the device.
tok_dir=$("$PY" -c "from drafterkit.assets.pinned import default_target_dir; print(default_target_dir())")
mkdir -p "$DEST/tokenizer"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja config.json \
         generation_config.json; do
    if [ -f "$tok_dir/$f" ]; then cp "$tok_dir/$f" "$DEST/tokenizer/"; fi
done
if [ ! -f "$DEST/tokenizer/tokenizer.json" ]; then
    echo "gpu-wheels: error: no tokenizer.json in $tok_dir (the default target's folder)" >&2
    exit 1
fi

# What one device call carries: the working tree (tracked and untracked-not-ignored files) and .whl/.
whl_kib=$(du -sk "$DEST" | cut -f1)
tree_kib=0
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    tree_kib=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- 2>/dev/null \
               | tail -1 | cut -f1)
fi
total_kib=$(( whl_kib + tree_kib ))
echo "gpu-wheels: $DEST holds $count wheels + tokenizer, $(( whl_kib / 1024 )).$(( whl_kib % 1024 * 10 / 1024 )) MiB;" \
     "with the working tree $(( total_kib / 1024 )) MiB of the 64 MiB a call carries (limit checked: $MAX_MIB MiB)"
if [ "$total_kib" -gt $(( MAX_MIB * 1024 )) ]; then
    echo "gpu-wheels: error: $(( total_kib / 1024 )) MiB would travel, over $MAX_MIB MiB: drop a wheel or" \
         "clean untracked files" >&2
    exit 1
fi

ls -l "$DEST"
