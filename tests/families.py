"""Tiny seeded random targets of every model family drafterkit claims, built from transformers configs.

Each family is a config dict of the real architecture shrunk to hidden 64, 4 layers and a 320-token
vocabulary (the family's own quirks kept: Llama-3's ``llama3`` RoPE scaling, Qwen3's q/k norms, Qwen3-MoE's
experts, Gemma-2's logit soft-capping and sliding window, Phi-3's fused ``qkv_proj`` / ``gate_up_proj``,
OLMo-2's post-norms, Granite's multipliers, gpt-oss's experts and attention sinks), with a small local
byte-level BPE tokenizer (built with the ``tokenizers`` library, no Hub access) whose vocabulary matches
the config, and a ChatML chat template. Two more, Llama-4's text model and DeepSeek-V2
(:data:`DECODER_FAMILIES`), are built the same way for the decoder's exactness tests only. Used by the
per-family tests (``tests/test_*_families*.py``) and reusable by any test::

    from families import FAMILIES, build_family, save_family

    model, tok = build_family("phi3")            # fp32, eval mode, frozen
    save_family("qwen3", tmp_path / "target")    # a target folder (weights, config, tokenizer)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

VOCAB = 320  # the config's vocabulary; the tokenizer holds exactly these many tokens
SPECIALS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]  # ids 0..3: pad, bos, eos, turn start
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# the shared shape of every family: hidden 64, 4 query heads of 16, 2 KV heads, 4 layers
_BASE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
         "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

# family -> (model_type, causal-LM class name, config overrides)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama3": ("llama", "LlamaForCausalLM", {
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", {}),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", {"head_dim": 16}),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", {
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
        "decoder_sparse_step": 1, "norm_topk_prob": True}),
    "mistral": ("mistral", "MistralForCausalLM", {"sliding_window": 128, "head_dim": 16}),
    # tied embeddings, as every released Gemma-2: vLLM's Gemma2ForCausalLM has no lm_head (its logits come from
    # embed_tokens), so an untied target's lm_head.weight has no parameter to load into and vLLM stops at load
    "gemma2": ("gemma2", "Gemma2ForCausalLM", {
        "head_dim": 16, "sliding_window": 32, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
        "query_pre_attn_scalar": 16, "tie_word_embeddings": True}),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM", {
        "head_dim": 16, "sliding_window": 32, "query_pre_attn_scalar": 16,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]}),
    "phi3": ("phi3", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "olmo2": ("olmo2", "Olmo2ForCausalLM", {}),
    "granite": ("granite", "GraniteForCausalLM", {
        "embedding_multiplier": 2.0, "residual_multiplier": 0.5, "logits_scaling": 2.0, "attention_multiplier": 0.25}),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM", {
        "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64}}),
}

#: families the decoder is checked on (greedy speculative decoding == plain decoding, fp32 and bf16) but that are
#: not in :data:`FAMILIES`, which the support matrix, training and vLLM serving tests cover: Llama-4's text model
#: (MoE layers with a shared expert, q/k norms, NoPE layers, chunked attention) and DeepSeek-V2 (multi-head latent
#: attention, MoE with a shared expert). Their rotary embeddings go through ``torch.view_as_complex``, which needs
#: a last dimension of stride 1 from the q/k projections. Built by the same :func:`build_family`.
DECODER_FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama4": ("llama4_text", "Llama4ForCausalLM", {
        "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
        "intermediate_size_mlp": 96, "use_qk_norm": True, "no_rope_layer_interval": 4}),
    "deepseek_v2": ("deepseek_v2", "DeepseekV2ForCausalLM", {
        "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16, "v_head_dim": 16, "head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "moe_intermediate_size": 48, "first_k_dense_replace": 1, "topk_method": "greedy"}),
}

_CORPUS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n",
           "List the days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday.",
           "question answer user assistant system hello world 0123456789 ( ) [ ] { } , . ; : ! ?"]


#: families whose attention has a sliding window (the tiny configs' window, 32, exceeds the test sequences)
SLIDING = ("mistral", "gemma2", "gemma3", "gpt_oss")


def _spec(family: str) -> tuple[str, str, dict]:
    return FAMILIES[family] if family in FAMILIES else DECODER_FAMILIES[family]


def family_config(family: str, **overrides):
    """The transformers config of ``family`` (a key of :data:`FAMILIES` or :data:`DECODER_FAMILIES`; tiny, see
    the module docstring), with ``overrides``."""
    from transformers import AutoConfig

    model_type, _, own = _spec(family)
    return AutoConfig.for_model(model_type, **{**_BASE, **own, **overrides})


def build_family(family: str, seed: int = 0, **overrides):
    """``(model, tokenizer)``: a seeded random causal LM of ``family`` (fp32, eval mode, frozen; same seed ->
    same weights) and the shared tiny tokenizer; ``overrides`` change config fields (e.g. ``sliding_window``).
    The logits are scaled up 8x (the LM head, or the final norm where the head is tied to the embeddings) so that
    greedy decoding is not a tie-break between near-uniform logits."""
    import transformers

    cfg = family_config(family, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, _spec(family)[1])(cfg).eval()
    with torch.no_grad():
        if cfg.tie_word_embeddings:  # scaling the shared matrix would scale the inputs too: scale the final norm
            norm = model.model.norm  # Gemma's RMSNorm scales by (1 + weight), the others by weight
            if "Gemma" in type(norm).__name__:
                norm.weight.copy_(8.0 * (1.0 + norm.weight) - 1.0)
            else:
                norm.weight.mul_(8.0)
        else:
            model.get_output_embeddings().weight.mul_(8.0)
    model.requires_grad_(False)
    model.generation_config.eos_token_id = cfg.eos_token_id
    return model, tiny_tokenizer()


def save_family(family: str, folder: Path, seed: int = 0, **overrides):
    """Save :func:`build_family`'s model and tokenizer to ``folder`` (a target folder a recipe can name);
    ``overrides`` change config fields as in :func:`build_family`. Returns ``(model, tokenizer)``."""
    model, tok = build_family(family, seed, **overrides)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for a module's tests (autouse where imported): the tiny models' ops are too small to
    gain from a second thread, and on a shared 2-core CI machine the threads of each op wait for each other (a
    trained cell took about 1.4x the wall time with 2 threads on a loaded machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer)
    # pad with unused tokens so the tokenizer holds exactly VOCAB entries, as the config's vocabulary
    missing = VOCAB - tok.get_vocab_size()
    tok.add_tokens([f"<unused{i}>" for i in range(missing)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok.to_str()


def tiny_tokenizer():
    """A byte-level BPE tokenizer of exactly :data:`VOCAB` tokens (pad 0, bos 1, eos ``<|im_end|>`` 2) with a
    ChatML chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json()), pad_token="<pad>",
                                  bos_token="<s>", eos_token="<|im_end|>")
    tok.chat_template = CHATML
    return tok


def family_prompts(n: int = 2, length: int = 6, seed: int = 0) -> list[list[int]]:
    """``n`` seeded random prompts of ``length`` ordinary token ids (no specials)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(len(SPECIALS), VOCAB, (length,), generator=g).tolist() for _ in range(n)]


def describe(family: str) -> str:
    """One line: the family's model type, class and the config fields that set it apart."""
    model_type, cls, overrides = _spec(family)
    return f"{family}: {cls} ({model_type}) {json.dumps(overrides, sort_keys=True)}"
