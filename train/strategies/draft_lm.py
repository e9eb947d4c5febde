"""Training strategy for the independent draft LM (``drafters.draft_lm.DraftLM``).

Knowledge distillation of the frozen target into a small causal LM over the same vocabulary
(DistillSpec, Zhou et al. 2024): the target's logits are computed online under ``torch.no_grad``
on the same batch and compared with the drafter's at the supervised positions (``train/losses.py``).

Init (``drafter.options.init``): ``truncated`` (default; the target's embeddings, first
``num_layers`` decoder layers, final norm and LM head), ``scratch`` (a random Llama,
``scratch_config`` overriding ``DraftLMConfig`` fields), or ``checkpoint`` (a drafterkit draft_lm
folder, or any local transformers causal-LM folder sharing the target's tokenizer). Optional LoRA
(peft; Hu et al. 2022) trains only low-rank adapters; checkpoints hold the MERGED weights so they
load as a plain DraftLM.

On-policy batches (``data.on_policy_fraction``, DistillSpec): the prompt of each row (everything up
to the first supervised token) is continued by sampling from the drafter itself with
``decode.generate`` and the continuation is scored by the target.

``accept_len`` unroll (:func:`unroll_alphas`): K drafter passes that share one KV cache. Pass 1 runs
the sequence ``x [B, T]``; pass k >= 2 feeds the greedy draft tokens of pass k-1 for every start
position t at once, placed at position ``t + k - 1``, with a 4-D mask letting the draft token of start
t see only ``x[0..t]`` and the earlier draft tokens of the same start (the training-time-test
pattern of EAGLE-3, Li et al. 2025). Memory: about K times the logits of one pass. The cache keeps every
layer's keys whole (no sliding-window layer that would drop the prefix the K passes index); a sliding-window
draft LM (Mistral, Gemma-2/3, gpt-oss) gets its window in the 4-D masks instead (:func:`unroll_mask`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from drafterkit import decode
from drafterkit.assets.records import a_or_an
from drafterkit.assets.target import read_config_dict
from drafterkit.drafters import TRANSFORMERS_KIND, DrafterLoadError, load_drafter, resolve_checkpoint
from drafterkit.drafters.draft_lm import DraftLM, DraftLMConfig, check_vocab_match, lm_head_rows
from drafterkit.train import losses
from drafterkit.train.data import collate, shift_for_next_token
from drafterkit.train.options import DraftLMOptions, LoraOptions, draft_lm_vocab_refusal
from drafterkit.train.strategies.base import check_common_batch, unwrap


def _cache_kwargs(lm: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """transformers >= 5.x names the cache argument ``cache``; older releases ``past_key_values``."""
    params = inspect.signature(lm.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


def unroll_mask(config: Any, allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor,
                dtype: torch.dtype = torch.float32) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask of an unroll pass for a draft LM of ``config``: ``allowed`` (bool ``[B, 1, Q, KV]``,
    True where a query may see a key) as it is for full attention, and cut to the sliding window where layers
    slide (a query at position p sees keys at positions in ``(p - window, p]``, transformers' convention).
    ``query_pos [Q]`` / ``key_pos [KV]``: the positions of the queries and keys. Returns one mask when every
    layer attends alike (no window, or Mistral's one window for all layers), else transformers' mapping
    ``{"full_attention": mask, "sliding_attention": mask}`` (Gemma-2/3, gpt-oss: layers of both types). Masks are
    additive floats (0 where seen, the dtype's minimum elsewhere) of ``dtype``: eager attention (Gemma-2's, for its
    logit soft-capping) adds the mask to the scores, where a boolean one would add 1 and 0."""
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or [])

    def additive(mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

    if not window or (types and "sliding_attention" not in types):
        return additive(allowed)
    windowed = additive(allowed & (query_pos[:, None] - key_pos[None, :] < window)[None, None])
    return {"full_attention": additive(allowed), "sliding_attention": windowed} if types else windowed


def unroll_alphas(lm: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  target_logits: torch.Tensor, supervised: torch.Tensor, k: int, temperature: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-chain acceptance probabilities of the drafter's own K-step unroll.

    Args:
        lm: the drafter's transformers causal LM. input_ids, attention_mask: ``[B, T]`` right-padded.
        target_logits: ``[B, T, V]`` (no grad), row t predicts token t + 1.
        supervised: bool ``[B, T]``, True where position t's prediction is supervised (labels != -100).
        k: draft steps K. temperature: for p and q.

    Returns:
        ``alphas [N, K]`` (N = supervised.sum(), chains in row-major order of their start), ``step_mask
        [N, K]`` (step j of the chain at t is alive iff positions t .. t+j are all supervised), and the
        step-1 drafter logits ``[B, T, V]`` (for other loss terms).
    """
    b, t = input_ids.shape
    n = int(supervised.sum())
    chain = (supervised.reshape(-1).long().cumsum(0) - 1).reshape(b, t)  # [B, T] chain index of start (b, t)
    cache = DynamicCache()  # full layers only: sliding ones would drop the prefix the later passes' masks index
    out = lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **_cache_kwargs(lm, cache))
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache
    first, logits = out.logits, out.logits  # [B, T, V]
    ar = torch.arange(t, device=input_ids.device)
    alive = supervised.clone()  # [B, T]: chain from t alive at this step
    cols, masks = [], []
    for step in range(1, k + 1):
        if step > 1:
            shifted = torch.zeros_like(supervised)
            shifted[:, : t - step + 1] = supervised[:, step - 1:]
            alive = alive & shifted
            draft = logits.detach().argmax(-1)  # [B, T] greedy draft token of each start
            past = (step - 1) * t
            allowed = torch.zeros(t, past + t, dtype=torch.bool, device=input_ids.device)
            allowed[:, :t] = ar[None, :] <= ar[:, None]  # the real prefix x[0..t]
            for j in range(1, step):  # earlier draft blocks of the same start, and itself
                allowed[ar, j * t + ar] = True
            mask4d = allowed[None, None].expand(b, 1, t, past + t)
            pos = (ar + step - 1)[None].expand(b, t)
            key_pos = torch.cat([ar] + [ar + j for j in range(1, step)])  # prefix, then draft block j at t + j
            out = lm(input_ids=draft, attention_mask=unroll_mask(lm.config, mask4d, pos[0], key_pos, first.dtype),
                     position_ids=pos, use_cache=True,
                     **_cache_kwargs(lm, cache))
            logits = out.logits  # [B, T, V]
        bi, ti = alive.nonzero(as_tuple=True)
        if bi.numel():
            a = losses.acceptance_probability(logits[bi, ti], target_logits[bi, ti + step - 1],
                                              temperature=temperature)  # [M]
        else:
            a = logits.new_zeros(0)
        cols.append(torch.zeros(n, dtype=a.dtype, device=a.device).scatter(0, chain[bi, ti], a))
        masks.append(torch.zeros(n, dtype=torch.bool, device=a.device).index_fill(0, chain[bi, ti], True))
    return torch.stack(cols, 1), torch.stack(masks, 1), first


class DraftLMStrategy:
    """Strategy (see ``train.strategies``) for ``kind: draft_lm``."""

    kind = "draft_lm"
    options_model = DraftLMOptions

    # --- build ---------------------------------------------------------------------------------
    def build(self, recipe: Any, target: torch.nn.Module, tokenizer: Any):
        """The trainable DraftLM (fp32), from the target, scratch, or a checkpoint.

        Raises:
            ValueError: ``init: checkpoint`` without ``checkpoint``, a missing folder, bad scratch config.
        """
        opts: DraftLMOptions = recipe.drafter.parsed_options()
        if opts.init == "truncated":
            drafter = DraftLM.from_target(target, opts.num_layers)
        elif opts.init == "scratch":
            cfg = dict(vocab_size=lm_head_rows(target), num_layers=opts.num_layers,
                       bos_token_id=target.config.bos_token_id, eos_token_id=target.config.eos_token_id,
                       pad_token_id=target.config.pad_token_id)
            try:
                drafter = DraftLM(DraftLMConfig(**{**cfg, **opts.scratch_config}))
            except TypeError as exc:
                raise ValueError(f"drafter.options.scratch_config: {exc}; valid fields are those of "
                                 "drafters.draft_lm.DraftLMConfig") from None
        else:
            drafter = self._from_checkpoint(opts.checkpoint, target)
        check_vocab_match(target, drafter.lm, what="draft_lm drafter")
        drafter = drafter.to(dtype=torch.float32, device=next(target.parameters()).device)
        drafter.requires_grad_(True)
        if opts.freeze_embeddings:
            drafter.lm.get_input_embeddings().requires_grad_(False)
            drafter.lm.get_output_embeddings().requires_grad_(False)
        if opts.lora is not None:
            self._add_lora(drafter, opts.lora)
        return drafter.train()

    @staticmethod
    def _from_checkpoint(path: str | None, target: torch.nn.Module):
        """The DraftLM ``drafter.options.checkpoint`` names: a drafterkit draft_lm checkpoint (a drafter
        folder, a training checkpoint such as ``RUN/checkpoints/best``, or a run ``output_dir``, resolved as
        ``drafterkit eval`` resolves them), or a transformers causal-LM folder sharing the target's
        tokenizer (loaded in fp32; the base model when ``lora`` is set).

        Raises:
            ValueError: one line naming the folder, what is wrong with it and the fix: not set, missing,
                config.json without weights, a drafterkit checkpoint of another kind or an export, a torn
                weights file, a folder transformers cannot load as a causal LM, a vocabulary that is not
                the target's.
        """
        key = "drafter.options.checkpoint"
        wanted = ("init: checkpoint needs a draft_lm checkpoint or a transformers causal-LM folder sharing the "
                  "target's tokenizer (a drafter folder, a training checkpoint such as RUN/checkpoints/best, a run "
                  "output_dir, or a folder with config.json and weights)")
        if not path:
            raise ValueError(f"drafter.options.init is 'checkpoint' but {key} is not set; {wanted}")
        try:
            folder, kind = resolve_checkpoint(path, allow_transformers=True)
        except DrafterLoadError as exc:
            raise ValueError(f"{key}: {DraftLMStrategy._broken_checkpoint(Path(path), key, wanted) or exc}") from None
        if kind not in ("draft_lm", TRANSFORMERS_KIND):
            raise ValueError(f"{key}: {folder} is {a_or_an(kind)} checkpoint, {wanted}; {a_or_an(kind)} drafter "
                             f"trains with drafter.kind: {kind}")
        try:
            drafter = load_drafter(folder)  # no target: the weights as saved (fp32 for a transformers folder)
        except DrafterLoadError as exc:
            raise ValueError(f"{key}: {exc}") from None
        if why := draft_lm_vocab_refusal(folder, lm_head_rows(drafter.lm), lm_head_rows(target)):
            raise ValueError(why)  # a target whose config was not local (the recipe check compares the configs)
        check_vocab_match(target, drafter.lm, what=f"{key} {folder}")
        return drafter

    @staticmethod
    def _broken_checkpoint(path: Path, key: str, wanted: str) -> str | None:
        """The message for the folders ``drafters.resolve_checkpoint`` refuses that users most often name:
        a missing one, one with a config.json but no weights (``None``: its own message says it best)."""
        if not path.exists():
            return f"{path} does not exist; {wanted}"
        config = read_config_dict(path)
        if config is None:
            return None
        if "kind" in config and not (path / "model.safetensors").is_file():
            return (f"{path} holds a drafterkit {config['kind']} config.json but no model.safetensors (an interrupted "
                    f"save or copy); save the drafter again, or point {key} at a whole checkpoint")
        if "model_type" in config and "kind" not in config:
            return (f"{path} holds config.json but no weights (model.safetensors / pytorch_model.bin); save the model "
                    f"there with save_pretrained (weights included), or point {key} at a folder that holds them")
        return None

    @staticmethod
    def _add_lora(drafter, lora: LoraOptions) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                         target_modules=lora.target_modules)
        inject_adapter_in_model(cfg, drafter.lm)
        for name, p in drafter.named_parameters():
            p.requires_grad_("lora_" in name)

    # --- batches and loss ----------------------------------------------------------------------
    def check_batch(self, batch: dict[str, Any]) -> None:
        check_common_batch(batch)
        if batch["input_ids"].shape[1] < 2:
            raise ValueError("batch sequences must hold at least 2 tokens (a prompt token and a label)")

    def units(self, batch: dict[str, Any], recipe: Any) -> int:
        """The supervised positions :meth:`loss` averages over (``metrics["tokens"]``), from the batch alone
        (an on-policy batch after :meth:`on_policy_batch` replaced its responses)."""
        if batch.get("on_policy"):
            raise ValueError("count an on-policy batch after on_policy_batch has sampled its responses")
        return int((shift_for_next_token(batch) != -100).sum())

    def loss(self, drafter, target, batch, recipe):
        """``(loss, metrics)`` of ``recipe.loss`` (one term or a weighted mix) on one batch: every term a mean
        over the batch's supervised positions, ``metrics["tokens"]`` their number.

        Raises:
            ValueError: a bad batch (see :meth:`check_batch`).
        """
        if batch.get("on_policy"):
            batch = self.on_policy_batch(drafter, target, batch, recipe)
        ids, am = batch["input_ids"], batch["attention_mask"]  # [B, T]
        labels = shift_for_next_token(batch)  # [B, T], -100 where unsupervised
        sup = labels != -100
        with torch.no_grad():
            t_logits = target(input_ids=ids, attention_mask=am, use_cache=False).logits  # [B, T, V]
        cfg, terms = recipe.loss, recipe.loss.terms()
        metrics: dict[str, float] = {}
        if "accept_len" in terms:
            alphas, step_mask, d_logits = unroll_alphas(unwrap(drafter).lm, ids, am, t_logits, sup,
                                                        cfg.draft_steps, cfg.temperature)
        else:
            d_logits = drafter(ids, am)  # [B, T, V]
        total = d_logits.new_zeros(())
        for name, weight in terms.items():
            if name == "accept_len":
                value, m = losses.accept_length_loss(alphas, step_mask)
            elif name == "ce":
                y = t_logits.argmax(-1).masked_fill(~sup, -100) if cfg.ce_labels == "target" else labels
                value, m = losses.ce_loss(d_logits, y)
            else:
                value, m = losses.distribution_loss(name, d_logits, t_logits, sup, cfg)
            total = total + weight * value
            metrics.update(m)
        metrics["tokens"] = float(sup.sum())  # every term above is a mean over these positions / chains
        metrics["loss"] = float(total.detach())
        return total, metrics

    @torch.no_grad()
    def on_policy_batch(self, drafter, target, batch, recipe) -> dict[str, torch.Tensor]:
        """Replace each row's response by a sample from the drafter (DistillSpec on-policy data).

        The prompt is the row up to and including the position of its first supervised prediction;
        the sampled tokens (``data.on_policy_max_new_tokens`` at ``data.on_policy_temperature``) become the
        supervised continuation. Rows without a supervised token are kept as they are.
        """
        lm = unwrap(drafter).lm
        labels = shift_for_next_token(batch)
        ids, am = batch["input_ids"], batch["attention_mask"]
        rows, keep = [], []
        for b in range(ids.shape[0]):
            sup = (labels[b] != -100).nonzero()
            if len(sup) == 0:
                keep.append(b)
                continue
            rows.append(ids[b, : int(sup[0]) + 1].tolist())
        examples = [{"input_ids": ids[b][am[b].bool()], "loss_mask": batch["loss_mask"][b][am[b].bool()]}
                    for b in keep]
        if rows:
            was_training = lm.training
            lm.eval()
            res = decode.generate(lm, rows, max_new_tokens=recipe.data.on_policy_max_new_tokens,
                                  temperature=recipe.data.on_policy_temperature,
                                  eos_token_id=target.generation_config.eos_token_id,
                                  seed=int(batch.get("on_policy_seed", 0)))
            lm.train(was_training)
            for prompt, new in zip(rows, res.sequences):
                examples.append({"input_ids": prompt + list(new), "loss_mask": [0] * len(prompt) + [1] * len(new)})
        out = collate(examples, pad_token_id=0)  # padding is masked from attention and loss
        return {k: v.to(ids.device) for k, v in out.items()}

    # --- save ------------------------------------------------------------------------------------
    def save(self, drafter, path: str | Path) -> None:
        """``save_pretrained`` into ``path``; LoRA adapters are merged into a plain DraftLM first."""
        d = unwrap(drafter)
        if any("lora_" in n for n, _ in d.named_parameters()):
            d = merged_copy(d)
        d.save_pretrained(path)


def merged_copy(drafter):
    """A plain DraftLM whose weights are ``W + scale * B @ A`` of every LoRA layer of ``drafter``."""
    from peft.tuners.lora import LoraLayer

    state = {}
    for name, mod in drafter.lm.named_modules():
        if isinstance(mod, LoraLayer):
            base = mod.get_base_layer()
            delta = sum(mod.get_delta_weight(a) for a in mod.active_adapters)
            state[f"{name}.weight"] = (base.weight + delta).detach().clone()
            if getattr(base, "bias", None) is not None:
                state[f"{name}.bias"] = base.bias.detach().clone()
    for key, value in drafter.lm.state_dict().items():
        if "lora_" in key or ".base_layer." in key:
            continue
        state[key] = value.detach().clone()
    clean = DraftLM(drafter.config)
    clean.lm.load_state_dict(state, strict=False)
    missing = set(clean.lm.state_dict()) - set(state)
    tied = {k for k in missing if k.endswith("lm_head.weight")} if drafter.lm.config.tie_word_embeddings else set()
    if missing - tied:
        raise RuntimeError(f"LoRA merge lost tensors {sorted(missing - tied)[:4]}")
    return clean.to(next(drafter.parameters()).dtype)
