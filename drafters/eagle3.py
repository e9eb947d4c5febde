"""EAGLE-3 head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test"), in the layout vLLM / SGLang / SpecForge load.

Features: the target's hidden states at three layers, ``feature_layers = (low, mid, high)`` as indices
into transformers' ``output_hidden_states`` tuple (default :func:`default_feature_layers`: vLLM's and SpecForge's
``(2, L//2, L-3)`` from 7 layers, three distinct increasing ids on smaller targets, ``(1, 2, 3)`` for 4 layers;
index ``i`` is the input of decoder layer ``i``, which is exactly vLLM's ``eagle_aux_hidden_state_layer_ids``
convention).
Head at position ``t``::

    g_t = fc([h_low; h_mid; h_high]_t)                              # 3H -> H, no bias
    a_t = Attn([input_layernorm(embed(token_{t+1})); hidden_norm(g_t)])   # 2H-wide q/k/v
    o_t = MLP-block(g_t + a_t)                                     # pre-norm residual stream [H]
    logits(token_{t+2}) = lm_head(norm(o_t))                       # over the DRAFT vocabulary [N]

Reduced draft vocabulary: the ``N`` most frequent target tokens of the training data, stored as
buffers ``d2t`` (LongTensor ``[N]``, draft id -> target id OFFSET: ``target_id = i + d2t[i]``) and
``t2d`` (BoolTensor ``[V]``, True where a target id is in the draft vocabulary), the vLLM/SGLang
convention; both are saved in the checkpoint (a full-vocabulary head, ``N = V``, loads with or without
them: its mapping is the identity). Embedding is borrowed frozen from the target.

Feature layer ids (one convention for training, decoding and export): id ``i`` is ``hidden_states[i]``
in transformers, the input of decoder layer ``i``, what vLLM's ``eagle_aux_hidden_state_layer_ids``
reads; valid ids are ``0 <= i < L`` (L = the target's ``num_hidden_layers``). ``i = L`` (the output after
the final norm) is refused by :class:`Eagle3Config`, so a checkpoint saved with it fails to load (retrain
it); the defaults are clamped into ``[1, L-1]`` for small targets (see :func:`check_feature_layers`).
SGLang names the same layer ``i - 1`` (it captures ``hidden_states[id+1]``); the ``sglang-eagle3`` export
writes its ids and refuses what an engine cannot express (``drafters.export.writers.engine_layer_ids``).

Training-time test (TTT, :meth:`drafters.heads.feature_head.FeatureHeadDrafter.unroll`): the head is unrolled for
``steps`` steps on its own outputs. At step ``j`` position ``t`` consumes a token and the head's own
step ``j-1`` output at ``t`` (step 0: token ``t+1`` and the fused target feature), sits at RoPE position
``t+j`` and predicts token ``t+2+j``. It attends the step-0 keys at positions ``<= t`` (the real prefix)
and the keys of steps ``1..j`` at the same ``t`` only (its own earlier drafts), see
:func:`ttt_attention_mask`. The token of step ``j >= 1`` is the data token ``t+1+j`` (``feed="data"``,
as EAGLE-3 / SpecForge train) or the head's own greedy draft of step ``j-1`` (``feed="draft"``); with
``draft`` the unroll is exactly what decoding runs after a real prefix ending at ``t``.

Decoding: as EAGLE (own KV cache per row, re-sync with ``num_stable``); draft ids map to target ids
through ``d2t``; when sampling, ``q`` is scattered from the draft vocabulary onto the TARGET
vocabulary (zeros elsewhere), so rejection sampling stays exact.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from numbers import Integral

import torch
from torch import nn

from drafterkit.drafters.eagle import EagleConfig
from drafterkit.drafters.heads.feature_head import FeatureHeadDrafter, target_shape_fields
from drafterkit.drafters.heads.layers import DraftDecoderLayer, RMSNorm
from drafterkit.drafters.target.layers import norm_scale, target_body


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """The default EAGLE-3 feature layer ids for a target of ``num_layers`` (L) decoder layers, increasing, each
    valid for :func:`check_feature_layers` (``0 <= i < L``):

    * L >= 7: ``(2, L//2, L-3)``, what EAGLE-3, SpecForge and vLLM 0.32 (``get_eagle3_default_aux_hidden_state_layers``)
      use when a config names no ids;
    * L of 4 to 6: ``(1, L//2, L-1)``, since ``(2, L//2, L-3)`` repeats an id there (an engine captures each layer
      once, so a repeated id would hand the head two features instead of three);
    * L = 3: ``(0, 1, 2)``, the only three distinct ids (0 is the embedding output, which vLLM reads, SGLang not);
    * L of 1 or 2: ``(L-1, L-1, L-1)``: three distinct ids do not exist, the head reads the last id three times
      (it trains and decodes in drafterkit; no serving engine can take it).
    """
    if num_layers >= 7:
        return 2, num_layers // 2, num_layers - 3
    if num_layers >= 4:
        return 1, num_layers // 2, num_layers - 1
    if num_layers == 3:
        return 0, 1, 2
    return (max(num_layers - 1, 0),) * 3


def default_feature_layers_rule(num_layers: int) -> str:
    """The rule :func:`default_feature_layers` applies to a ``num_layers``-layer target, with its ids, as a clause
    for error messages (true for every L: ``(2, L//2, L-3) = [2, 15, 27]`` is said only where it holds)."""
    ids = list(default_feature_layers(num_layers))
    if num_layers >= 7:
        return f"(2, L//2, L-3) = {ids}"
    if num_layers >= 4:
        return f"{ids} ((1, L//2, L-1): EAGLE-3's (2, L//2, L-3) would repeat an id at {num_layers} layers)"
    if num_layers == 3:
        return f"{ids} (the only three distinct ids of a 3-layer target)"
    return (f"{ids} (three distinct ids do not exist below 3 layers: the head reads id {ids[0]} three times; it "
            "trains and decodes here, but no serving engine can take it)")


def check_feature_layers(layers, num_layers: int) -> None:
    """Raise ``ValueError`` unless ``layers`` are 3 EAGLE-3 feature layer ids valid for a target of
    ``num_layers`` (L) decoder layers: ``0 <= i < L``.

    The convention (one for training, decoding and export): id ``i`` is ``hidden_states[i]`` in
    transformers, the input of decoder layer ``i`` (the residual stream before it), which is what vLLM's
    ``eagle_aux_hidden_state_layer_ids`` reads. ``i = L`` would be the last layer's output AFTER the final
    norm, which no serving engine can hand the head, so it is refused. The message names the valid range and
    this target's default (:func:`default_feature_layers_rule`).
    """
    layers = [int(i) for i in layers]
    if len(layers) == 3 and all(0 <= i < num_layers for i in layers):
        return
    why = (f"; id {num_layers} is the last layer's output after the final norm, which serving engines cannot read"
           if num_layers in layers else "")
    span = "ids, all 0" if num_layers == 1 else f"ids in [0, {num_layers - 1}]"
    raise ValueError(f"EAGLE-3 feature layers {layers} invalid for a {num_layers}-layer target: give 3 {span} "
                     f"(id i = hidden_states[i] in transformers = the input of decoder layer i "
                     f"= vLLM's eagle_aux_hidden_state_layer_ids){why}; the default for this target is "
                     f"{default_feature_layers_rule(num_layers)}. A checkpoint saved with such ids was trained on "
                     "features no engine provides: retrain it")


@dataclass
class Eagle3Config(EagleConfig):
    """EAGLE-3 head: the EAGLE-1 shape fields (the target's sizes, see :class:`drafters.eagle.EagleConfig`)
    plus ``draft_vocab_size`` (``N``), ``feature_layers`` and ``ttt_steps`` (the training unroll
    length, not used at decode)."""

    draft_vocab_size: int = 8192
    feature_layers: list[int] = field(default_factory=list)
    ttt_steps: int = 3
    num_layers: int = 1  # decoder layers of the head (a checkpoint saved without the field has one)

    def __post_init__(self):
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, Integral) or self.num_layers < 1:
            raise ValueError(f"num_layers (the head's decoder layers) must be an integer >= 1, got {self.num_layers!r}")
        self.num_layers = int(self.num_layers)
        if not self.feature_layers:
            self.feature_layers = list(default_feature_layers(self.target_num_layers))
        given = self.feature_layers  # integers only: int() would read 2.7 as layer 2, and "2,15,27" char by char
        if not isinstance(given, (list, tuple)) or not all(isinstance(i, Integral) and not isinstance(i, bool)
                                                           for i in given):
            raise ValueError(f"feature_layers must be a list of integer layer ids such as [2, 15, 27], got {given!r}")
        self.feature_layers = [int(i) for i in given]
        check_feature_layers(self.feature_layers, self.target_num_layers)
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={self.vocab_size}], got "
                             f"{self.draft_vocab_size}")

    @classmethod
    def from_target(cls, target: nn.Module, **kw) -> Eagle3Config:
        base = {**target_shape_fields(target), **kw}
        base["draft_vocab_size"] = min(base.get("draft_vocab_size", 8192), base["vocab_size"])
        return cls(**base)


def select_draft_vocab(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` most frequent target ids (ties -> lower id), SORTED ascending. ``counts [V] -> [n]``."""
    if counts.dim() != 1 or n > counts.numel():
        raise ValueError(f"counts must be [V] with V >= n; got {tuple(counts.shape)} and n={n}")
    order = torch.argsort(-counts.long(), stable=True)  # stable: equal counts keep the lower id first
    return order[:n].sort().values


def mapping_from_ids(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted unique target ids ``[N]`` -> ``(d2t [N] offsets, t2d [V] bool)``. Raises ``ValueError``."""
    ids = ids.long().flatten()
    if ids.device.type != "meta" and (  # a skeleton on the meta device has no values to check
            ids.numel() == 0 or ids.unique().numel() != ids.numel() or ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"draft vocabulary ids must be unique target ids in [0, {vocab_size}); got "
                         f"{ids.numel()} ids, range [{int(ids.min()) if ids.numel() else '-'}, "
                         f"{int(ids.max()) if ids.numel() else '-'}]")
    ids = ids.sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


def copy_final_norm(drafter: nn.Module, target: nn.Module | None) -> None:
    """Start ``drafter.norm`` from the target's final norm (its LM head reads normed states of that scale),
    by its effective scale (``drafters.target.layers.norm_scale``: Gemma's ``1 + weight``); a no-op without
    ``target`` or where the shapes differ."""
    scale = norm_scale(target_body(target)[2]) if target is not None else None  # the family's final norm
    if scale is not None and scale.shape == drafter.norm.weight.shape:
        with torch.no_grad():
            drafter.norm.weight.copy_(scale)


def adopt_draft_vocab(drafter: nn.Module, ids: torch.Tensor, target: nn.Module | None) -> None:
    """Set a reduced-vocabulary drafter's ``d2t`` / ``t2d`` from the sorted target ids ``ids [N]``; with
    ``target``, start its ``lm_head`` rows from the target's LM head rows of those ids and its ``norm`` from the
    target's (EAGLE-3 and DFlash heads share this layout)."""
    d2t, t2d = mapping_from_ids(ids, drafter.config.vocab_size)
    drafter.d2t.copy_(d2t)
    drafter.t2d.copy_(t2d)
    if target is not None:
        with torch.no_grad():
            drafter.lm_head.weight.copy_(target.get_output_embeddings().weight[drafter.draft_ids().cpu()])
        copy_final_norm(drafter, target)


class Eagle3Drafter(FeatureHeadDrafter):
    """EAGLE-3 head: fc(3H->H), ``num_layers`` decoder layers (the first 2H-input, the rest plain Llama
    layers), norm, LM head over the draft vocabulary.

    The layer stack follows vLLM's multi-layer EAGLE-3 (``model_executor/models/llama_eagle3.py``): layer 0
    (``layer``, exported as ``midlayer`` / ``layers.0``) reads ``[input_layernorm(embed); hidden_norm(fc(f))]``
    with residual ``fc(f)``; layer ``i >= 1`` (``layers[str(i)]``, exported as ``layers.{i}``) is a Llama layer
    on the residual stream (``input_layernorm``, ``H`` wide, no embeddings); the head's output is the stream
    after the last layer (vLLM's ``hidden + residual``, the pre-norm sum it returns as the aux hidden state and
    feeds back as the next step's hidden input), and the logits read ``lm_head(norm(output))``. Each layer has
    its own KV cache when decoding.
    """

    kind = "eagle3"
    config_class = Eagle3Config
    borrowed_prefixes = ("embed.",)

    def __init__(self, config: Eagle3Config, target: nn.Module | None = None):
        super().__init__(config)
        if target is None:
            raise ValueError("eagle3 drafter borrows the target's embedding: pass target=... "
                             "(from_pretrained(path, target=target))")
        c = config
        self.embed = target.get_input_embeddings()
        rows = target.get_output_embeddings().weight.shape[0]
        if rows != c.vocab_size or self.embed.weight.shape[1] != c.hidden_size:
            raise ValueError(f"eagle3 config expects vocab {c.vocab_size} x hidden {c.hidden_size}, the target has "
                             f"LM head rows {rows}, hidden {self.embed.weight.shape[1]}; "
                             "train the head for this target")
        self.fc = nn.Linear(3 * c.hidden_size, c.hidden_size, bias=False)
        shape = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
                 c.rms_norm_eps, c.rope_theta)
        self.layer = DraftDecoderLayer(*shape, eagle3=True)
        # layers 1..num_layers-1 under their vLLM index (checkpoint names layers.{i}.*; a one-layer head has none,
        # so its checkpoint is the one-layer format)
        self.layers = nn.ModuleDict({str(i): DraftDecoderLayer(*shape, llama=True) for i in range(1, c.num_layers)})
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        d2t, t2d = mapping_from_ids(torch.arange(c.draft_vocab_size), c.vocab_size)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.feature_layers = tuple(c.feature_layers)

    # --- vocabulary ----------------------------------------------------------------------------------
    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft id, ``[N]`` (``arange(N) + d2t``)."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_draft_vocab(self, ids: torch.Tensor, target: nn.Module | None = None) -> None:
        """Use target ids ``ids [N]`` as the draft vocabulary (sorted). With ``target``, initialise the
        LM head rows and the final norm from the target's head / norm (a good start for training)."""
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"need exactly draft_vocab_size={self.config.draft_vocab_size} ids, got {ids.numel()}")
        adopt_draft_vocab(self, ids, target)

    def own_shapes(self, held: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
        """As :meth:`drafters.base.Drafter.own_shapes`, except that a full-vocabulary head
        (``draft_vocab_size == vocab_size``) may come without ``d2t`` / ``t2d`` (``held`` has neither): its
        mapping is the identity the head is built with, and vLLM loads such a head only without them (its
        EAGLE-3 model has ``draft_id_to_target_id`` only when ``draft_vocab_size < vocab_size``). A reduced
        vocabulary needs both."""
        shapes = super().own_shapes()
        c = self.config
        if c.draft_vocab_size == c.vocab_size and not {"d2t", "t2d"} & set(held):
            del shapes["d2t"], shapes["t2d"]
        return shapes

    # --- FeatureHeadDrafter hooks ----------------------------------------------------------------------
    def draft_layers(self) -> list[DraftDecoderLayer]:
        """The decoder layers in order: ``[layer, layers["1"], ..., layers[str(num_layers - 1)]]``."""
        return [self.layer, *self.layers.values()]

    def real_input(self, feats: torch.Tensor) -> torch.Tensor:
        return self.fc(feats)

    def logits_and_ids(self, out: torch.Tensor):
        return self.lm_head(self.norm(out)), self.draft_ids()

    def draft_id_map(self) -> torch.Tensor:
        return self.draft_ids()

    def target_vocab_size(self) -> int:
        return self.config.vocab_size

    # --- training ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, steps: int | None = None,
                return_hidden: bool = False, feed: str = "data",
                keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """TTT unroll. ``input_ids [B, T]``, ``features [B, T, 3H]`` (concat over ``feature_layers``);
        ``steps`` (default ``config.ttt_steps``), ``feed`` and ``keep``: see
        :meth:`drafters.heads.feature_head.FeatureHeadDrafter.unroll` (``feed="draft"``: step ``j >= 1`` reads the
        head's own greedy draft of step ``j-1``, mapped to a target id through ``d2t``, as decoding does).

        Returns ``steps`` draft-vocabulary logits ``[B, T, N]``: ``out[j][:, t]`` predicts token
        ``t + 2 + j`` (entries whose token ``t+1+j`` is past the sequence are garbage; mask them).
        With ``return_hidden`` the pre-norm outputs ``[B, T, H]`` instead, so a caller can apply the LM
        head to supervised rows only.
        """
        hidden = self.unroll(input_ids, features, steps or self.config.ttt_steps, feed=feed, keep=keep)
        return hidden if return_hidden else [self.draft_logits(h) for h in hidden]

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Head output (pre-norm) ``[..., H]`` -> draft-vocabulary logits ``[..., N]``."""
        return self.lm_head(self.norm(hidden))


def card_line(cfg: dict, export_config: dict | None) -> str:
    """The model card's line on an EAGLE-3 drafter whose ``config.json`` config is ``cfg`` (its export's
    config: ``export_config``; ``drafters.kinds.Kind.card_line``)."""
    ids = (export_config or {}).get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    held = f"`eagle_aux_hidden_state_layer_ids` {ids}" if ids is not None else \
        "no `eagle_aux_hidden_state_layer_ids` (SGLang's default capture is these layers)"
    n = int(cfg.get("num_layers", 1))
    layers = "one decoder layer" if n == 1 else f"{n} decoder layers"
    return (f"EAGLE-3: {layers} over 3 target layers (drafterkit ids {cfg.get('feature_layers')}: "
            f"`hidden_states[i]`, the input of decoder layer i; this export holds {held}), draft vocabulary "
            f"{cfg.get('draft_vocab_size')} of {cfg.get('vocab_size')} target tokens")
