#!/usr/bin/env bash
# The one command a lent GPU machine runs (docs/benchmarks/gpu.md): the GPU checks of drafterkit, offline, in
# about 8 minutes, every step under `timeout`, results under $OUT.
#
#   here, first:  bash scripts/gpu-wheels.sh                  (.whl/: the wheels the machine lacks, a tokenizer)
#   device:       run with carry [".whl"], timeout_s 600, command: bash scripts/gpu-run.sh
#   dry, here:    DRY=1 OUT=$(mktemp -d) bash scripts/gpu-run.sh   (toy shapes on the CPU; the test suite runs it)
#
# Steps:
#   1. install .whl/*.whl offline (pip --no-index --no-deps --target) into a scratch folder put on PYTHONPATH;
#      with no .whl/ folder (CI, a machine that has the packages) the step says so and is skipped;
#   2. make drafterkit importable without a build: a folder of links mapping drafterkit.X onto the repository's
#      folders as pyproject.toml's [tool.setuptools.package-dir] does, first on PYTHONPATH, and PYTHONSAFEPATH=1
#      so that no process (the launchers' too) puts the checkout itself, whose drafterkit/ holds only the CLI,
#      ahead of it; then every import the checks need, and the versions, into versions.json;
#   3. nvidia-smi (when there is one);
#   4. benchmarks/gpu_check.py --max-minutes $MAX_MINUTES (dry: --dry-run on the CPU) -> gpu_check.json;
#   5. benchmarks/scale_check.py on what one GPU runs: one process, accelerate's FSDP2 and DDP over one process
#      (--nproc 1; drafterkit's own sharding and DeepSpeed ZeRO need two processes, and NCCL refuses two on one
#      GPU) -> scale_check.json, with the time the budget has left (gpu_check.py leaves it 120 s at least).
# Everything printed also goes to $OUT/gpu-run.log; $OUT gets 4 files, no folder.
#
# Exit status: 1 when exactness failed (gpu_check.json has an exactness row that differs or failed, or a
# chi-square p-value < 1e-3); else 2 when a step failed or ran out of time; else 0.
#
# Environment: OUT (required: the results folder), DRY=1, PYTHON (default python3: on the GPU machine the one
# that holds torch), MAX_MINUTES (gpu_check.py's --max-minutes; default 4), BUDGET_S (seconds for the whole
# script, default 480), GPU_CHECK_ARGS (more gpu_check.py arguments, e.g. "--sections exact"), SCALE_ENGINES
# (default one,fsdp,ddp on CUDA, one dry; none: no scale check), SCALE_NPROC (default 1: the processes of the
# distributed engines; on a machine of N GPUs set N and add zero2,zero3 with GPU_WHEELS_DEEPSPEED=1 wheels),
# SCALE_ARGS (more scale_check.py arguments), TOKENIZER (the tokenizer folder for scale_check.py; default
# .whl/tokenizer when present, else scale_check.py's default), WHEELS_DIR (default .whl).
# A second call at once (the machine stays warm 30 s), for what the first left out, e.g.:
#   GPU_CHECK_ARGS="--sections speed --batches 8" SCALE_ENGINES=none MAX_MINUTES=2 BUDGET_S=200 bash scripts/gpu-run.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PY="${PYTHON:-python3}"
DRY="${DRY:-0}"
OUT="${OUT:?set OUT to the folder the results go to}"
MAX_MINUTES="${MAX_MINUTES:-4}"
BUDGET_S="${BUDGET_S:-480}"
mkdir -p "$OUT"
LOG="$OUT/gpu-run.log"
: >"$LOG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/drafterkit-gpu-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# no network on the GPU machine: the hub libraries must not wait on it
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
SCALE_ENGINES="${SCALE_ENGINES:-$([ "$DRY" = 1 ] && echo one || echo one,fsdp,ddp)}"
START=$SECONDS
declare -A RC

say() { echo "gpu-run [$(( SECONDS - START ))s]: $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET_S - (SECONDS - START) )); }
# step NAME SECONDS CMD...: run CMD under `timeout` (the whole process group, then SIGKILL 10 s later),
# output to the terminal and the log; its status in RC[NAME] (124: out of time).
step() {
    local name=$1 secs=$2
    shift 2
    if [ "$secs" -lt 5 ]; then
        say "$name: skipped, the budget of ${BUDGET_S}s is spent"
        RC[$name]=124
        return
    fi
    say "$name: start (at most ${secs}s): $*"
    timeout -k 10 "$secs" "$@" 2>&1 | tee -a "$LOG"
    RC[$name]=${PIPESTATUS[0]}
    say "$name: exit ${RC[$name]}$([ "${RC[$name]}" = 124 ] && echo ' (out of time)')"
}

say "repository $ROOT, python $PY, dry $DRY, OUT $OUT, budget ${BUDGET_S}s, gpu_check --max-minutes $MAX_MINUTES"

# 1. the carried wheels, offline
SITE="$WORK/site"
mkdir -p "$SITE"
WHEELS="${WHEELS_DIR:-.whl}"
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -gt 0 ]; then
    step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --disable-pip-version-check --target "$SITE" "${wheels[@]}"
else
    say "wheels: no $WHEELS/*.whl here (bash scripts/gpu-wheels.sh makes them): using the packages installed"
    RC[wheels]=0
fi

# 2. drafterkit importable from this checkout, no build and no network
TREE="$WORK/path"
mkdir -p "$TREE/drafterkit"
for f in "$ROOT"/drafterkit/*; do ln -s "$f" "$TREE/drafterkit/"; done
while IFS= read -r line; do
    if [[ $line =~ ^\"drafterkit\.([A-Za-z_]+)\"[[:space:]]*=[[:space:]]*\"([^\"]+)\" ]]; then
        ln -s "$ROOT/${BASH_REMATCH[2]}" "$TREE/drafterkit/${BASH_REMATCH[1]}"
    fi
done < <(sed -n '/^\[tool\.setuptools\.package-dir\]/,/^\[/p' pyproject.toml)
export PYTHONPATH="$TREE:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
step imports 120 "$PY" - "$OUT/versions.json" "$TREE" "$SITE" "${wheels[@]}" <<'EOF'
import importlib, importlib.metadata as md, json, os, platform, sys

out, tree, site, carried = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
info = {"python": platform.python_version(), "executable": sys.executable, "machine": platform.machine()}
for name in ("torch", "transformers", "accelerate", "peft", "safetensors", "tokenizers", "huggingface_hub", "numpy",
             "scipy", "pyarrow", "pandas", "fsspec", "pydantic", "pydantic_core", "typing_extensions", "datasets",
             "dill", "multiprocess", "deepspeed", "triton", "setuptools"):
    try:
        info[name] = md.version(name)
    except md.PackageNotFoundError:
        info[name] = None
import torch

info["torch_cuda"], info["cuda_available"] = torch.version.cuda, torch.cuda.is_available()
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info["gpu"] = {"name": p.name, "count": torch.cuda.device_count(), "capability": f"{p.major}.{p.minor}",
                   "memory_gib": round(p.total_memory / 2**30, 1)}
failed = []
for whl in carried:  # each carried wheel resolves to its own version, from the scratch folder
    name, version = os.path.basename(whl).split("-")[:2]
    try:
        dist = md.distribution(name)
        where = os.path.realpath(dist.locate_file(""))
        info.setdefault("carried", {})[name] = dist.version
        if dist.version != version or where != os.path.realpath(site):
            failed.append(f"{name} {version}: found {dist.version} in {where}")
    except md.PackageNotFoundError:
        failed.append(f"{name} {version}: not installed")
# what gpu_check.py and scale_check.py import, their training launches included
for mod in ("drafterkit.decode", "drafterkit.drafters.eagle3", "drafterkit.train.recipe", "drafterkit.train.strategies",
            "drafterkit.train.run", "drafterkit.train.data", "datasets", "scipy.stats", "accelerate.commands.launch"):
    try:
        m = importlib.import_module(mod)
        info.setdefault("imported", {})[mod] = "ok"
    except Exception as e:  # every missing piece at once, not the first alone
        failed.append(mod)
        info.setdefault("imported", {})[mod] = f"{type(e).__name__}: {e}"
import drafterkit.decode

info["drafterkit_from"] = drafterkit.decode.__file__
info["drafterkit_resolved"] = os.path.realpath(drafterkit.decode.__file__)
if not (drafterkit.decode.__file__.startswith(tree + os.sep)
        and os.path.realpath(drafterkit.decode.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep)):
    failed.append(f"drafterkit.decode imported from {drafterkit.decode.__file__}, not this checkout through {tree}")
if any(os.path.basename(w).startswith("deepspeed-") for w in carried):  # carried: reported, never a failure
    try:
        import deepspeed  # noqa: F401

        info["deepspeed_import"] = "ok"
    except Exception as e:
        info["deepspeed_import"] = f"{type(e).__name__}: {e}"
info["failed"] = failed
json.dump(info, open(out, "w"), indent=1)
print(json.dumps(info, indent=1))
sys.exit(1 if failed else 0)
EOF

# 3. the GPU
if command -v nvidia-smi >/dev/null 2>&1; then
    step nvidia-smi 30 nvidia-smi
else
    say "nvidia-smi: not on this machine"
fi

# 4. the GPU check: exactness, speed, cost model, training
if [ "$DRY" = 1 ]; then
    check=(--dry-run --device cpu)
else
    check=(--max-minutes "$MAX_MINUTES")
fi
# shellcheck disable=SC2206  # GPU_CHECK_ARGS: words on purpose
check+=(--json "$OUT/gpu_check.json" ${GPU_CHECK_ARGS:-})
keep=120  # the time scale_check.py needs at least
if [ "$SCALE_ENGINES" = none ]; then keep=0; fi
gpu_s=$(( $(left) - keep ))
step gpu_check "$gpu_s" "$PY" benchmarks/gpu_check.py "${check[@]}"
# exactness as gpu_check.json records it (a crash also exits 1): failed, passed, or none (no row ran)
exact=$("$PY" - "$OUT/gpu_check.json" <<'EOF' 2>>"$LOG"
import json, sys

try:
    rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["section"] == "exact"]
except (OSError, ValueError, KeyError):
    rows = []
bad = [r for r in rows if r.get("status") == "failed" or not (r.get("identical", True) and r.get("passed", True))]
print("failed" if bad else "passed" if any(r.get("status") == "ran" for r in rows) else "none")
EOF
)
say "exactness: ${exact:-none}"

# 5. the scale-out check on what one GPU runs
if [ "$SCALE_ENGINES" = none ]; then
    say "scale_check: not run (SCALE_ENGINES=none)"
else
    if [ "$DRY" = 1 ]; then
        scale=(--engines "$SCALE_ENGINES" --steps 1 --kind draft_lm)
    else
        scale=(--engines "$SCALE_ENGINES" --nproc "${SCALE_NPROC:-1}" --batch 8 --steps 2)
    fi
    tok="${TOKENIZER:-}"
    if [ -z "$tok" ] && [ -f "$WHEELS/tokenizer/tokenizer.json" ]; then tok="$WHEELS/tokenizer"; fi
    if [ -n "$tok" ]; then scale+=(--tokenizer "$tok"); fi
    # shellcheck disable=SC2206
    scale+=(--workdir "$WORK/scale" --json "$OUT/scale_check.json" ${SCALE_ARGS:-})
    step scale_check "$(( $(left) < 240 ? $(left) : 240 ))" "$PY" benchmarks/scale_check.py "${scale[@]}"
fi

summary=""
for name in wheels imports nvidia-smi gpu_check scale_check; do
    if [ -n "${RC[$name]+x}" ]; then summary+=" $name=${RC[$name]}"; fi
done
status=0
for name in "${!RC[@]}"; do
    if [ "${RC[$name]}" != 0 ]; then status=2; fi
done
if [ "$exact" = failed ]; then status=1; fi
say "done in $(( SECONDS - START ))s, exit $status (1: exactness failed; 2: another step failed): exactness $exact;" \
    "steps:$summary; files: $(cd "$OUT" && echo *)"
exit "$status"
