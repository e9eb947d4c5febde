"""Which targets vLLM 0.32 serves an EAGLE-3 / P-EAGLE head or a DFlash drafter next to (``drafters.vllm_support``).

Targets vLLM serves through its generic Transformers backend (every backend class implements SupportsEagle3) are
accepted: those its registry maps there (SmolLM3) and those absent from its registry that transformers implements
(Helium); natively implemented targets without SupportsEagle3 (Gemma-2, Gemma-3) are still refused. The unit tests
need no vLLM; the serving one runs a real ``serve-check`` on a tiny SmolLM3 target (head_dim 64: vLLM's CPU
attention takes no head size 16) and skips without the vLLM venv (``scripts/vllm-venv.sh``) unless
``DRAFTERKIT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations


import pytest
import torch
from families import VOCAB, family_prompts, tiny_tokenizer

from drafterkit.cli import main as cli
from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.export import export
from drafterkit.drafters.vllm_registry import NATIVE_ARCHITECTURES
from drafterkit.drafters.vllm_support import EAGLE3_TARGET_ARCHITECTURES, eagle3_serve_problem, vllm_model_class
from drafterkit.speceval import serving
from conftest import require_vllm_python

#: a tiny SmolLM3 (2 heads of 64, 1 KV head, 4 layers) with the shared tiny tokenizer's vocabulary
SMOLLM3 = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 4,
           "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256,
           "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _save_smollm3(folder):
    """A seeded random tiny SmolLM3ForCausalLM target saved to ``folder``; returns the model."""
    from transformers import AutoConfig, SmolLM3ForCausalLM

    torch.manual_seed(0)
    model = SmolLM3ForCausalLM(AutoConfig.for_model("smollm3", **SMOLLM3)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper logits: greedy decoding is no tie-break between near-equal ones
    model.requires_grad_(False)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def _export(kind: str, target, folder):
    cfg_cls, cls = {"eagle3": (Eagle3Config, Eagle3Drafter), "dflash": (DFlashConfig, DFlashDrafter)}[kind]
    extra = {"block_size": 4} if kind == "dflash" else {}
    torch.manual_seed(0)
    drafter = cls(cfg_cls.from_target(target, draft_vocab_size=VOCAB // 2, **extra), target=target)
    drafter.set_draft_vocab(torch.arange(VOCAB // 2) * 2, target=target)
    return export(drafter.save_pretrained(folder / kind), f"vllm-{kind}", folder / f"{kind}-export")


def test_transformers_backend_targets_are_accepted_and_native_ones_without_the_interface_refused():
    assert vllm_model_class("SmolLM3ForCausalLM") == "transformers"  # in the registry's Transformers-backend table
    assert vllm_model_class("HeliumForCausalLM") == "transformers"  # absent from the registry, in transformers
    assert vllm_model_class("Gemma2ForCausalLM") == vllm_model_class("LlamaForCausalLM") == "native"
    for arch in ("SmolLM3ForCausalLM", "HeliumForCausalLM", "Olmo2ForCausalLM", "TransformersForCausalLM",
                 "LlamaForCausalLM"):
        assert eagle3_serve_problem(arch) is None, arch
    for arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        assert "SupportsEagle3" in eagle3_serve_problem(arch), arch
    line = eagle3_serve_problem("NoSuchModelForCausalLM")
    assert "no model class" in line and "registry" in line, line
    assert EAGLE3_TARGET_ARCHITECTURES <= NATIVE_ARCHITECTURES  # the list names native classes only


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_serve_check_does_not_refuse_a_smollm3_target(tmp_path, capsys, kind):
    """Before the fix serve-check refused the SmolLM3 target itself; now it gets as far as looking for the venv."""
    target = _save_smollm3(tmp_path / "smollm3")
    out = _export(kind, target, tmp_path)
    capsys.readouterr()
    assert cli(["serve-check", str(out), "--target", str(tmp_path / "smollm3"), "--venv", str(tmp_path / "none")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "no vLLM venv" in line and "SupportsEagle3" not in line, line


@pytest.mark.slow
@pytest.mark.serving
def test_vllm_serves_an_eagle3_export_next_to_a_smollm3_target(tmp_path):
    """vLLM 0.32 loads the EAGLE-3 export next to a SmolLM3 target through its Transformers backend and drafts
    as drafterkit does (same outputs and draft chains on 2 prompts x 8 new tokens)."""
    require_vllm_python()
    folder = tmp_path / "smollm3"
    out = _export("eagle3", _save_smollm3(folder), tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as vLLM's CPU engine runs
    try:
        ((r,),) = serving.check_targets([(str(folder), [(out, None)])], prompts={str(folder): family_prompts(2, 16)},
                                        max_new_tokens=8, k=3, log=tmp_path / "vllm.log", timeout=600)
    finally:
        torch.set_num_threads(before)
    c = r["comparison"]
    assert c["outputs_identical"] == c["prompts"] == 2, serving.format_report(r)
    assert c["chains_identical"] == c["chains"] > 0, serving.format_report(r)
