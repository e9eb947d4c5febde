"""Drafter kinds as a recipe sees them: each kind's ``drafter.options`` schema, whether it reads target
features, and the checks of a whole recipe the kind cannot train. Read by the recipe validator
(``train.recipe``) before any model loads; the training strategies (``train.strategies``) import their
options from here.

Adding a trainable kind: its entry in ``drafters.kinds.KINDS`` (``trainable=True``), its options model and
one line in :data:`KINDS` here, its strategy class in ``train/strategies/<kind>.py``
(``tests/test_train_recipe.py`` checks that this table and the drafters' registry list the same kinds, and
that every strategy named here exists and uses the options model named here). A kind defined outside the
package adds its line with ``train.strategies.register_kind`` (``tests/test_kind_registry.py``).

Recipe checks (``KindRecipe.check``) take the validated :class:`train.recipe.Recipe` and raise
``ValueError`` whose message starts with the recipe key (``loss.name: ...``) and names the kind and the fix:

* the head kinds (Medusa, EAGLE, EAGLE-3) refuse on-policy data (a head trains on fixed data with the
  target's own features; DistillSpec-style on-policy batches are a draft-LM thing), and ``accept_len``
  over ``loss.draft_steps > 1`` when their chain is one step long (it would be plain alpha);
* EAGLE-3 also refuses ``accept_len`` with ``ttt_tokens: data`` and explicit ``feature_layers`` that do
  not fit the target, when the target's config is readable from local files;
* DFlash refuses on-policy data, ``accept_len`` over ``draft_steps > 1`` with ``block_size: 2`` (one draft
  token per block) and explicit ``feature_layers`` outside ``[1, L-1]`` (what vLLM can capture).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from drafterkit.assets.records import did_you_mean
from drafterkit.speceval.eval_args import MAX_DRAFT_TOKENS
from drafterkit.train.local_target import check_local_feature_layers, local_config, meta_target, vocab_size


def _drafters(module: str, name: str) -> Callable:
    """``drafterkit.drafters.<module>.<name>``, imported on first use: the checks against the target's layers need
    the drafter modules (and torch), while the schema (unknown keys, wrong types, bad values) is checked without
    them, so ``drafterkit train`` refuses a malformed recipe before any model library loads."""
    return getattr(importlib.import_module(f"drafterkit.drafters.{module}"), name)


# --- options, one model per kind ----------------------------------------------------------------


class LoraOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class DraftLMOptions(BaseModel):
    """``drafter.options`` for ``kind: draft_lm``."""

    model_config = ConfigDict(extra="forbid")
    init: Literal["truncated", "scratch", "checkpoint"] = "truncated"
    num_layers: int = Field(4, ge=1)
    checkpoint: str | None = None  # init == checkpoint: drafterkit draft_lm folder or transformers folder
    scratch_config: dict[str, Any] = Field(default_factory=dict)  # DraftLMConfig fields for init == scratch
    freeze_embeddings: bool = False  # keep input embeddings and LM head fixed
    lora: LoraOptions | None = None


class MedusaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_heads: int = Field(5, ge=1, le=16)
    num_layers: int = Field(1, ge=1, le=4)  # residual blocks per head
    share_lm_head: bool = True  # False: own LM head per head (K x V x H parameters)
    head_weight_decay: float = Field(0.8, gt=0.0, le=1.0)  # loss weight of head k = decay ** k
    train_vocab_size: int | None = Field(None, ge=2)  # token losses over the N most frequent data tokens


class EagleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    feature_weight: float = Field(1.0, ge=0.0)
    token_weight: float = Field(0.1, ge=0.0)
    input_noise: float = Field(0.0, ge=0.0)  # uniform noise amplitude on input features
    init_from_target_layer: bool = True  # copy the target's last decoder layer into the head
    train_vocab_size: int | None = Field(None, ge=2)
    # steps of the unroll on the head's own features and draft tokens (1: EAGLE-1's single step)
    ttt_steps: int = Field(1, ge=1, le=16)
    step_weight_decay: float = Field(0.8, gt=0.0, le=1.0)  # loss weight of unroll step j = decay ** j
    num_layers: int = 1  # EAGLE-1 is one decoder layer: only 1 is taken (kind eagle3 / peagle stack layers)

    @field_validator("num_layers")
    @classmethod
    def _one_layer(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"kind eagle is EAGLE-1's one-layer head, got num_layers {v}: drop the option, or use "
                             "kind eagle3 (or peagle), whose drafter.options.num_layers stacks decoder layers")
        return v


class Eagle3Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # the N most frequent supervised tokens; null: 8192, or the whole vocabulary of a smaller target (refused when
    # set above the target's vocabulary)
    draft_vocab_size: int | None = Field(None, ge=2)
    # hidden_states indices, 0 <= i < L (the input of decoder layer i, vLLM's eagle_aux_hidden_state_layer_ids);
    # None: drafters.eagle3.default_feature_layers ((2, L//2, L-3) from 7 layers, distinct ids down to 3 layers)
    feature_layers: list[int] | None = None
    ttt_steps: int = Field(3, ge=1, le=16)
    # decoder layers of the head: the first reads [embedding; fc(features)], the rest are Llama layers on its
    # residual stream (vLLM's multi-layer EAGLE-3); 1 is EAGLE-3's head
    num_layers: int = Field(1, ge=1, le=8)
    # token of TTT steps j >= 1: the data token ("data", EAGLE-3's training) or the head's own greedy draft
    # ("draft", what decoding feeds; needed by the accept_len loss)
    ttt_tokens: Literal["data", "draft"] = "data"
    step_weight_decay: float = Field(0.8, gt=0.0, le=1.0)
    init_from_target_layer: bool = True
    # fc (3H -> H) at start: "last_feature" passes the last feature layer through unchanged, so the
    # target-initialised decoder layer starts on a state from the target's own residual stream; "random"
    # is nn.Linear's default (as SpecForge)
    init_fc: Literal["random", "last_feature"] = "last_feature"
    # q/k/v (2H -> ...) at start: "target": both halves (embedding | hidden) from the target's last layer,
    # as if the layer saw their sum (only with init_from_target_layer); "random": nn.Linear's default.
    # Both target-derived inits together: MT-bench first-position top-1 0.306 -> 0.333 at equal steps
    # (benchmarks/head_probe.py, BENCHMARKS.md, "What the head learns per CPU-minute")
    init_attention: Literal["random", "target"] = "target"

    @field_validator("feature_layers")
    @classmethod
    def _three_ids(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 3 or min(v) < 0):
            raise ValueError("give 3 hidden_states ids 0 <= i < L for a target of L decoder layers (low, mid, high), "
                             "or null for the default: (2, L//2, L-3) from 7 layers, (1, L//2, L-1) for 4 to 6, "
                             f"(0, 1, 2) for 3, the last id three times below 3 layers; got {v}")
        return v


# P-EAGLE's default layer count: 2 and 4 layers left positions 2..5 at the data's marginal after 300 steps, as one
# layer does (docs/benchmarks/peagle.md, "Decoder layers"), so the cheapest stays
PEAGLE_NUM_LAYERS = 1


class PEagleOptions(BaseModel):
    """``drafter.options`` for ``kind: peagle`` (``drafters.peagle``; P-EAGLE, arXiv 2602.01469): EAGLE-3's head
    options plus the parallel positions and their training-time sampling."""

    model_config = ConfigDict(extra="forbid")
    # the N most frequent supervised tokens; null: 8192, or the whole vocabulary of a smaller target (refused when
    # set above the target's vocabulary)
    draft_vocab_size: int | None = Field(None, ge=2)
    feature_layers: list[int] | None = None  # as eagle3: hidden_states ids 0 <= i < L; None: its default
    num_depths: int = Field(5, ge=1, le=16)  # K: chain positions trained (depth 0 + K-1 masked positions)
    # decoder layers of the head, as eagle3's; with one, a masked position's query cannot read the context
    # (docs/benchmarks/peagle.md measures the layer counts)
    num_layers: int = Field(PEAGLE_NUM_LAYERS, ge=1, le=8)
    mask_token_id: int = Field(0, ge=0)  # the target embedding row fed at masked positions (vLLM's pard_token)
    # conditional drop-token (COD) sampling: depth d >= 1 keeps a random max(ratio^d, ratio_min) of the chains
    # (nested: a chain kept at depth d is kept at d-1); 1.0 keeps every chain at every depth
    down_sample_ratio: float = Field(0.7, gt=0.0, le=1.0)
    down_sample_ratio_min: float = Field(0.2, gt=0.0, le=1.0)
    step_weight_decay: float = Field(0.8, gt=0.0, le=1.0)  # loss weight of depth d = decay ** d
    init_from_target_layer: bool = True
    init_fc: Literal["random", "last_feature"] = "last_feature"
    init_attention: Literal["random", "target"] = "target"

    @field_validator("feature_layers")
    @classmethod
    def _three_ids(cls, v: list[int] | None) -> list[int] | None:
        return Eagle3Options._three_ids(v)


class DFlashOptions(BaseModel):
    """``drafter.options`` for ``kind: dflash`` (``drafters.dflash``; DFlash, arXiv 2602.06036)."""

    model_config = ConfigDict(extra="forbid")
    block_size: int = Field(8, ge=2, le=MAX_DRAFT_TOKENS)  # B: one pass drafts B-1 tokens (its masked positions)
    num_layers: int = Field(1, ge=1, le=8)  # draft decoder layers (each reads the context as keys/values)
    # hidden_states ids 1 <= i <= L-1, increasing (vLLM's target_layer_ids = i - 1); None: 3 spread over [2, L-2]
    feature_layers: list[int] | None = None
    # reduced draft vocabulary (own LM head, d2t/t2d as EAGLE-3) of the N most frequent supervised tokens;
    # null or >= the target's vocabulary: the target's frozen LM head (nothing of it is saved)
    draft_vocab_size: int | None = Field(None, ge=2)
    mask_token_id: int = Field(0, ge=0)  # the target embedding row fed at the block's masked positions
    num_anchors: int = Field(8, ge=1)  # blocks per training sequence (anchors drawn among supervised positions)
    # loss weight of block position k (1-based) = exp(-(k - 1) / gamma) (DFlash: gamma 7 / 5 / 4 for B 16 / 10 / 8)
    position_weight_gamma: float = Field(4.0, gt=0.0)
    # start the draft layers from the target's last num_layers decoder layers (q/k norms from ones)
    init_from_target_layer: bool = True
    # fc (nF*H -> H) at start: "last_feature" passes the last feature layer through; "random": nn.Linear's
    init_fc: Literal["random", "last_feature"] = "last_feature"

    @field_validator("feature_layers")
    @classmethod
    def _increasing(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or v != sorted(set(v)) or min(v) < 1):
            raise ValueError("give distinct increasing hidden_states ids 1 <= i <= L-1, or null for 3 spread over "
                             f"[2, L-2]; got {v}")
        return v


class DSparkOptions(DFlashOptions):
    """``drafter.options`` for ``kind: dspark`` (``drafters.dspark``; DSpark, arXiv 2607.05147): DFlash's, with
    ``block_size`` the draft tokens of one pass (the bonus token drafts the first), plus its two heads."""

    block_size: int = Field(7, ge=2, le=MAX_DRAFT_TOKENS)  # S: one pass drafts S tokens (DSpark's paper: 7)
    markov_rank: int = Field(64, ge=1, le=4096)  # r of the Markov head (V x r, r x N)
    confidence_head: bool = True  # train (and export) the confidence head
    confidence_with_markov: bool = True  # the confidence head also reads the Markov embedding of the previous token
    confidence_weight: float = Field(0.1, ge=0.0)  # weight of its binary cross-entropy in the loss
    # false: the chain terms read the block's own logits, so the Markov head's zero-initialised output matrix
    # stays zero and adds nothing when decoding (the ablation of a backbone trained without it)
    train_markov_head: bool = True


# --- recipe checks -------------------------------------------------------------------------------


def loss_key(recipe: Any, name: str) -> str:
    """The recipe key that asks for loss term ``name``: ``loss.weights.<name>`` or ``loss.name``."""
    return f"loss.weights.{name}" if recipe.loss.weights else "loss.name"


def check_head_recipe(recipe: Any, kind: str, chain_option: str) -> None:
    """What a feature-head kind cannot train: on-policy data; ``accept_len`` over ``loss.draft_steps > 1``
    when the drafter option ``chain_option`` (the chain's length) is 1.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    if recipe.data.on_policy_fraction > 0:
        raise ValueError(f"data.on_policy_fraction: drafter kind {kind!r} trains on the target's own "
                         "features of fixed data; on-policy (DistillSpec) batches exist for kind 'draft_lm' "
                         "only; set data.on_policy_fraction: 0")
    steps = recipe.loss.draft_steps
    one_step = getattr(recipe.drafter.parsed_options(), chain_option) == 1
    if "accept_len" in recipe.loss.terms() and one_step and steps > 1:
        raise ValueError(f"{loss_key(recipe, 'accept_len')}: the accept_len term cannot apply to drafter kind "
                         f"{kind!r} with drafter.options.{chain_option}: 1 (chains of one draft token: accept_len "
                         f"over loss.draft_steps: {steps} would be plain alpha); set drafter.options.{chain_option}: "
                         f"{steps} (the chain the loss needs), or loss.draft_steps: 1, or another loss")


def check_medusa_recipe(recipe: Any) -> None:
    """As :func:`check_head_recipe` (the chain is ``num_heads`` long), plus :func:`check_init_from_target`.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    check_head_recipe(recipe, "medusa", "num_heads")
    check_init_from_target(recipe)


def check_eagle_recipe(recipe: Any) -> None:
    """As :func:`check_head_recipe` (the chain is ``ttt_steps`` long), plus :func:`check_init_from_target`.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    check_head_recipe(recipe, "eagle", "ttt_steps")
    check_init_from_target(recipe)


def check_eagle3_recipe(recipe: Any) -> None:
    """As :func:`check_head_recipe`, plus: ``accept_len`` needs ``ttt_tokens: draft``; explicit
    ``feature_layers`` must be valid ids for the target when its config is readable locally.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    check_head_recipe(recipe, "eagle3", "ttt_steps")
    o: Eagle3Options = recipe.drafter.parsed_options()
    if "accept_len" in recipe.loss.terms() and o.ttt_tokens == "data":
        raise ValueError(f"{loss_key(recipe, 'accept_len')}: the accept_len term cannot apply to drafter kind "
                         "'eagle3' with drafter.options.ttt_tokens: data (its TTT steps read the data's tokens, so "
                         "the chain is not the one it drafts); set drafter.options.ttt_tokens: draft (the unroll "
                         "on its own drafts, what decoding runs) or use another loss")
    check_local_feature_layers(recipe, o.feature_layers, _drafters("eagle3", "check_feature_layers"),
                               _drafters("export.eagle3_layout", "repeated_layers_warning"))
    _check_local_draft_vocab(recipe, o)
    check_init_from_target(recipe)


def check_peagle_recipe(recipe: Any) -> None:
    """As :func:`check_head_recipe` (the chain is its ``num_depths`` parallel positions), plus explicit
    ``feature_layers`` valid for the target when its config is readable locally.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    check_head_recipe(recipe, "peagle", "num_depths")
    check_local_feature_layers(recipe, recipe.drafter.parsed_options().feature_layers,
                               _drafters("eagle3", "check_feature_layers"),
                               _drafters("export.eagle3_layout", "repeated_layers_warning"))
    _check_local_draft_vocab(recipe, recipe.drafter.parsed_options())
    check_init_from_target(recipe)


def check_dflash_recipe(recipe: Any) -> None:
    """As :func:`check_head_recipe` (the chain is the block's ``block_size - 1`` positions), plus: explicit
    ``feature_layers`` must fit the target when its config is readable locally.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    if recipe.data.on_policy_fraction > 0:
        check_head_recipe(recipe, "dflash", "block_size")
    o: DFlashOptions = recipe.drafter.parsed_options()
    steps = recipe.loss.draft_steps
    if "accept_len" in recipe.loss.terms() and o.block_size == 2 and steps > 1:
        raise ValueError(f"{loss_key(recipe, 'accept_len')}: the accept_len term cannot apply to drafter kind "
                         "'dflash' with drafter.options.block_size: 2 (one draft token per block: accept_len over "
                         f"loss.draft_steps: {steps} would be plain alpha); set drafter.options.block_size: "
                         f"{steps + 1}, "
                         "or loss.draft_steps: 1, or another loss")
    check_local_feature_layers(recipe, o.feature_layers, _drafters("dflash", "check_dflash_feature_layers"))
    _check_local_draft_vocab(recipe, o)
    check_init_from_target(recipe)


def check_dspark_recipe(recipe: Any) -> None:
    """As :func:`check_dflash_recipe` (DSpark's block is DFlash's backbone), naming ``dspark``; plus: a
    ``confidence_weight`` above 0 needs ``confidence_head: true``.

    Raises:
        ValueError: naming the key, the kind and the fix.
    """
    if recipe.data.on_policy_fraction > 0:
        check_head_recipe(recipe, "dspark", "block_size")
    o: DSparkOptions = recipe.drafter.parsed_options()
    if o.confidence_weight > 0 and not o.confidence_head:
        raise ValueError("drafter.options.confidence_weight: drafter kind 'dspark' with confidence_head: false has no "
                         "confidence head to train; set confidence_weight: 0, or confidence_head: true")
    check = _drafters("dflash", "check_dflash_feature_layers")
    check_local_feature_layers(recipe, o.feature_layers, lambda layers, n: check(layers, n, "dspark"))
    _check_local_draft_vocab(recipe, o)
    check_init_from_target(recipe)


def draft_vocab_refusal(options: Any, vocab_size: int | None) -> str | None:
    """Why an EAGLE-3 / P-EAGLE / DFlash / DSpark ``draft_vocab_size`` the recipe sets cannot fit a target of
    ``vocab_size`` tokens (one line naming the option, the target's vocabulary and the fix), or None. Unset (null),
    EAGLE-3's and P-EAGLE's is 8192 fitted to a smaller target's vocabulary (:func:`draft_vocab_for`), DFlash's and
    DSpark's the whole vocabulary; a set one is never changed, so the saved recipe says what was trained."""
    n = options.draft_vocab_size
    if vocab_size is None or n is None or n <= vocab_size:
        return None
    return (f"drafter.options.draft_vocab_size: {options.draft_vocab_size} exceeds the target's vocabulary "
            f"({vocab_size} tokens, its config's vocab_size); set drafter.options.draft_vocab_size to at most "
            f"{vocab_size} ({vocab_size}: the whole vocabulary)")


def draft_vocab_for(options: Any, vocab_size: int) -> int:
    """The EAGLE-3 / P-EAGLE draft vocabulary size: ``drafter.options.draft_vocab_size``, or when unset 8192
    (EAGLE-3's usual reduced vocabulary) capped at the target's ``vocab_size``."""
    return options.draft_vocab_size if options.draft_vocab_size is not None else min(8192, vocab_size)


def _check_local_draft_vocab(recipe: Any, options: Any) -> None:
    """:func:`draft_vocab_refusal` against the target's config when local files alone give it."""
    if why := draft_vocab_refusal(options, vocab_size(local_config(recipe.target.name_or_path))):
        raise ValueError(why)


def draft_lm_vocab_refusal(folder: Any, draft_vocab: int | None, target_vocab: int | None) -> str | None:
    """Why the draft LM in ``folder`` (``drafter.options.checkpoint``), of ``draft_vocab`` tokens, cannot train
    against a target of ``target_vocab`` tokens (one line naming both sizes and the fix), or None (equal, or a
    size unknown). Training compares the drafter's next-token distribution with the target's over the whole
    vocabulary (``train/losses.py``), so the sizes must be equal: decoding's allowance for LM-head padding rows
    (``decode.draft_model.check_vocab_match``) does not apply."""
    if draft_vocab is None or target_vocab is None or draft_vocab == target_vocab:
        return None
    return (f"drafter.options.checkpoint: {folder} has a vocabulary of {draft_vocab} tokens but the target has "
            f"{target_vocab}: a draft LM trains on the target's distribution over its whole vocabulary, so the two "
            "must be equal; start from a checkpoint with the target's tokenizer and vocab_size, or set "
            "drafter.options.init=truncated (the target's first layers) or init=scratch")


def check_draft_lm_recipe(recipe: Any) -> None:
    """:func:`check_init_from_target`, plus: with ``init: checkpoint``, the checkpoint's vocabulary must be the
    target's (:func:`draft_lm_vocab_refusal`), read from both config.json files when local files give them (the
    build checks the loaded models otherwise, and names what is wrong with a folder that does not resolve).

    Raises:
        ValueError: one line naming both vocabulary sizes and the fix.
    """
    check_init_from_target(recipe)
    if recipe.loss.position_weights == "dpace":
        raise ValueError("loss.position_weights: dpace weighs a chained drafter's positions (heads, TTT steps, "
                         "block positions) and kind 'draft_lm' trains every position as its own next-token "
                         "prediction; set loss.position_weights: fixed (train a draft_lm on its own chains with "
                         "the accept_len term)")
    o: DraftLMOptions = recipe.drafter.parsed_options()
    if o.init != "checkpoint" or not o.checkpoint:
        return
    drafters = importlib.import_module("drafterkit.drafters")  # torch: only a recipe starting from a checkpoint
    try:
        folder, kind = drafters.resolve_checkpoint(o.checkpoint, allow_transformers=True)
    except drafters.DrafterLoadError:
        return
    draft_vocab = None
    if kind == "draft_lm":  # drafterkit's config.json: {"kind": "draft_lm", "config": {"vocab_size": ...}}
        draft_vocab = (drafters.read_config_dict(folder) or {}).get("config", {}).get("vocab_size")
    elif kind == drafters.TRANSFORMERS_KIND:
        draft_vocab = vocab_size(local_config(str(folder)))
    if why := draft_lm_vocab_refusal(folder, draft_vocab, vocab_size(local_config(recipe.target.name_or_path))):
        raise ValueError(why)


def check_init_from_target(recipe: Any) -> None:
    """A feature kind needs a target whose hidden states it can read (``drafters.target.layers.feature_refusal``;
    with ``init_from_target_layer`` and no target layer that maps, its layers start fresh, which training says in
    one line: never a refusal); a ``draft_lm``
    with ``init: truncated`` needs a decoder-only target whose first ``num_layers`` layers form a model of the
    same family. Checked on the target built on
    the meta device from its local config; skipped when the config is not readable locally (the build
    raises the same line).

    Raises:
        ValueError: one line naming the family and the option to change.
    """
    o, kind = recipe.drafter.parsed_options(), recipe.drafter.kind
    truncated = kind == "draft_lm" and o.init == "truncated"
    if kind == "draft_lm" and not truncated:
        return
    target = meta_target(recipe.target.name_or_path)
    if target is None:
        return
    why = None if kind == "draft_lm" else _drafters("target.layers", "feature_refusal")(target, kind)
    if why:
        raise ValueError(why)
    if truncated and (why := truncation_refusal(target, o.num_layers)):
        raise ValueError(why)


def truncation_refusal(target: Any, num_layers: int) -> str | None:
    """Why the draft LM cannot be the target's first ``num_layers`` layers (one line naming the family and the
    option), or None: ``num_layers`` must be below the target's layer count (as many would make the draft a full
    copy of the target, accepting every token at the target's own cost), and on a hybrid target reach its first
    attention layer (``drafters.target.layers.recurrent_truncation_refusal``). ``target`` may live on the meta
    device."""
    family = getattr(target.config, "model_type", type(target).__name__)
    total = getattr(target.config, "num_hidden_layers", None)
    if total is None or _drafters("target.layers", "decoder_layers")(target) is None:
        return (f"drafter.options.init: truncating the target is not defined for model type {family!r} (no "
                "num_hidden_layers / model.layers); set drafter.options.init=scratch or init=checkpoint")
    if not 1 <= num_layers < total:  # all of them: the "draft" would be the target itself (tau = K + 1, loss 0)
        fix = (f"set drafter.options.num_layers to at most {total - 1}" if total > 1 else
               "set drafter.options.init=scratch or init=checkpoint")
        return (f"drafter.options.num_layers: {num_layers} is not in [1, {total - 1}] for this {family} target of "
                f"{total} layers (init=truncated copies its first num_layers layers, and the draft must be smaller "
                f"than the target: {total} would copy it whole); {fix}")
    return _drafters("target.layers", "recurrent_truncation_refusal")(target, num_layers)


# --- the kinds -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindRecipe:
    """What training knows of a drafter kind, one line per trainable kind of :data:`drafters.kinds.KINDS`:
    ``options_model`` validates ``drafter.options``; ``strategy``: its training strategy class, a name in
    ``drafterkit.train.strategies.<kind>`` or ``"module:Class"`` (imported on first use by
    ``train.strategies.get_strategy``, so validating a recipe loads no strategy); ``reads_features``: it trains
    from target features (so the offline feature cache can serve it, and its strategy has ``feature_layers``;
    the same as the drafter registry's ``Kind.reads_features``); ``check(recipe)``: refuses what the kind cannot
    train."""

    options_model: type[BaseModel]
    strategy: str
    reads_features: bool = False
    check: Callable[[Any], None] | None = None


KINDS: dict[str, KindRecipe] = {
    "draft_lm": KindRecipe(DraftLMOptions, "DraftLMStrategy", False, check_draft_lm_recipe),
    "medusa": KindRecipe(MedusaOptions, "MedusaStrategy", True, check_medusa_recipe),
    "eagle": KindRecipe(EagleOptions, "EagleStrategy", True, check_eagle_recipe),
    "eagle3": KindRecipe(Eagle3Options, "Eagle3Strategy", True, check_eagle3_recipe),
    "dflash": KindRecipe(DFlashOptions, "DFlashStrategy", True, check_dflash_recipe),
    "peagle": KindRecipe(PEagleOptions, "PEagleStrategy", True, check_peagle_recipe),
    "dspark": KindRecipe(DSparkOptions, "DSparkStrategy", True, check_dspark_recipe),
}


def kind_recipe(kind: str) -> KindRecipe:
    """The recipe-side description of drafter ``kind``. Raises ``ValueError`` listing the trainable kinds."""
    if kind not in KINDS:
        raise ValueError(f"no training strategy for drafter kind {kind!r}{did_you_mean(kind, KINDS)}; trainable "
                         f"kinds: {sorted(KINDS)}")
    return KINDS[kind]


def feature_kinds() -> list[str]:
    """The kinds that train from target features (served by the offline feature cache), sorted."""
    return sorted(k for k, spec in KINDS.items() if spec.reads_features)
