"""DSpark semi-autoregressive block drafter (DSpark, arXiv 2607.05147), in the layout vLLM 0.32's
``Qwen3DSparkModel`` loader reads (``model_executor/models/qwen3_dspark.py``).

The backbone is DFlash's (:class:`drafters.dflash.DFlashDrafter`: fused target features injected as keys/values
into ``num_layers`` Qwen3 layers, a non-causal block), run DSpark's way ("anchor as first prediction", vLLM's
``sample_from_anchor``): the block is ``[last committed token, noise x (S-1)]`` at positions ``n-1 .. n+S-2`` and
EVERY position drafts the next token, so one pass of a block of S positions drafts S tokens (S <= ``block_size``).
The noise token is the target embedding row ``mask_token_id`` (vLLM's ``dspark_noise_token_id``). Two heads:

* Markov head (low rank, the sequential stage): ``markov_w1`` ``[V, r]`` embeds the previous token (a target id)
  and ``markov_w2`` ``[N, r]`` turns that into a bias over the draft vocabulary added to the block's logits, left
  to right: ``logits_i = lm_head(norm(h_i)) + markov_w2(markov_w1(x_{i-1}))`` with ``x_{-1}`` the last committed
  token and ``x_{i-1}`` the token drafted at position ``i-1`` (``[R, N]`` per position).
* Confidence head: ``c_i = sigmoid(proj([norm(h_i); markov_w1(x_{i-1})]))`` (``[R]``; ``proj`` ``[1, H + r]`` with
  a bias, fp32; without the Markov embedding when ``confidence_with_markov`` is off): the estimated probability
  that position ``i`` is accepted when every earlier one was. Its running product is the survival of each draft
  position; with :attr:`DSparkDrafter.verify_cost` set it decides how many drafted tokens are verified
  (vLLM's ``enable_adaptive_verification``), see :func:`verified_length`.

Tensor names are vLLM's (DFlash's, plus ``markov_head.markov_w1.weight [V, r]``, ``markov_head.markov_w2.weight
[N, r]``, ``confidence_head.proj.weight [1, H + r]``, ``confidence_head.proj.bias [1]``), so the ``vllm-dspark``
export is the checkpoint's tensors as saved.

Decoding is exact: position ``i`` is chosen from ``q_i``, its own distribution given the tokens drafted before it,
which is what rejection sampling needs; cutting a chain by the confidence head depends on the drafter alone.
Chains only: DSpark defines no tree drafting (``drafters.kinds`` marks it so; ``eval`` / ``tune`` refuse a tree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from drafterkit.decode.cutoff import ChainCutoff
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.decode.sampling import mask_unproposable, select_tokens
from drafterkit.drafters.base import card_head
from drafterkit.drafters.block_pass import block_pass
from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter, pad_chains


@dataclass
class DSparkConfig(DFlashConfig):
    """DSpark drafter: :class:`drafters.dflash.DFlashConfig` (``block_size`` S: draft tokens per pass, the anchor
    included as a drafting position; ``mask_token_id``: the noise token) plus ``markov_rank`` r of the Markov head,
    ``confidence_head`` (train and save one) and ``confidence_with_markov`` (it reads the Markov embedding too)."""

    kind = "dspark"
    markov_rank: int = 64
    confidence_head: bool = True
    confidence_with_markov: bool = True

    def __post_init__(self):
        super().__post_init__()
        if not 1 <= int(self.markov_rank) <= 4096:
            raise ValueError(f"dspark markov_rank must be an int in [1, 4096], got {self.markov_rank}")
        self.markov_rank = int(self.markov_rank)


class DSparkMarkovHead(nn.Module):
    """Low-rank transition bias: ``embed(prev [R]) -> [R, r]``, ``bias([R, r]) -> [R, N]`` (vLLM's
    ``DSparkMarkovHead``). ``markov_w2`` starts at zero, so a fresh head adds nothing to the backbone's logits."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        nn.init.normal_(self.markov_w1.weight, std=rank ** -0.5)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        nn.init.zeros_(self.markov_w2.weight)

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(prev)

    def bias(self, embed: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(embed.to(self.markov_w2.weight.dtype))


class DSparkConfidenceHead(nn.Module):
    """``proj`` ``[H (+ r)] -> 1`` in fp32: ``forward(hidden [.., H] normed, embed [.., r]) -> [..]`` logits."""

    def __init__(self, input_dim: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(input_dim, 1, bias=True, dtype=torch.float32)

    def forward(self, hidden: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        x = torch.cat([hidden.float(), embed.float()], -1) if self.with_markov else hidden.float()
        # in fp32 whatever the drafter's dtype, as vLLM's fp32 ReplicatedLinear
        return F.linear(x, self.proj.weight.float(), self.proj.bias.float()).squeeze(-1)


def verified_length(confidence: torch.Tensor, cost: float) -> torch.Tensor:
    """Draft tokens to verify per row from per-position confidences ``[R, S]`` (vLLM's
    ``AdaptiveVerificationManager.get_num_tokens`` for one request): the ``b`` in ``0..S`` maximising the expected
    tokens per unit of cost ``(1 + sum_{i<b} s_i) / (1 + cost * b)``, ``s_i = prod_{j<=i} c_j`` the survival of
    position ``i``, ``cost`` the price of one more verified token relative to a round's fixed cost (vLLM profiles
    that curve on its GPU); the first maximum wins. Returns LongTensor ``[R]``."""
    survival = confidence.float().cumprod(1)  # [R, S]
    gain = torch.cat([survival.new_ones(survival.shape[0], 1), 1 + survival.cumsum(1)], 1)  # [R, S + 1]
    price = 1 + cost * torch.arange(survival.shape[1] + 1, dtype=gain.dtype)
    return (gain / price).argmax(1)


class DSparkDrafter(DFlashDrafter):
    """DSpark: DFlash's block backbone drafting from the anchor on, a low-rank Markov head chaining the block's
    positions left to right, and a confidence head that can size the verified chain (module docstring)."""

    kind = "dspark"
    config_class = DSparkConfig
    supports_draft_threshold = True
    anchor_predicts = True

    def __init__(self, config: DSparkConfig, target: nn.Module | None = None):
        super().__init__(config, target)
        c = config
        self.markov_head = DSparkMarkovHead(c.vocab_size, c.draft_vocab_size, c.markov_rank)
        self.confidence_head = (DSparkConfidenceHead(c.hidden_size + (c.markov_rank if c.confidence_with_markov
                                                                      else 0), c.confidence_with_markov)
                                if c.confidence_head else None)
        self._verify_cost: float | None = None

    @property
    def verify_cost(self) -> float | None:
        """None (the default, vLLM's ``enable_adaptive_verification: false``): every drafted token is verified.
        A float >= 0: the confidence head sizes each row's verified chain, :func:`verified_length` at that cost. A
        decode-time setting, not saved.

        Raises:
            ValueError: (setting) a negative or non-number value, or a drafter without a confidence head.
        """
        return self._verify_cost

    @verify_cost.setter
    def verify_cost(self, value: float | None) -> None:
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"verify_cost must be None or a number >= 0, got {value!r}")
            if self.confidence_head is None:
                raise ValueError("verify_cost needs a confidence head; this dspark drafter was built with "
                                 "confidence_head: false (retrain with it on, or leave verify_cost None)")
        self._verify_cost = None if value is None else float(value)

    def markov_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Draft logits of block outputs ``hidden [.., H]`` (pre-norm) given the previous tokens ``prev [..]``
        (target ids): ``lm_head(norm(hidden)) + markov_w2(markov_w1(prev))``, ``[.., N]``."""
        return self.draft_logits(hidden) + self.markov_head.bias(self.markov_head.embed(prev))

    def confidence_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Confidence-head logits ``[..]`` of block outputs ``hidden [.., H]`` (pre-norm) after ``prev [..]``.

        Raises:
            ValueError: the drafter has no confidence head.
        """
        if self.confidence_head is None:
            raise ValueError("this dspark drafter has no confidence head (built with confidence_head: false)")
        return self.confidence_head(self.norm(hidden), self.markov_head.embed(prev))

    def draft_rows(self, rows: list[int], state: DecodeState, last: torch.Tensor, k: int, slots: int,
                   sampling: SamplingParams, generator: torch.Generator | None):
        """ONE block pass over the rows (``slots`` = :meth:`slots_for` ``(K)`` positions, K =
        ``state.num_draft_tokens``, as vLLM's DSpark speculator runs ``num_speculative_tokens`` query positions),
        then the Markov head left to right (:meth:`chain`). ``lengths`` caps each chain at the block's positions and,
        with :attr:`verify_cost`, at :func:`verified_length` of the confidences (``DFlashDrafter.propose`` runs the
        rest: rows without target context yet or inactive propose nothing)."""
        if sampling.greedy and self.draft_threshold <= 0 and self._verify_cost is None and len(rows) == 1 and (
                got := block_pass(self, rows[0], state.tokens[rows[0]], state.features[rows[0]],
                                  state.num_stable[rows[0]], slots, True, state.vocab_size)) is not None:
            steps = min(k, got[2].shape[1])  # the greedy chain drafted in the compiled graph
            return pad_chains(got[2][:, :steps].cpu(), None, torch.full((1,), steps), k, self.config.vocab_size)
        hidden, logits = self.block_outputs(rows, state.tokens, state.features, state.num_stable, slots)  # [R, S, .]
        return self.chain(hidden, last.to(hidden.device), k, sampling, generator, state.vocab_size, logits)

    def greedy_chain(self, logits: torch.Tensor, prev: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """:meth:`chain`'s greedy choice at every block position, as tensors only (the compiled round runs it,
        ``drafters.block_pass``): ``logits [R, S, N]`` of the block, ``prev [R]`` the anchors -> draft tokens
        ``[R, S]`` (target ids; ids ``>= vocab_size`` never drafted, NaN never chosen, as
        ``decode.sampling.sanitize_logits``)."""
        ids = self.draft_ids()
        picked = []
        for i in range(logits.shape[1]):
            x = (logits[:, i] + self.markov_head.bias(self.markov_head.embed(prev))).float()
            best = mask_unproposable(x.nan_to_num(nan=float("-inf")), ids, vocab_size).argmax(-1)
            prev = best if ids is None else ids[best]
            picked.append(prev)
        return torch.stack(picked, 1)

    def cuts_chains(self) -> bool:
        """With :attr:`verify_cost` set, the confidence head decides each chain's verified length."""
        return self._verify_cost is not None

    def chain(self, hidden: torch.Tensor, prev: torch.Tensor, k: int, sampling: SamplingParams,
              generator: torch.Generator | None, vocab_size: int, logits: torch.Tensor | None = None):
        """The sequential stage over block outputs ``hidden [R, S, H]`` after the anchors ``prev [R]`` (``logits``:
        their draft logits ``[R, S, N]`` where already computed).

        Returns:
            ``(tokens [R, k] target ids, q [R, k, V] or None when greedy, lengths [R])`` as
            :func:`drafters.dflash.select_parallel`; ``lengths`` is ``min(k, S)``, cut where ``draft_threshold``
            cuts the chain (``decode.cutoff.ChainCutoff``) and by :func:`verified_length` where :attr:`verify_cost`
            is set.
        """
        r_n, ids = hidden.shape[0], self.draft_ids()
        steps = min(k, hidden.shape[1])
        base = self.draft_logits(hidden) if logits is None else logits  # [R, S, N]
        if ids is not None:  # reduced draft vocabulary: draft ids mapping past vocab_size are never proposed
            base = mask_unproposable(base, ids, vocab_size)
        picked, qs, prevs = [], [], []
        cut = ChainCutoff(self.draft_threshold, r_n, steps)
        for i in range(steps):
            prevs.append(prev)
            logits = base[:, i] + self.markov_head.bias(self.markov_head.embed(prev))
            tok, p = select_tokens(logits, sampling, vocab_size if ids is None else None, generator)
            cut.update(i, tok, logits=logits, probs=p)
            prev = tok if ids is None else ids[tok]
            picked.append(prev)
            if p is not None:
                q = p.float()
                qs.append(q if ids is None else q.new_zeros(r_n, self.config.vocab_size).scatter_(
                    1, ids[None].expand(r_n, -1), q))
        n = cut.lengths if cut.lengths is not None else torch.full((r_n,), steps, dtype=torch.long)
        if self._verify_cost is not None:
            conf = torch.sigmoid(self.confidence_logits(hidden[:, :steps], torch.stack(prevs, 1)))  # [R, steps]
            n = torch.minimum(n, verified_length(conf, self._verify_cost).cpu())
        tokens, q = torch.stack(picked, 1).cpu(), torch.stack(qs, 1).cpu() if qs else None
        return pad_chains(tokens, q, n, k, self.config.vocab_size)


def card_line(cfg: dict, export_config: dict | None) -> str:
    """The model card's line on a DSpark drafter whose ``config.json`` config is ``cfg`` (its export's
    config: ``export_config``; ``drafters.kinds.Kind.card_line``)."""
    shape, vocab = card_head(cfg, "draft")
    return (f"DSpark: the DFlash backbone ({shape}) drafting {cfg.get('block_size')} tokens per pass from the bonus "
            f"token on, a rank-{cfg.get('markov_rank')} Markov head chaining them left to right"
            f"{', a confidence head' if cfg.get('confidence_head') else ''}, {vocab}")
