"""Independent draft LM (Leviathan et al. 2023; Chen et al. 2023): a small causal LM over the
target's vocabulary proposes K tokens autoregressively; the target verifies them in one pass.

Three ways to get one: ``init="scratch"`` (a small random Llama from :class:`DraftLMConfig`),
``DraftLM.from_target(target, num_layers)`` (``"truncated_target"``: the target's embeddings, first
N decoder layers, final norm and LM head, as in "layer-skip" style self-drafting baselines), and
``DraftLM.from_model(hf_model)`` (``"checkpoint"``: any transformers causal LM sharing the target's
tokenizer, e.g. SmolLM2-135M drafting for SmolLM2-1.7B).

Drafting itself is the decoder's :class:`decode.draft_model.DraftModel` (its own KV cache, catch-up
on committed tokens, chains and trees); this module adds what makes it a trainable drafter kind:
the config, truncation, the training ``forward`` and strict save / load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from drafterkit.decode.draft_model import DraftModel, check_vocab_match, lm_head_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.drafters.base import Drafter

__all__ = ["DraftLM", "DraftLMConfig", "check_vocab_match", "lm_head_rows"]


@dataclass
class DraftLMConfig:
    """A small Llama draft model. ``hf_config`` (a transformers config dict, any architecture) overrides
    the Llama fields when set (``from_target`` / ``from_model`` store the source's config there).
    ``init``: ``"scratch" | "truncated_target" | "checkpoint"`` (how the weights were first made)."""

    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 2
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    init: str = "scratch"
    hf_config: dict | None = None

    def __post_init__(self):
        if self.init not in ("scratch", "truncated_target", "checkpoint"):
            raise ValueError(f"DraftLMConfig.init must be 'scratch', 'truncated_target' or 'checkpoint', "
                             f"got {self.init!r}")
        if self.num_layers < 1:
            raise ValueError(f"DraftLMConfig.num_layers must be >= 1, got {self.num_layers}")

    def to_hf_config(self):
        """The transformers config the draft model is built from."""
        from transformers import AutoConfig, LlamaConfig

        if self.hf_config is not None:
            cfg = dict(self.hf_config)
            return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id)


def _hf_config_dict(model: nn.Module, **overrides: Any) -> dict:
    cfg = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version", "architectures", "dtype",
                "torch_dtype"):
        cfg.pop(key, None)
    cfg.update(overrides)
    return cfg


def _truncated_layers(hf: dict, total: int, n: int) -> dict:
    """A config dict's per-layer fields cut to the first ``n`` of ``total`` layers: every list (or pattern string)
    with one entry per layer (``layer_types``, Nemotron-H's ``layers_block_type`` / ``hybrid_override_pattern``,
    Falcon-H1's and Jamba's block lists) and a heterogeneous config's ``per_layer_config`` (Gemma-4)."""
    for key, value in list(hf.items()):
        per_layer = (isinstance(value, list) and key.endswith(("_types", "_type"))) or \
            (isinstance(value, str) and key.endswith("_pattern"))
        if per_layer and len(value) == total:
            hf[key] = value[:n]
    per_layer = hf.get("per_layer_config")
    if isinstance(per_layer, dict):
        hf["per_layer_config"] = {k: v for k, v in per_layer.items() if int(k) < n}
    return hf


def _first_layers(t: torch.Tensor, shape: torch.Size, total: int, n: int) -> torch.Tensor:
    """A target tensor stacked over its ``total`` layers (Gemma-4's per-layer input embeddings
    ``[V', total * h]`` and their projection ``[total * h, H]``) cut to the first ``n`` layers' part, the shape
    the truncated model holds; any other tensor as is (a mismatch the strict load then names)."""
    diff = [d for d in range(t.dim()) if t.shape[d] != shape[d]] if t.dim() == len(shape) else []
    if len(diff) == 1 and shape[diff[0]] * total == t.shape[diff[0]] * n:
        return t.narrow(diff[0], 0, shape[diff[0]])
    return t


def _llama_fields(model: nn.Module) -> dict:
    """The :class:`DraftLMConfig` Llama fields a transformers config has (for a readable config.json)."""
    c, out = model.config, {}
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                 "eos_token_id", "pad_token_id"):
        if getattr(c, name, None) is not None:
            out[name] = getattr(c, name)
    rope = getattr(c, "rope_parameters", None)  # transformers 5 keeps rope_theta there (per layer type: nested)
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = getattr(c, "rope_theta", None) if theta is None else theta
    if isinstance(theta, (int, float)):
        out["rope_theta"] = float(theta)
    return out


class DraftLM(Drafter):
    """A transformers causal LM used as an independent drafter.

    ``forward(input_ids [B, T], attention_mask [B, T] | None) -> logits [B, T, V]`` (plain causal LM,
    for training). ``propose`` / ``propose_tree`` draft through a :class:`decode.draft_model.DraftModel`
    over ``self.lm`` with this drafter's ``draft_threshold`` / ``expand_threshold``.
    """

    supports_draft_threshold = True

    kind = "draft_lm"
    config_class = DraftLMConfig

    def __init__(self, config: DraftLMConfig, target: nn.Module | None = None, model: nn.Module | None = None):
        super().__init__(config)
        self.lm = model if model is not None else AutoModelForCausalLM.from_config(config.to_hf_config())
        self._drafting: DraftModel | None = None

    # --- construction ------------------------------------------------------------------------------
    @classmethod
    def from_target(cls, target: nn.Module, num_layers: int) -> DraftLM:
        """Truncated target: embeddings, first ``num_layers`` decoder layers, final norm, LM head (copied).

        Raises:
            ValueError: ``num_layers`` not in ``[1, target layers]``.
        """
        total = target.config.num_hidden_layers
        if not 1 <= num_layers <= total:
            raise ValueError(f"num_layers must be in [1, {total}] for this target, got {num_layers}")
        hf = _truncated_layers(_hf_config_dict(target, num_hidden_layers=num_layers), total, num_layers)
        cfg = DraftLMConfig(**_llama_fields(target), num_layers=num_layers, init="truncated_target",
                            hf_config=hf, vocab_size=lm_head_rows(target))
        drafter = cls(cfg)
        built = getattr(getattr(drafter.lm, "model", None), "layers", None)
        if built is not None and len(built) != num_layers:
            raise ValueError(f"truncating this {hf.get('model_type')} target to {num_layers} layers built "
                             f"{len(built)}: its config lists its layers in a field drafterkit does not cut")
        src = target.state_dict()
        own = drafter.lm.state_dict()
        missing = [k for k in own if k not in src]
        if missing:
            raise ValueError(f"target has no tensors for {missing[:4]}; truncation needs a decoder-only LM")
        drafter.lm.load_state_dict({k: _first_layers(src[k], own[k].shape, total, num_layers).detach().clone()
                                    for k in own}, strict=True)
        param = next(target.parameters())
        return drafter.to(device=param.device, dtype=param.dtype).eval()

    @classmethod
    def from_model(cls, model: nn.Module) -> DraftLM:
        """Wrap any transformers causal LM (weights shared, not copied) as a drafter."""
        layers = getattr(model.config, "num_hidden_layers", None) or 1
        cfg = DraftLMConfig(**_llama_fields(model), num_layers=layers, init="checkpoint",
                            hf_config=_hf_config_dict(model), vocab_size=lm_head_rows(model))
        return cls(cfg, model=model)

    # --- training ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal-LM logits ``[B, T, V]`` for ``input_ids [B, T]``."""
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    # --- decoder protocol ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Rows of the draft LM head."""
        return lm_head_rows(self.lm)

    def _draft_model(self) -> DraftModel:
        """The decoder's draft-model proposer over ``self.lm`` (rebuilt when ``lm`` was replaced, e.g.
        wrapped by peft)."""
        if self._drafting is None or self._drafting.lm is not self.lm:
            self._drafting = DraftModel(self.lm, what=f"{self.kind} drafter")
        return self._drafting

    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        self._draft_model().check_compatible(target, vocab_size)

    def vocab_limit(self, target: nn.Module) -> int:
        """The vocabulary shared with ``target`` (see :func:`decode.draft_model.check_vocab_match`)."""
        return check_vocab_match(target, self.lm, what="draft model")

    def reset(self, batch_size: int) -> None:
        self._draft_model().reset(batch_size)

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """``k`` draft tokens per row (``[B, k]``) and, when sampling, their q (``[B, k, V]``); a row's chain
        ends early where the path probability falls below ``draft_threshold``."""
        return self._draft_model().propose(state, k, sampling, generator, draft_threshold=self.draft_threshold)

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """One token per node of ``tree`` per row (see :meth:`decode.draft_model.DraftModel.propose_tree`):
        ``Proposal(tokens [B, N], mask [B, N])``."""
        return self._draft_model().propose_tree(state, tree, sampling, generator,
                                                draft_threshold=self.draft_threshold,
                                                expand_threshold=self.expand_threshold)

    def propose_dynamic_tree(self, state: DecodeState, spec, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Per row, an EAGLE-2 dynamic tree from the draft LM (see
        :meth:`decode.draft_model.DraftModel.propose_dynamic_tree`)."""
        return self._draft_model().propose_dynamic_tree(state, spec, sampling, generator,
                                                        draft_threshold=self.draft_threshold,
                                                        expand_threshold=self.expand_threshold)
