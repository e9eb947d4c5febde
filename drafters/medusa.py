"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads"), Medusa-1: the target (backbone) stays frozen, only the heads train.

Head ``k`` (``k = 0 .. K-1``) reads the target's last hidden state AFTER the final norm
(``hidden_states[L]``, the input of the target's LM head) at position ``t`` and predicts the token at
position ``t + k + 2``: ``k + 1`` positions beyond what the target's own LM head predicts from the same
state (token ``t + 1``). Each head is ``num_layers`` residual blocks ``x + SiLU(W x + b)`` with ``W, b``
zero-initialised (so a fresh head is the identity and starts as the target's next-token predictor),
then a vocabulary projection: the target's LM head shared frozen (``share_lm_head=True``, default:
borrowed, not saved) or an own ``Linear(H, V)`` per head initialised from the target's head.

Decoding (honest offset). When the decoder asks for proposals the last committed token
``tokens[n-1]`` has NOT been through the target yet, so its hidden state does not exist. The newest
state available is ``features[n-2]`` (the one that predicted ``tokens[n-1]``). From it head ``k``
predicts position ``(n-2) + k + 2 = n + k``, i.e. head 0 gives draft token 1 (``tokens[n]``), head 1
draft token 2, ... So ``K`` heads propose at most ``K`` tokens; the target's own LM head is not used.

Greedy (``temperature == 0``): the top-1 token of each head, as a chain, ``probs=None``. Sampling
(``temperature > 0``): each draft token is sampled from its head's distribution ``q`` shaped by the
same temperature/top-k/top-p as the target; ``q`` is returned so rejection sampling stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from drafterkit.decode.cutoff import ChainCutoff
from drafterkit.decode.dynamic_tree import DynamicTree, TreeBuilder, pack_rows
from drafterkit.decode.protocol import DecodeState, Proposal, SamplingParams
from drafterkit.decode.sampling import select_tokens
from drafterkit.drafters.base import Drafter
from drafterkit.drafters.heads.feature_head import check_target_shape


@dataclass
class MedusaConfig:
    """Medusa-1 heads.

    Attributes:
        vocab_size: rows of the target's LM head (``V``).
        hidden_size: the target's hidden size (``H``).
        target_num_layers: the target's decoder layer count ``L``; the heads read ``hidden_states[L]``.
        num_heads: ``K``; head ``k`` predicts ``k + 2`` positions after its input state.
        num_layers: residual blocks per head (the Medusa paper uses 1).
        share_lm_head: True -> every head projects with the target's LM head (frozen, not saved);
            False -> each head owns a ``Linear(H, V)`` (initialised from the target's head).
    """

    vocab_size: int
    hidden_size: int
    target_num_layers: int
    num_heads: int = 5
    num_layers: int = 1
    share_lm_head: bool = True

    def __post_init__(self):
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError(f"Medusa needs num_heads >= 1 and num_layers >= 1, got {self.num_heads}, "
                             f"{self.num_layers}")

    @classmethod
    def from_target(cls, target: nn.Module, **kw) -> MedusaConfig:
        c = target.config
        return cls(vocab_size=target.get_output_embeddings().weight.shape[0], hidden_size=c.hidden_size,
                   target_num_layers=c.num_hidden_layers, **kw)


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``, zero-initialised (identity at start). ``[..., H] -> [..., H]``."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaDrafter(Drafter):
    """K Medusa heads on the target's final-norm hidden state. See the module docstring for offsets."""

    supports_draft_threshold = True

    kind = "medusa"
    config_class = MedusaConfig

    def __init__(self, config: MedusaConfig, target: nn.Module | None = None):
        super().__init__(config)
        if target is None:
            raise ValueError("MedusaDrafter needs the target (for its LM head and hidden size): "
                             "MedusaDrafter(config, target=target) / from_pretrained(path, target=target)")
        head = target.get_output_embeddings()
        if tuple(head.weight.shape) != (config.vocab_size, config.hidden_size):
            raise ValueError(f"Medusa config expects an LM head [{config.vocab_size}, {config.hidden_size}] but the "
                             f"target's is {list(head.weight.shape)}; train Medusa heads for this target")
        self.blocks = nn.ModuleList(
            nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)])
            for _ in range(config.num_heads))
        if config.share_lm_head:
            self.lm_head = head  # borrowed, frozen
            self.borrowed_prefixes = ("lm_head.",)
        else:
            self.lm_heads = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                                          for _ in range(config.num_heads))
            with torch.no_grad():
                for lin in self.lm_heads:
                    lin.weight.copy_(head.weight)
        self.feature_layers = (config.target_num_layers,)

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of head ``k``: ``hidden [..., H] -> [..., V]``."""
        return self.project(k, self.blocks[k](hidden))

    def project(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """Vocabulary projection of head ``k`` applied to its block output ``x [..., H] -> [..., V]``."""
        head = self.lm_head if self.config.share_lm_head else self.lm_heads[k]
        return head(x.to(head.weight.dtype))

    def forward(self, hidden: torch.Tensor, return_hidden: bool = False) -> torch.Tensor:
        """All heads on the target's final-norm states ``hidden [..., H]`` -> logits ``[K, ..., V]``
        (``return_hidden``: the residual blocks' outputs ``[K, ..., H]``, before the projection).

        With ``hidden [B, T, H]``, ``out[k, b, t]`` predicts the token at position ``t + k + 2`` of row ``b``.
        """
        x = torch.stack([self.blocks[k](hidden) for k in range(self.config.num_heads)])
        return x if return_hidden else torch.stack([self.project(k, x[k]) for k in range(self.config.num_heads)])

    # --- decoder protocol --------------------------------------------------------------------------
    def check_compatible(self, target: nn.Module, vocab_size: int) -> None:
        super().check_compatible(target, vocab_size)
        check_target_shape(self, target)

    def propose(self, state: DecodeState, k: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        """Draft tokens ``[B, k]`` from the state that predicted the last committed token: each head
        proposes one position, so with ``k > num_heads`` only the first ``num_heads`` are proposed
        (``Proposal.lengths``; the rest is padding the decoder ignores).

        Raises:
            ValueError: no features (the decoder did not honour ``feature_layers``).
        """
        k_all, k = k, min(k, self.config.num_heads)
        if state.features is None:
            raise ValueError("Medusa needs target features; the decoder must honour feature_layers")
        dev = next(self.blocks.parameters()).device
        rows = []
        for b, toks in enumerate(state.tokens):
            f = state.features[b]
            rows.append(f[-1] if f.shape[0] else f.new_zeros(self.config.hidden_size))
        hidden = torch.stack(rows).to(dev, next(self.blocks.parameters()).dtype)  # [B, H] = features[n-2]
        toks, probs = [], []
        cut = ChainCutoff(self.draft_threshold, len(state.tokens), k)
        with torch.no_grad():
            for j in range(k):
                logits = self.head_logits(j, hidden)  # [B, V]: head j predicts tokens[n + j]
                t, p = select_tokens(logits, sampling, state.vocab_size, generator)
                cut.update(j, t, logits=logits, probs=p, vocab_size=state.vocab_size)
                toks.append(t)
                probs.append(p)
        tokens = torch.stack(toks, 1)
        # A row with no feature yet (1-token context) repeats its last token: still a valid id.
        for b, f in enumerate(state.features):
            if f.shape[0] == 0:
                tokens[b] = state.tokens[b][-1]
        out_probs = None if sampling.greedy else torch.stack(probs, 1)
        if out_probs is not None:
            for b, f in enumerate(state.features):
                if f.shape[0] == 0:
                    out_probs[b] = torch.nn.functional.one_hot(tokens[b], out_probs.shape[-1]).float()
        lengths = cut.lengths
        if k_all > k:  # pad to the k_all columns asked for; lengths say only k are proposed
            lengths = lengths if lengths is not None else torch.full((tokens.shape[0],), k, dtype=torch.long)
            tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, k_all - k)], 1)
            if out_probs is not None:
                out_probs = torch.cat([out_probs, out_probs[:, -1:].expand(-1, k_all - k, -1)], 1)
        return Proposal(tokens=tokens.cpu(), probs=None if out_probs is None else out_probs.cpu(), lengths=lengths)

    def propose_tree(self, state: DecodeState, tree, sampling: SamplingParams,
                     generator: torch.Generator | None) -> Proposal:
        """One token per node of ``tree`` per row, Medusa's tree (Cai et al. 2024): node at depth ``d`` with
        rank ``r`` takes head ``d-1``'s rank-``r`` token (heads see only the last committed state, so a
        node's candidates do not depend on its ancestors' tokens). Nodes deeper than ``num_heads`` are
        masked out, and with ``draft_threshold > 0`` so is a node whose path probability (product of
        its heads' softmax probabilities) falls below it; a node below ``expand_threshold`` gets no
        children. Deterministic: ``probs=None``.

        Returns:
            ``Proposal(tokens [B, N], mask [B, N])``.

        Raises:
            ValueError: no features (the decoder did not honour ``feature_layers``).
        """
        if state.features is None:
            raise ValueError("Medusa needs target features; the decoder must honour feature_layers")
        dev = next(self.blocks.parameters()).device
        b_all = len(state.tokens)
        rows = [f[-1] if f.shape[0] else f.new_zeros(self.config.hidden_size) for f in state.features]
        hidden = torch.stack(rows).to(dev, next(self.blocks.parameters()).dtype)  # [B, H]
        depth = min(tree.max_depth, self.config.num_heads)
        tops = []
        with torch.no_grad():
            for j in range(depth):
                ranks = [r for r, d in zip(tree.ranks, tree.depths) if d == j + 1]
                probs = torch.softmax(self.head_logits(j, hidden)[:, : state.vocab_size].float(), -1)
                tops.append(probs.topk(min(max(ranks) + 1, probs.shape[-1]), -1))
        tokens = torch.zeros(b_all, tree.num_nodes, dtype=torch.long)
        mask = torch.zeros(b_all, tree.num_nodes, dtype=torch.bool)
        path_p = torch.ones(b_all, tree.num_nodes)
        for i, (d, r, par) in enumerate(zip(tree.depths, tree.ranks, tree.parents)):
            if d > depth or r >= tops[d - 1].indices.shape[-1]:
                continue
            tokens[:, i] = tops[d - 1].indices[:, r].cpu()
            path_p[:, i] = tops[d - 1].values[:, r].cpu() * (path_p[:, par] if par >= 0 else 1.0)
            mask[:, i] = path_p[:, i] >= self.draft_threshold
            if par >= 0:  # children only under nodes that clear expand_threshold too
                mask[:, i] &= mask[:, par] & (path_p[:, par] >= self.expand_bar)
        ready = torch.tensor([f.shape[0] > 0 and a for f, a in zip(state.features, state.active)])
        return Proposal(tokens=tokens, probs=None, mask=mask & ready[:, None])

    def propose_dynamic_tree(self, state: DecodeState, spec: DynamicTree, sampling: SamplingParams,
                             generator: torch.Generator | None) -> Proposal:
        """Per row, an EAGLE-2 dynamic tree (:class:`decode.dynamic_tree.TreeBuilder`) over Medusa's heads:
        a node at depth ``d`` takes head ``d-1``'s top-k as its candidates (as in :meth:`propose_tree`,
        the heads do not see the ancestors' tokens, so expanding a node costs no pass), scored by
        cumulative log-probability; the best ``spec.total`` nodes are verified; depth at most
        ``num_heads``. Deterministic: ``probs=None``.

        Raises:
            ValueError: no features (the decoder did not honour ``feature_layers``).
        """
        if state.features is None:
            raise ValueError("Medusa needs target features; the decoder must honour feature_layers")
        dev, dt = next(self.blocks.parameters()).device, next(self.blocks.parameters()).dtype
        spec = spec.capped(self.config.num_heads)
        hidden = torch.stack([f[-1] if f.shape[0] else f.new_zeros(self.config.hidden_size)
                              for f in state.features]).to(dev, dt)  # [B, H]
        with torch.no_grad():
            logp = [torch.log_softmax(self.head_logits(j, hidden)[:, : state.vocab_size].float(), -1).cpu()
                    for j in range(spec.depth)]  # per depth [B, V]
        rows = []
        for b, (f, active) in enumerate(zip(state.features, state.active)):
            if not active or f.shape[0] == 0:
                rows.append(None)
                continue
            builder = TreeBuilder(spec, self.draft_threshold, self.expand_bar)
            frontier = [-1]
            while frontier:
                frontier = builder.add_children(logp[builder.level][b][None].expand(len(frontier), -1))
            rows.append(builder.result())
        return pack_rows(rows)


def card_line(cfg: dict, export_config: dict | None) -> str:
    """The model card's line on a Medusa drafter whose ``config.json`` config is ``cfg`` (its export's
    config: ``export_config``; ``drafters.kinds.Kind.card_line``)."""
    return (f"Medusa: {cfg.get('num_heads')} heads of {cfg.get('num_layers')} residual block(s) on the target's "
            f"last hidden state (head k at position t predicts token t+k+2)")
