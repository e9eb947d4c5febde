"""vLLM serves each export format next to each model family's tiny target, drafting as drafterkit does: the
"serves in vLLM" columns of the support matrix (``scripts/support_matrix.py``).

A cell is a family x export format. The drafter is built from the family's tiny random target
(``tests/families.py``, reshaped to 2 heads of 32, which vLLM's CPU attention takes), seeded and untrained,
saved, exported with ``drafters.export.writers.export`` and served by vLLM 0.32 on a CPU next to the saved target,
greedy in fp32 (``speceval.serve_parity.check_targets``): vLLM's outputs and every draft chain it proposes must equal
drafterkit's decoder's on the same 2 prompts of 40 tokens (past the 32-token sliding window of Gemma-2, Gemma-3
and gpt-oss) x 12 new tokens. Every served cell runs in ONE vLLM process (an engine per cell, ~5 s each on 2 cores).
A cell drafterkit refuses before vLLM starts checks that refusal's one line instead (seconds, no vLLM): EAGLE-3,
P-EAGLE, DFlash and DSpark need a target class with vLLM's SupportsEagle3 interface
(``drafters.export.vllm_support``), and vLLM's CPU build refuses method ``dspark`` on every target
(``drafters.kinds.ExportFormat.cpu_refusal``; ``tests/test_drafters_dspark.py`` checks vLLM itself still does).

Which cells run: all of them with ``DRAFTERKIT_SERVING_MATRIX=full`` (what ``scripts/support_matrix.py`` runs
for the page, ~5 minutes); otherwise (CI) every refused cell and :data:`CI_CELLS`, every family and every
format it serves at least once (~1.5 minutes). Marked ``matrix``, ``serving`` and ``slow``; skipped without the vLLM
venv (``scripts/vllm-venv.sh``) unless ``DRAFTERKIT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from families import FAMILIES, build_family, family_prompts

from drafterkit.drafters.export.writers import export
from drafterkit.speceval import serve_parity
from conftest import require_vllm_python

pytestmark = [pytest.mark.matrix, pytest.mark.serving, pytest.mark.slow]

VLLM_SHAPE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
#: export format -> (vLLM's method, the drafterkit kind exported)
FORMATS = {"hf-assistant": ("draft_model", "draft_lm"), "medusa": ("medusa", "medusa"),
           "vllm-eagle3": ("eagle3", "eagle3"), "vllm-peagle": ("peagle", "peagle"),
           "vllm-dflash": ("dflash", "dflash"), "vllm-dspark": ("dspark", "dspark")}
PROMPT_LEN, NEW, K = 40, 12, 3
#: the cells CI serves (one vLLM engine each): every family once and every format vLLM's CPU build serves at least
#: twice (vllm-dspark: none, every cell refused)
CI_CELLS = [("llama3", "vllm-eagle3"), ("qwen2", "vllm-dflash"), ("qwen3", "vllm-peagle"), ("qwen3_moe", "medusa"),
            ("mistral", "vllm-eagle3"), ("gemma2", "hf-assistant"), ("gemma3", "medusa"), ("phi3", "vllm-dflash"),
            ("olmo2", "hf-assistant"), ("granite", "vllm-peagle"), ("gpt_oss", "vllm-eagle3")]
FULL = os.environ.get("DRAFTERKIT_SERVING_MATRIX") == "full"


def _refusal(family: str, fmt: str) -> str | None:
    """What serve-check refuses the cell with on vLLM's CPU build, in its order: a target without SupportsEagle3
    for a drafter reading auxiliary hidden states, then a method the CPU build refuses (DSpark); None: served."""
    from drafterkit.drafters.export.vllm_support import eagle3_serve_problem
    from drafterkit.drafters.kinds import KINDS, export_format, export_formats

    arch, method = FAMILIES[family][1], FORMATS[fmt][0]
    aux = eagle3_serve_problem(arch, KINDS[export_formats()[fmt]].with_article) \
        if serve_parity.reads_aux_hidden(method) else None
    return aux or export_format(fmt).cpu_refusal


ALL = [(f, fmt) for f in FAMILIES for fmt in FORMATS]
REFUSED = [c for c in ALL if _refusal(*c)]
SERVED = [c for c in ALL if c not in REFUSED and (FULL or c in CI_CELLS)]


def make_drafter(kind: str, target):
    """A seeded, untrained drafter of ``kind`` started from ``target`` (EAGLE-3 / P-EAGLE / DFlash / DSpark with a
    draft vocabulary of every other id, so the export's d2t mapping is exercised). DFlash's block is the shipped
    recipe's (8: 7 mask slots) while vLLM drafts K=3, so vLLM runs the shorter block ``[bonus, mask x 3]``, and its LM
    head rows stay random (not the target's): margins narrow enough that the trained block's drafts differ from the
    shorter one's (Qwen2: 19 of 22 chains equal vLLM's), which drafterkit's side must run too (``mask_slots``).
    DSpark's block is its recipe's too (7), with a Markov head of rank 8."""
    from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
    from drafterkit.drafters.draft_lm import DraftLM
    from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter
    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
    from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
    from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter

    torch.manual_seed(0)
    vocab = target.config.vocab_size
    if kind == "draft_lm":
        return DraftLM.from_target(target, 1)
    if kind == "medusa":
        return MedusaDrafter(MedusaConfig.from_target(target, num_heads=K), target=target)
    config, cls = {"eagle3": (Eagle3Config, Eagle3Drafter), "peagle": (PEagleConfig, PEagleDrafter),
                   "dflash": (DFlashConfig, DFlashDrafter), "dspark": (DSparkConfig, DSparkDrafter)}[kind]
    extra = {"dflash": {"block_size": 8}, "dspark": {"block_size": 7, "markov_rank": 8}}.get(kind, {})
    drafter = cls(config.from_target(target, draft_vocab_size=vocab // 2, **extra), target=target)
    drafter.set_draft_vocab(torch.arange(vocab // 2) * 2, target=None if kind in ("dflash", "dspark") else target)
    return drafter


def _prepare(root: Path, family: str, formats: list[str]) -> tuple[str, list]:
    folder = root / family / "target"
    target, tok = build_family(family, **VLLM_SHAPE)
    target.save_pretrained(folder)
    tok.save_pretrained(folder)
    exports = []
    for fmt in formats:
        ckpt = make_drafter(FORMATS[fmt][1], target).save_pretrained(root / family / fmt)
        exports.append((export(ckpt, fmt, root / family / f"{fmt}-export", target=str(folder)), None))
    return str(folder), exports


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    """``{(family, format): report}`` of every cell in :data:`SERVED` that this run selected (``-k``), from one vLLM
    process."""
    selected = {(i.callspec.params["family"], i.callspec.params["fmt"]) for i in request.session.items
                if getattr(i, "originalname", None) == "test_serves"}
    require_vllm_python()
    root = tmp_path_factory.mktemp("serving-families")
    groups, cells, prompts = [], [], {}
    for family in FAMILIES:
        formats = [fmt for f, fmt in SERVED if f == family and (f, fmt) in selected]
        if formats:
            folder, exports = _prepare(root, family, formats)
            groups.append((folder, exports))
            cells += [(family, fmt) for fmt in formats]
            prompts[folder] = family_prompts(2, PROMPT_LEN)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as vLLM's CPU engine runs; the tiny models gain nothing from a second thread
    try:
        reports = serve_parity.check_targets(groups, prompts=prompts, max_new_tokens=NEW, k=K, keep_going=True,
                                             log=root / "vllm.log", timeout=300 + 120 * len(cells))
    finally:
        torch.set_num_threads(before)
    return dict(zip(cells, [r for group in reports for r in group]))


@pytest.mark.parametrize("family,fmt", SERVED, ids=[f"{f}-{fmt}" for f, fmt in SERVED])
def test_serves(served, family, fmt, record_property):
    """vLLM loads the export next to the target and proposes the same chains as drafterkit, outputs equal."""
    r = served[family, fmt]
    assert "error" not in r, serve_parity.format_report(r)
    c = r["comparison"]
    assert c["outputs_identical"] == c["prompts"] == 2, serve_parity.format_report(r)
    assert c["chains_identical"] == c["chains"] > 0, serve_parity.format_report(r)
    record_property("cell", f"pass (chains {c['chains_identical']}/{c['chains']})")


@pytest.mark.parametrize("family,fmt", REFUSED, ids=[f"{f}-{fmt}" for f, fmt in REFUSED])
def test_serves_refused(tmp_path, family, fmt, record_property):
    """drafterkit refuses the cell before vLLM starts (``drafterkit serve-check`` exits 2 with the line). The venv is
    a stand-in of vLLM's CPU build (its marker, this python, no vLLM): serve-check reads which build it is from the
    marker, and a refusal that came after vLLM started would be vLLM's import error here, not the line."""
    from drafterkit.drafters.export.vllm_support import VLLM_VERSION
    from drafterkit.speceval.serve_refusals import MARKER

    venv = tmp_path / "vllm-cpu"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / MARKER).write_text(f"vllm-cpu=={VLLM_VERSION}: vllm {VLLM_VERSION}, torch {torch.__version__}")
    folder, ((out, _),) = _prepare(tmp_path, family, [fmt])
    with pytest.raises(serve_parity.ServeCheckError) as info:
        serve_parity.check_targets([(folder, [(out, None)])], venv=venv)
    line, reason = str(info.value), _refusal(family, fmt)
    assert "\n" not in line and line.startswith(f"{out}: {reason}; "), line
    if "SupportsEagle3" in reason:
        assert FAMILIES[family][1] in reason, reason
    record_property("cell", f"refused: {reason}")
