"""Tiny seeded random targets of the hybrid and 2026 families, built from transformers 5.25 configs as
``tests/families.py`` builds the attention families (hidden 64, 4 layers, the 320-token tokenizer with its ChatML
template saved beside them).

Hybrid families mix recurrent layers with attention: Qwen3.5 (dense and MoE) and Qwen3-Next (Gated DeltaNet linear
attention and gated full attention), Nemotron-H (Mamba-2, attention and MLP-only blocks from
``hybrid_override_pattern``), Granite-4.0-H (Mamba-2 and attention layers, MoE), Falcon-H1 (Mamba-2 beside attention
in every layer), LFM2 (dense and MoE: short convolutions and attention), Jamba (Mamba and attention layers, MoE),
Bamba (Mamba-2 and attention layers) and Zamba2 (Mamba-2 layers, two running its shared attention block). The 2026
attention families: Gemma-4 (per-layer ``head_dim``: full-attention layers take ``global_head_dim``; per-layer input
embeddings), DeepSeek-V3 (multi-head latent attention, MoE), Llama-4, OLMo-3, Seed-OSS, GLM-4.5, EXAONE-4,
ERNIE-4.5, MiniMax-M2 and SmolLM3. Each hybrid keeps at least one
attention layer, so a drafter head can start from it::

    from families_hybrid import HYBRID_FAMILIES, save_hybrid

    save_hybrid("qwen3_5", tmp_path / "target")  # a target folder (weights, config, tokenizer)
"""

from __future__ import annotations

from pathlib import Path

import torch
from families import VOCAB, tiny_tokenizer

_BASE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
         "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_GATED_DELTANET = {"head_dim": 16, "layer_types": ["linear_attention", "linear_attention", "full_attention",
                                                   "linear_attention"],
                   "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 16,
                   "linear_value_head_dim": 16}

#: family -> (model_type, causal-LM class name, config overrides); the recurrent families first
HYBRID_FAMILIES: dict[str, tuple[str, str, dict]] = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", dict(_GATED_DELTANET)),
    "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", {
        **_GATED_DELTANET, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32}),
    "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM", {
        **_GATED_DELTANET, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32}),
    "nemotron_h": ("nemotron_h", "NemotronHForCausalLM", {
        "head_dim": 16, "hybrid_override_pattern": "M*M-", "mamba_num_heads": 4, "mamba_head_dim": 16,
        "ssm_state_size": 16, "n_groups": 1, "chunk_size": 16, "expand": 1}),
    "granite_h": ("granitemoehybrid", "GraniteMoeHybridForCausalLM", {
        "layer_types": ["mamba", "attention", "mamba", "mamba"], "num_local_experts": 2, "num_experts_per_tok": 1,
        "shared_intermediate_size": 96, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16,
        "mamba_n_groups": 1, "mamba_chunk_size": 16, "mamba_expand": 1}),
    "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM", {
        "head_dim": 16, "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16,
        "mamba_chunk_size": 16}),
    "lfm2": ("lfm2", "Lfm2ForCausalLM", {"layer_types": ["conv", "conv", "full_attention", "conv"],
                                         "conv_L_cache": 3, "block_ff_dim": 96}),
    "lfm2_moe": ("lfm2_moe", "Lfm2MoeForCausalLM", {
        "layer_types": ["conv", "conv", "full_attention", "conv"], "conv_L_cache": 3, "num_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 32, "num_dense_layers": 1}),
    "jamba": ("jamba", "JambaForCausalLM", {
        "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
        "num_experts": 2, "num_experts_per_tok": 1, "mamba_d_state": 16, "mamba_dt_rank": 8, "mamba_expand": 1}),
    "bamba": ("bamba", "BambaForCausalLM", {
        "attn_layer_indices": [1, 3], "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16,
        "mamba_n_groups": 1, "mamba_chunk_size": 16, "mamba_expand": 1}),
    "zamba2": ("zamba2", "Zamba2ForCausalLM", {
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "mamba_d_state": 16, "n_mamba_heads": 4,
        "mamba_expand": 1, "chunk_size": 16, "attention_head_dim": 16}),
    "gemma4": ("gemma4_text", "Gemma4ForCausalLM", {
        "head_dim": 16, "global_head_dim": 32, "sliding_window": 32, "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": VOCAB,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "full_attention"]}),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3ForCausalLM", {
        "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16, "v_head_dim": 16, "head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "moe_intermediate_size": 48, "first_k_dense_replace": 1, "n_group": 1,
        "topk_group": 1}),
    # the other 2026 attention families: Llama-4 (chunked attention, NoPE layers, MoE), OLMo-3 (post-norms, sliding
    # window), Seed-OSS, GLM-4.5 (MoE), EXAONE-4 (post-norms, sliding window), ERNIE-4.5, MiniMax-M2 (whole-width
    # q/k norms, MoE), SmolLM3 (NoPE layers)
    "llama4": ("llama4_text", "Llama4ForCausalLM", {
        "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
        "intermediate_size_mlp": 96, "use_qk_norm": True, "no_rope_layer_interval": 4, "attention_chunk_size": 16}),
    "olmo3": ("olmo3", "Olmo3ForCausalLM", {"sliding_window": 32}),
    "seed_oss": ("seed_oss", "SeedOssForCausalLM", {"head_dim": 16}),
    "glm4_moe": ("glm4_moe", "Glm4MoeForCausalLM", {
        "head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "n_shared_experts": 1}),
    "exaone4": ("exaone4", "Exaone4ForCausalLM", {"head_dim": 16, "sliding_window": 32, "sliding_window_pattern": 4}),
    "ernie4_5": ("ernie4_5", "Ernie4_5ForCausalLM", {"head_dim": 16}),
    "minimax_m2": ("minimax_m2", "MiniMaxM2ForCausalLM", {
        "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1, "rotary_dim": 8}),
    "smollm3": ("smollm3", "SmolLM3ForCausalLM", {"no_rope_layer_interval": 4}),
}
#: the families with recurrent layers (the others are attention throughout)
HYBRID_RECURRENT = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "nemotron_h", "granite_h", "falcon_h1", "lfm2", "lfm2_moe",
                    "jamba", "bamba", "zamba2")
#: those whose serving on vLLM's CPU build tests/test_serving_hybrid.py checks (not yet Jamba, Bamba, Zamba2)
RECURRENT = HYBRID_RECURRENT[:8]


def hybrid_config(family: str, **overrides):
    """The tiny transformers config of ``family`` (a key of :data:`HYBRID_FAMILIES`), with ``overrides``."""
    from transformers import AutoConfig

    model_type, _, own = HYBRID_FAMILIES[family]
    return AutoConfig.for_model(model_type, **{**_BASE, **own, **overrides})


def build_hybrid(family: str, seed: int = 0, **overrides):
    """``(model, tokenizer)``: a seeded random causal LM of ``family`` (fp32, eval mode, frozen), its LM head
    scaled up 8x so greedy decoding is no tie-break between near-uniform logits, and the tiny tokenizer."""
    import transformers

    cfg = hybrid_config(family, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, HYBRID_FAMILIES[family][1])(cfg).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.requires_grad_(False)
    model.generation_config.eos_token_id = cfg.eos_token_id
    return model, tiny_tokenizer()


def save_hybrid(family: str, folder: Path, seed: int = 0, **overrides):
    """Save :func:`build_hybrid`'s model and tokenizer to ``folder`` (a target folder a recipe can name)."""
    model, tok = build_hybrid(family, seed, **overrides)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok
