"""``drafterkit serve-check`` next to hybrid targets (recurrent layers beside attention) on vLLM's CPU build: refused
before vLLM starts, with vLLM's own reason (``drafters.export.vllm_support.cpu_hybrid_problem``).

Found by running vLLM 0.32 for CPU (``scripts/vllm-venv.sh``, fp32, ``enforce_eager``) on the tiny hybrid targets of
``tests/families_hybrid.py`` reshaped to attention heads of 32 (what vLLM's CPU attention takes):

* plain decoding: Nemotron-H, Granite-4.0-H and Falcon-H1 load and decode equal to transformers' greedy decoding
  (vLLM's Mamba-2 mixer runs on a CPU); LFM2-MoE loads but its outputs differ; a transformers-saved LFM2 config
  stops at load ("AttributeError: 'Lfm2Config' object has no attribute 'conv_dim'": released LFM2 configs carry
  ``conv_dim`` and ``block_dim``, transformers does not save them); Qwen3.5 (dense and MoE) stops at load ("No module
  named 'torchvision'", which the venv removes); Qwen3-Next stops at its first forward ("AssertionError: CPU GDN
  attention requires BF16.").
* speculative decoding (EAGLE-3, P-EAGLE, DFlash next to Nemotron-H; Medusa next to Qwen3-Next and each Mamba /
  convolution hybrid): the first speculative step stops in a Triton kernel ("TypeError: 'function' object is not
  subscriptable", ``precopy_mamba_align_fused_kernel``, the recurrent-state copy of prefix caching's 'align' mode);
  with prefix caching off the engine runs next to the Mamba / convolution hybrids, but its outputs differ from the
  target's greedy decoding (Nemotron-H EAGLE-3: 0 of 2 outputs, 4 of 22 chains equal to drafterkit's; vLLM's CPU
  ``causal_conv1d_update`` drops ``num_accepted_tokens``), so nothing hybrid is served with identical outputs on a
  CPU.

Each cell here: a hybrid target and a Medusa export (a method no other rule refuses), ``check_targets`` with the real
vLLM venv raises ``ServeCheckError`` with the one line, before vLLM or the target's weights load (seconds). One
more test runs vLLM past the refusal (Qwen3.5, Qwen3-Next, Nemotron-H in one vLLM process; ~25 s on 2 cores) and
checks it still stops with the error each refusal quotes. Marked ``serving``; skipped without the vLLM venv unless
``DRAFTERKIT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import pytest
from families import one_thread  # noqa: F401 (an autouse fixture: one intra-op thread)
from families_hybrid import HYBRID_FAMILIES, RECURRENT, save_hybrid
from test_serving_families import make_drafter

from drafterkit.drafters.export.writers import export
from drafterkit.speceval import serve_parity
from conftest import require_vllm_python

pytestmark = [pytest.mark.matrix, pytest.mark.serving]

VLLM_SHAPE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
#: the words of vLLM's own error each family's refusal quotes
REASONS = {"qwen3_5": "No module named 'torchvision'", "qwen3_5_moe": "No module named 'torchvision'",
           "qwen3_next": "CPU GDN attention requires BF16."}  # and STATE_COPY (checked below)
STATE_COPY = "TypeError: 'function' object is not subscriptable"


@pytest.mark.parametrize("family", RECURRENT)
def test_serves_on_cpu_refused(tmp_path, family, record_property):
    """serve-check refuses a hybrid target on vLLM's CPU build in one line quoting vLLM's reason and naming the fix."""
    python = require_vllm_python()
    if not serve_parity.vllm_on_cpu(python):
        pytest.skip("the vLLM venv is not vLLM's CPU build")
    folder = tmp_path / "target"
    target, _ = save_hybrid(family, folder, **VLLM_SHAPE)
    ckpt = make_drafter("medusa", target).save_pretrained(tmp_path / "medusa")
    out = export(ckpt, "medusa", tmp_path / "medusa-export", target=str(folder))
    with pytest.raises(serve_parity.ServeCheckError) as info:
        serve_parity.check_targets([(str(folder), [(out, None)])], prompts={str(folder): [[5, 6, 7]]}, max_new_tokens=4,
                                   k=2)
    line = str(info.value)
    assert "\n" not in line and "for CPU cannot serve" in line, line
    assert HYBRID_FAMILIES[family][1] in line and REASONS.get(family, STATE_COPY) in line, line
    assert (STATE_COPY in line) == (family not in ("qwen3_5", "qwen3_5_moe")), line
    assert "DRAFTERKIT_VLLM_PACKAGE=vllm" in line, line
    record_property("cell", "refused: " + line.split(": ", 1)[1].split("; serve-check")[0])


#: family -> what vLLM's CPU build says when a drafter is served next to it anyway: the job's error line, and a line
#: of its log (Qwen3.5's load fails in a subprocess of vLLM's registry, whose error the log holds)
OBSERVED = {"qwen3_next": (STATE_COPY, STATE_COPY), "nemotron_h": (STATE_COPY, STATE_COPY),
            "qwen3_5": ("ValidationError", "No module named 'torchvision'")}


@pytest.mark.slow
def test_vllm_for_cpu_still_fails_as_the_refusals_say(tmp_path):
    """The refusals' reasons are still vLLM's: past the refusal (``speceval.serve_parity.run_vllm``, the runner
    serve-check
    starts, ``keep_going``), vLLM for CPU stops on each family with the error its refusal quotes; when a new vLLM pin
    serves these targets, this fails and the refusal goes. One vLLM process (~25 s on 2 cores); two jobs failing in
    a row also check that a failed job's engine does not take the next job's parallel groups down with it."""
    python = require_vllm_python()
    if not serve_parity.vllm_on_cpu(python):
        pytest.skip("the vLLM venv is not vLLM's CPU build")
    jobs = []
    for family in OBSERVED:
        folder = tmp_path / family
        target, _ = save_hybrid(family, folder / "target", **VLLM_SHAPE)
        ckpt = make_drafter("medusa", target).save_pretrained(folder / "medusa")
        out = export(ckpt, "medusa", folder / "medusa-export", target=str(folder / "target"))
        jobs.append({"target": str(folder / "target"), "draft": str(out), "method": "medusa", "k": 2,
                     "max_new_tokens": 4, "prompts": [list(range(10, 50))], "eos": [2], "dtype": "float32"})
    log = tmp_path / "vllm.log"
    results = serve_parity.run_vllm(jobs, python, timeout=400, log=log, keep_going=True)["results"]
    text = log.read_text(errors="replace")
    for family, result in zip(OBSERVED, results):
        assert "error" in result, f"vLLM served a {family} target on a CPU: drop its refusal (cpu_hybrid_problem)"
        error, in_log = OBSERVED[family]
        assert error in result["error"] and in_log in text, (family, result["error"])
