"""The ``exact`` section of ``benchmarks/gpu_check.py``: the decoder's two guarantees on the run's device.

* :func:`exact_rows`: at temperature 0, speculative output == plain greedy output token for token (fp32).
* :func:`chi_square_rows`: at temperature 1.0, committed tokens follow the target's distribution
  (speculative sampling, Leviathan et al. 2023; Chen et al. 2023; multi-candidate rejection sampling for
  trees, SpecInfer), by a Pearson chi-square test against the exact joint law of the first three tokens.
"""

from __future__ import annotations

import torch

from drafterkit.decode import generate
from drafterkit.decode.protocol import SamplingParams
from drafterkit.decode.sampling import logits_to_probs
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter

V, PROMPT, RUNS, MIN_P = 16, [1, 5, 9], 3000, 1e-3


def _first_mismatch(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    """``[row, position]`` of the first differing token (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        for j in range(max(len(x), len(y))):
            if j >= len(x) or j >= len(y) or x[j] != y[j]:
                return [i, j]
    return None if len(a) == len(b) else [min(len(a), len(b)), 0]


def exact_rows(target, dry: bool, seed: int = 0) -> list[dict]:
    """Greedy speculative decoding vs plain greedy decoding of ``target`` (fp32, TF32 off) on two ragged
    prompts: a self-draft (the target passed as its own draft model: every draft token is accepted), a
    truncated draft LM (the target's first layers), a random-weight EAGLE-3 head (most drafts rejected),
    and static trees ``3,2,1`` of the last two. One row per drafter: identical or the first difference."""
    dev = next(target.parameters()).device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in ((8, 5) if dry else (32, 21))]
    new = 12 if dry else 64
    layers = 1 if dry else 2
    torch.manual_seed(seed)
    with torch.device(dev):
        eagle = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=min(8192, vocab)), target=target)
    eagle = eagle.to(dev).eval()
    draft_lm = DraftLM.from_target(target, layers)
    cases = [("self-draft K=5", target, None), (f"draft LM ({layers} layers) K=5", draft_lm, None),
             ("EAGLE-3 head (random) K=5", eagle, None), (f"draft LM ({layers} layers) tree 3,2,1", draft_lm, "3,2,1"),
             ("EAGLE-3 head (random) tree 3,2,1", eagle, "3,2,1")]
    plain = generate(target, prompts, max_new_tokens=new, eos_token_id=[]).sequences
    rows = []
    for name, drafter, tree in cases:
        row = {"section": "exact", "case": f"greedy fp32 {name}", "tree": tree}
        try:
            res = generate(target, prompts, drafter=drafter, tree=tree, num_draft_tokens=5, max_new_tokens=new,
                           eos_token_id=[])
        except Exception as e:  # one drafter's path failing on this device must not hide the others
            rows.append({**row, "status": "failed", "error": f"{type(e).__name__}: {str(e).strip()[:300]}"})
            continue
        miss = _first_mismatch(res.sequences, plain)
        rows.append({**row, "status": "ran", "identical": miss is None, "first_mismatch": miss,
                     "tokens": sum(len(s) for s in plain), "tau": res.stats.tau,
                     "acceptance_rate": res.stats.acceptance_rate,
                     "at_mismatch": None if miss is None else _top2(target, prompts, plain, res.sequences, miss)})
    return rows


def _top2(target, prompts: list[list[int]], plain: list[list[int]], spec: list[list[int]], miss: list[int]) -> dict:
    """At a mismatch: the target's two best tokens and their logit gap after the shared prefix (one full,
    cache-free forward), and what each decode chose; a gap near 0 is a near-tie, a large one a bug."""
    b, j = miss
    prefix = prompts[b] + plain[b][:j]
    with torch.no_grad():
        logits = target(torch.tensor([prefix], device=next(target.parameters()).device)).logits[0, -1].float()
    top = logits.topk(2)
    pick = lambda seqs: seqs[b][j] if b < len(seqs) and j < len(seqs[b]) else None  # noqa: E731
    return {"top2_tokens": top.indices.tolist(), "top2_gap": float(top.values[0] - top.values[1]),
            "plain_chose": pick(plain), "speculative_chose": pick(spec)}


def _tiny(device: torch.device, seed: int, layers: int):
    """A seeded random 16-token-vocabulary Llama (hidden 32, LM head x8), fp32, frozen."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.to(device)


def joint_law(target, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """P(x1, x2, x3) after ``prompt`` as a float64 ``[V, V, V]`` tensor, from full (cache-free) forwards
    over every one- and two-token continuation."""
    dev = next(target.parameters()).device
    with torch.no_grad():
        p1 = logits_to_probs(target(torch.tensor([prompt], device=dev)).logits[0, -1], params).double()  # [V]
        ones = torch.tensor([prompt + [a] for a in range(V)], device=dev)
        p2 = logits_to_probs(target(ones).logits[:, -1], params).double()  # [V, V]
        twos = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)], device=dev)
        p3 = logits_to_probs(target(twos).logits[:, -1], params).double().view(V, V, V)
    return (p1[:, None, None] * p2[:, :, None] * p3).cpu()


def chi2_pvalue(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, str]:
    """Pearson chi-square p-value of counts ``observed`` against cell probabilities ``probs`` (same shape);
    cells expected below 5 are pooled into one. ``(p, source)``: scipy's ``chi2.sf`` where scipy is
    installed, else torch's regularised upper incomplete gamma Q(df/2, x/2) (the same function).

    Raises:
        AssertionError: a cell of probability 0 was observed (the sampler emitted an impossible token).
    """
    observed, probs = observed.double().flatten(), probs.double().flatten()
    assert observed[probs == 0].sum() == 0, "a token of target probability 0 was emitted"
    expected = probs / probs.sum() * observed.sum()
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat, df = float(((obs - exp) ** 2 / exp).sum()), int(keep.sum()) - 1
    try:
        from scipy import stats

        return float(stats.chi2.sf(stat, df)), "scipy"
    except ImportError:
        return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2))), "torch gammaincc"


def chi_square_rows(device: torch.device, seed: int = 1234) -> list[dict]:
    """Temperature 1.0 on a 16-token target with a 1-layer draft model, ``RUNS`` rows of one call, three new
    tokens each: a chain (K = 5, clamped to one draft token by the budget; tests (x1, x2) jointly and the
    x2 and x3 marginals) and a ``3,2`` tree (tests (x1, x2) and (x2, x3) jointly). A row passes when its
    smallest p-value exceeds ``MIN_P``."""
    target, draft = _tiny(device, 0, 2), _tiny(device, 3, 1)
    params = SamplingParams(1.0)
    joint = joint_law(target, PROMPT, params)
    rows = []
    for tree in (None, "3,2"):
        res = generate(target, [PROMPT] * RUNS, drafter=draft, tree=tree, num_draft_tokens=5, max_new_tokens=3,
                       temperature=1.0, seed=seed, eos_token_id=[])
        seqs = torch.tensor(res.sequences)  # [RUNS, 3]
        tests = {"x1,x2": (torch.bincount(seqs[:, 0] * V + seqs[:, 1], minlength=V * V), joint.sum(2))}
        if tree is None:
            tests["x2"] = (torch.bincount(seqs[:, 1], minlength=V), joint.sum((0, 2)))
            tests["x3"] = (torch.bincount(seqs[:, 2], minlength=V), joint.sum((0, 1)))
        else:
            tests["x2,x3"] = (torch.bincount(seqs[:, 1] * V + seqs[:, 2], minlength=V * V), joint.sum(0))
        pv = {k: chi2_pvalue(c, p) for k, (c, p) in tests.items()}
        p = min(v[0] for v in pv.values())
        rows.append({"section": "exact", "case": f"chi-square T=1.0 {'tree ' + tree if tree else 'chain K=5'}",
                     "status": "ran", "p_value": p, "p_values": {k: v[0] for k, v in pv.items()},
                     "p_source": next(iter(pv.values()))[1], "passed": p > MIN_P, "runs": RUNS,
                     "acceptance_rate": res.stats.acceptance_rate})
    return rows
