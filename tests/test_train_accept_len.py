"""The expected acceptance-length objective on each kind's own drafting.

For every kind that accepts ``accept_len`` with ``loss.draft_steps`` K > 1, the loss chains K steps
(``alpha_step1..K``); for EAGLE-1 and EAGLE-3 (``ttt_tokens: draft``) the step-j alphas of the training
unroll equal the alphas of the chain the decoder drafts (``propose``) after each real prefix.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.train import losses
from drafterkit.train.recipe import recipe_from_dict
from drafterkit.train.strategies import get_strategy

K = 3
TOKENS = [7, 3, 99, 42, 42, 5, 18, 61, 23, 8]


def _perturbed(d, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith(getattr(d, "borrowed_prefixes", ())):
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return d


def _head(kind, target, num_layers=1):
    from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter

    torch.manual_seed(0)
    if kind == "eagle":
        return _perturbed(EagleDrafter(EagleConfig.from_target(target), target=target))
    d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=48, num_layers=num_layers), target=target)
    with torch.no_grad():  # a draft vocabulary holding the target's argmax on this sequence, so no step is dropped
        top = target(torch.tensor([TOKENS])).logits[0].argmax(-1).unique()
    rest = torch.tensor([i for i in range(target.config.vocab_size) if i not in set(top.tolist())])
    d.set_draft_vocab(torch.cat([top, rest[torch.randperm(rest.numel())[: 48 - top.numel()]]]).sort().values,
                      target=target)
    return _perturbed(d)


def _recipe(kind, options, **loss):
    return recipe_from_dict({"output_dir": "unused", "drafter": {"kind": kind, "options": options},
                             "loss": {"name": "accept_len", "draft_steps": K, **loss}})


def _batch(tokens):
    ids = torch.tensor([tokens])
    lm = torch.ones_like(ids)
    lm[:, 0] = 0
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": lm}


def _training_alphas(kind, d, target, recipe, monkeypatch):
    """The ``[N, K]`` alphas and step mask the strategy hands ``accept_length_loss``, and its metrics."""
    seen = {}
    real = losses.accept_length_loss

    def spy(alphas, step_mask=None):
        seen["alphas"], seen["mask"] = alphas.detach(), step_mask
        return real(alphas, step_mask)

    monkeypatch.setattr(losses, "accept_length_loss", spy)
    loss, metrics = get_strategy(kind).loss(d.train(), target, _batch(TOKENS), recipe)
    assert torch.isfinite(loss)
    return seen["alphas"], seen["mask"], metrics


def _decoder_alphas(d, target, temperature=1.0):
    """Alphas of the chain ``propose`` drafts (greedy, K tokens) after every real prefix ``TOKENS[:t+2]``:
    the head's logits at each draft step, recorded as the decoder computes them, against the target's
    distribution at ``t+1+j`` (over the draft vocabulary for EAGLE-3)."""
    with torch.no_grad():
        out = target(torch.tensor([TOKENS]), output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i][0] for i in d.feature_layers], -1)  # [T, F]
    p_all = out.logits[0]  # [T, V]
    recorded, real = [], d.logits_and_ids

    def spy(h):
        logits, ids = real(h)
        recorded.append(logits[0].float())
        return logits, ids

    d.eval()
    d.logits_and_ids = spy
    chains = []
    for t in range(len(TOKENS) - 2):  # chain starts: token t+2 exists
        n = t + 2
        st = DecodeState(tokens=[TOKENS[:n]], num_stable=[0], features=[feats[: n - 1]], active=[True],
                         vocab_size=target.config.vocab_size)
        recorded.clear()
        d.reset(1)
        d.propose(st, K, SamplingParams(), None)
        assert len(recorded) == K
        row = []
        for j in range(K):
            p = p_all[min(t + 1 + j, len(TOKENS) - 1)]
            p = p[d.draft_ids()] if hasattr(d, "d2t") else p
            q = torch.softmax(recorded[j] / temperature, -1)
            row.append(float(torch.minimum(q, torch.softmax(p.float() / temperature, -1)).sum()))
        chains.append(row)
    del d.logits_and_ids
    return torch.tensor(chains)  # [N, K]


@pytest.mark.parametrize("kind,options", [("eagle", {"ttt_steps": K}),
                                          ("eagle3", {"ttt_steps": K, "ttt_tokens": "draft"}),
                                          ("eagle3", {"ttt_steps": K, "ttt_tokens": "draft", "num_layers": 2})])
def test_unrolled_alphas_equal_the_decoders_chain(kind, options, monkeypatch):
    target = tiny_llama(0)
    d = _head(kind, target, options.get("num_layers", 1))
    alphas, mask, metrics = _training_alphas(kind, d, target, _recipe(kind, options), monkeypatch)
    want = _decoder_alphas(d, target)
    n = len(TOKENS) - 2
    assert alphas.shape == (n, K)
    # step j of the chain at t is alive while token t+2+j exists
    assert torch.equal(mask, torch.tensor([[t + 2 + j < len(TOKENS) for j in range(K)] for t in range(n)]))
    assert torch.allclose(alphas[mask], want[mask], rtol=1e-4, atol=1e-6), (alphas, want)
    assert float(want[mask].min()) < 0.9 and float(want[:, 1:][mask[:, 1:]].max()) > 1e-3  # not a degenerate match
    assert {f"alpha_step{j}" for j in range(1, K + 1)} <= metrics.keys() and f"alpha_step{K + 1}" not in metrics


def test_eagle3_data_tokens_are_not_the_decoders_chain(monkeypatch):
    """The default TTT feed (data tokens) gives other step >= 1 alphas than the decoder's own chain:
    why accept_len needs ttt_tokens: draft."""
    target = tiny_llama(0)
    d = _head("eagle3", target)
    recipe = _recipe("eagle3", {"ttt_steps": K, "ttt_tokens": "draft"})
    own, mask, _ = _training_alphas("eagle3", d, target, recipe, monkeypatch)
    # (validation refuses accept_len with the data feed: the copy skips it to measure the difference)
    drafter = recipe.drafter.model_copy(update={"options": {**recipe.drafter.options, "ttt_tokens": "data"}})
    data_recipe = recipe.model_copy(update={"drafter": drafter})
    on_data, _, _ = _training_alphas("eagle3", d, target, data_recipe, monkeypatch)
    assert torch.allclose(own[:, 0], on_data[:, 0], atol=1e-6)  # step 0 reads the real prefix either way
    assert not torch.allclose(own[:, 1:][mask[:, 1:]], on_data[:, 1:][mask[:, 1:]], atol=1e-4)


def test_draft_lm_chains_k_steps():
    from drafterkit.drafters.draft_lm import DraftLM

    target = tiny_llama(0)
    d = DraftLM.from_target(target, 1).train()
    _, metrics = get_strategy("draft_lm").loss(d, target, _batch(TOKENS), _recipe("draft_lm", {"num_layers": 1}))
    assert {f"alpha_step{j}" for j in range(1, K + 1)} <= metrics.keys() and f"alpha_step{K + 1}" not in metrics


def _medusa_chain_steps(heads, loss):
    """The ``alpha_step<j>`` a Medusa drafter of ``heads`` heads reports under a validated accept_len recipe."""
    from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter

    target = tiny_llama(0)
    d = _perturbed(MedusaDrafter(MedusaConfig.from_target(target, num_heads=heads), target=target), scale=0.05)
    recipe = recipe_from_dict({"output_dir": "unused", "drafter": {"kind": "medusa", "options": {"num_heads": heads}},
                               "loss": {"name": "accept_len", **loss}})
    _, metrics = get_strategy("medusa").loss(d.train(), target, _batch(TOKENS), recipe)
    return {m for m in metrics if m.startswith("alpha_step")}


@pytest.mark.parametrize("heads,steps", [(3, 2), (3, 3), (2, 2)])
def test_medusa_chains_min_of_heads_and_draft_steps(heads, steps):
    k = min(heads, steps)
    assert _medusa_chain_steps(heads, {"draft_steps": steps}) == {f"alpha_step{j}" for j in range(1, k + 1)}


def test_medusa_chain_never_outruns_its_heads():
    """``loss.draft_steps`` above the heads is refused when the recipe is validated (a chain of 5 from 3 heads
    would be cut to 3 without a word); left out, the default (4) follows the heads: the chain is 3 steps."""
    from drafterkit.train.recipe import RecipeError

    with pytest.raises(RecipeError, match=r"loss\.draft_steps: 5 is more than drafter kind 'medusa' drafts"):
        _medusa_chain_steps(3, {"draft_steps": 5})
    assert _medusa_chain_steps(3, {}) == {f"alpha_step{j}" for j in range(1, 4)}
