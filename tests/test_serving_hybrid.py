"""``drafterkit serve-check`` next to hybrid targets (recurrent layers beside attention) on vLLM's CPU build: refused
before vLLM starts, with vLLM's own reason (``drafters.vllm_support.cpu_hybrid_problem``).

Found by running vLLM 0.32 for CPU (``scripts/vllm-venv.sh``, fp32, ``enforce_eager``) on the tiny hybrid targets of
``tests/families_hybrid.py`` reshaped to attention heads of 32 (what vLLM's CPU attention takes):

* plain decoding: Nemotron-H, Granite-4.0-H and Falcon-H1 load and decode equal to transformers' greedy decoding
  (vLLM's Mamba-2 mixer runs on a CPU); LFM2-MoE loads but its outputs differ; a transformers-saved LFM2 config
  stops at load ("AttributeError: 'Lfm2Config' object has no attribute 'conv_dim'": released LFM2 configs carry
  ``conv_dim`` and ``block_dim``, transformers does not save them); Qwen3.5 (dense and MoE) stops at load ("No module
  named 'torchvision'", which the venv removes); Qwen3-Next stops at its first forward ("AssertionError: CPU GDN
  attention requires BF16.").
* speculative decoding (EAGLE-3, P-EAGLE, DFlash next to Nemotron-H; Medusa next to each Mamba / convolution
  hybrid): the first speculative step stops in a Triton kernel ("TypeError: 'function' object is not subscriptable",
  ``precopy_mamba_align_fused_kernel``, the Mamba state copy of prefix caching's 'align' mode); with prefix caching
  off the engine runs, but its outputs differ from the target's greedy decoding (Nemotron-H EAGLE-3: 0 of 2 outputs,
  4 of 22 chains equal to drafterkit's), so nothing hybrid is served with identical outputs on a CPU.

Each cell here: a hybrid target and a Medusa export (a method no other rule refuses), ``check_targets`` with the real
vLLM venv raises ``ServeCheckError`` with the one line, before vLLM or the target's weights load. Marked ``serving``;
skipped without the vLLM venv unless ``DRAFTERKIT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import pytest
from families import one_thread  # noqa: F401 (an autouse fixture: one intra-op thread)
from families_hybrid import HYBRID_FAMILIES, RECURRENT, save_hybrid
from test_serving_families import make_drafter

from drafterkit.drafters.export import export
from drafterkit.speceval import serving
from conftest import require_vllm_python

pytestmark = [pytest.mark.matrix, pytest.mark.serving]

VLLM_SHAPE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
#: the words of vLLM's own error each family's refusal quotes
REASONS = {"qwen3_5": "No module named 'torchvision'", "qwen3_5_moe": "No module named 'torchvision'",
           "qwen3_next": "CPU GDN attention requires BF16."}
STATE_COPY = "TypeError: 'function' object is not subscriptable"


@pytest.mark.parametrize("family", RECURRENT)
def test_serves_on_cpu_refused(tmp_path, family, record_property):
    """serve-check refuses a hybrid target on vLLM's CPU build in one line quoting vLLM's reason and naming the fix."""
    python = require_vllm_python()
    if not serving.vllm_on_cpu(python):
        pytest.skip("the vLLM venv is not vLLM's CPU build")
    folder = tmp_path / "target"
    target, _ = save_hybrid(family, folder, **VLLM_SHAPE)
    ckpt = make_drafter("medusa", target).save_pretrained(tmp_path / "medusa")
    out = export(ckpt, "medusa", tmp_path / "medusa-export", target=str(folder))
    with pytest.raises(serving.ServeCheckError) as info:
        serving.check_targets([(str(folder), [(out, None)])], prompts={str(folder): [[5, 6, 7]]}, max_new_tokens=4,
                              k=2)
    line = str(info.value)
    assert "\n" not in line and "for CPU cannot serve" in line, line
    assert HYBRID_FAMILIES[family][1] in line and REASONS.get(family, STATE_COPY) in line, line
    assert "DRAFTERKIT_VLLM_PACKAGE=vllm" in line, line
    record_property("cell", "refused: " + line.split(": ", 1)[1].split("; serve-check")[0])
