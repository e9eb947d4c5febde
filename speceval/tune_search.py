"""The search behind ``drafterkit tune`` (:mod:`speceval.tune`): successive halving over decoding shapes.

:class:`Candidate` is one shape (chain of K, static tree or EAGLE-2 dynamic tree, at a confidence threshold);
:func:`candidates` lists those a drafter can run; :func:`halving` runs successive halving (Jamieson &
Talwalkar 2016) at one concurrency: every candidate on a few batches of prompts, the best ``1/eta`` by speedup
over plain decoding (measured on the same batches, interleaved) on to twice the batches, until one is left;
an incumbent shape is kept unless a challenger beats it beyond the noise (:func:`over_incumbent`, a paired
95% lower bound on the tokens/s ratio).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from drafterkit import decode
from drafterkit.decode.dynamic_tree import parse_tree
from drafterkit.drafters.lookup.hybrid import drafts_trees
from drafterkit.drafters.tuned import setting_label
from drafterkit.speceval.prompts import Prompt


@dataclass(frozen=True)
class Candidate:
    """One decoding shape: ``tree`` (``"chain"``, a static tree or a ``dynamic:...`` spec), ``k`` (chain
    length; a tree's depth) and ``draft_threshold`` (the drafter's confidence bar)."""

    tree: str
    k: int
    draft_threshold: float

    @property
    def label(self) -> str:
        """``chain K=3 @0.1`` / ``tree=3,2,1 @0.1`` (``drafters.tuned.setting_label``)."""
        return setting_label(self.setting())

    def setting(self) -> dict:
        """The ``decoding.json`` form: ``{"tree", "k", "draft_threshold"}``."""
        return dict(tree=self.tree, k=self.k, draft_threshold=self.draft_threshold)


def candidates(drafter, ks, trees, dynamic, thresholds) -> list[Candidate]:
    """Every shape x every threshold (thresholds only where the drafter honours ``draft_threshold``;
    trees only where it can propose them). Raises ``ValueError`` on a malformed tree spec."""
    thr = list(thresholds) if getattr(drafter, "supports_draft_threshold", False) else [0.0]
    shapes = [("chain", int(k)) for k in ks]
    if drafts_trees(drafter):
        shapes += [(t, parse_tree(t).max_depth) for t in trees]
    if drafts_trees(drafter, "propose_dynamic_tree"):
        shapes += [(str(parse_tree(t)), parse_tree(t).max_depth) for t in dynamic]
    out = [Candidate(t, k, float(x)) for t, k in shapes for x in thr]
    if not out:
        raise ValueError("nothing to tune: give --k, --tree or --dynamic values")
    return list(dict.fromkeys(out))


#: new tokens of the untimed call each method makes before the first rung (:func:`halving`)
WARM_TOKENS = 8


def _call(target, drafter, cand: Candidate | None, rows, seed: int, max_new: int, eos) -> tuple[int, float, float]:
    """One timed ``decode.generate``: (new tokens, seconds, tau)."""
    if cand is not None and getattr(drafter, "supports_draft_threshold", False):
        drafter.draft_threshold = cand.draft_threshold
    t0 = time.perf_counter()
    res = decode.generate(target, rows, drafter=drafter if cand else None, max_new_tokens=max_new,
                          num_draft_tokens=cand.k if cand else 1,
                          tree=None if cand is None or cand.tree == "chain" else cand.tree, eos_token_id=eos,
                          seed=seed)
    return sum(len(s) for s in res.sequences), time.perf_counter() - t0, res.stats.tau


def _rung(target, drafter, cands, batches, max_new, eos, seed, bar) -> list[dict]:
    """Plain decoding and every candidate on every batch, interleaved; one row per candidate, with its
    tokens/s on each batch (``batch_tokens_per_s``, for the paired comparison with the incumbent)."""
    methods: list[Candidate | None] = [None] + list(cands)
    tok = {i: 0 for i in range(len(methods))}
    sec = {i: 0.0 for i in range(len(methods))}
    taus: dict[int, list[float]] = {i: [] for i in range(len(methods))}
    per_batch: dict[int, list[float]] = {i: [] for i in range(len(methods))}
    for j, rows in enumerate(batches):
        order = list(range(len(methods)))
        order = order[j % len(order):] + order[: j % len(order)]
        for i in order:
            n, s, tau = _call(target, drafter, methods[i], rows, seed + j, max_new, eos)
            tok[i] += n
            sec[i] += s
            taus[i].append(tau)
            per_batch[i].append(n / s)
            bar.update(1)
    plain = tok[0] / sec[0]
    return [dict(label=c.label, **c.setting(), tokens_per_s=tok[i] / sec[i], plain_tokens_per_s=plain,
                 speedup=tok[i] / sec[i] / plain, tau=sum(taus[i]) / len(taus[i]), batch_tokens_per_s=per_batch[i])
            for i, c in enumerate(methods) if c is not None]


#: Student's t 97.5% quantiles by degrees of freedom (1-30; 2.0 past them): a paired mean over a few batches
#: needs far more than 2 standard errors to clear 1 at 95% (12.7 with 2 batches)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def over_incumbent(challenger: dict, incumbent: dict) -> dict:
    """The paired comparison of two rows of one rung (the same batches, interleaved): per batch the log of
    the challenger's tokens/s over the incumbent's; ``{"ratio"`` (exp of their mean), ``"low"`` (exp of the
    mean less Student's t 97.5% quantile times its standard error: a 95% lower bound; None with one batch,
    which has no spread to judge), ``"batches"``, ``"beats"`` (``low > 1``)``}``."""
    logs = [math.log(a / b) for a, b in zip(challenger["batch_tokens_per_s"], incumbent["batch_tokens_per_s"])]
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return dict(ratio=math.exp(mean), low=None, batches=n, beats=False)
    se = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1) / n)
    low = math.exp(mean - (T975[n - 2] if n - 1 <= len(T975) else 2.0) * se)
    return dict(ratio=math.exp(mean), low=low, batches=n, beats=low > 1.0)


def search_label(what: str, concurrency: int) -> str:
    """The progress bar's name for one search: ``tune the drafter + lookup + retrieval, batch size 1``, so two
    searches of one run (the drafter alone, then behind lookup) are told apart."""
    return f"tune {what}, batch size {concurrency}"


def halving(target, drafter, prompts: list[Prompt], cands: list[Candidate], concurrency: int, *, eta: int,
            first: int, max_new: int, eos, seed: int, progress: bool = True,
            incumbent: Candidate | None = None, what: str = "the drafter") -> tuple[dict, list[dict]]:
    """Successive halving at one concurrency: rung r measures the surviving candidates on ``first * 2**r``
    batches of ``concurrency`` prompts (cycled), keeps the best ``ceil(n / eta)`` by speedup, and stops
    when one is left or a rung used every prompt.

    ``incumbent`` (the shape used without tuning, e.g. the quickstart's fixed tree) runs in every rung and
    is never eliminated; the last rung's best challenger replaces it only when it is faster on the same
    batches beyond the noise (:func:`over_incumbent`: the ~95% lower bound of the paired tokens/s ratio is
    above 1). Differences smaller than the measurement can resolve keep the incumbent, so a short search
    does not trade a known shape for a lucky one. Returns ``(the winner's last row, every row)``; the
    winner's row then carries ``"over_incumbent"`` (with the two rows' ``"challenger_speedup"`` and
    ``"incumbent_speedup"`` over plain decoding) and ``"chosen"`` (``"incumbent"`` or ``"challenger"``).
    ``what``: the proposer searched, named on the progress bar (:func:`search_label`)."""
    from tqdm import tqdm

    if incumbent is not None:
        cands = [c for c in cands if c != incumbent]
        if not cands:
            cands, incumbent = [incumbent], None

    n_batches = max(1, len(prompts) // concurrency)
    plan, alive, size = [], len(cands), first
    while True:  # the calls each rung will make, for the progress bar
        b = min(size, n_batches)
        plan.append(b)
        if alive == 1 or b == n_batches:
            break
        alive, size = max(1, math.ceil(alive / eta)), size * 2
    alive_counts = [len(cands)]
    for _ in plan[1:]:
        alive_counts.append(max(1, math.ceil(alive_counts[-1] / eta)))
    fixed = [] if incumbent is None else [incumbent]
    total = sum(b * (a + 1 + len(fixed)) for b, a in zip(plan, alive_counts))
    rows, alive_cands = [], list(cands)
    with tqdm(total=total, desc=search_label(what, concurrency), disable=not progress, leave=False) as bar:
        first_rows = [prompts[t % len(prompts)].input_ids for t in range(concurrency)]
        for cand in [None, *fixed, *cands]:  # untimed: a method's first call pays one-time costs (eval's warm-up)
            _call(target, drafter, cand, first_rows, seed, min(max_new, WARM_TOKENS), eos)
        for r, b in enumerate(plan):
            batches = [[prompts[(j * concurrency + t) % len(prompts)].input_ids for t in range(concurrency)]
                       for j in range(b)]
            got = _rung(target, drafter, fixed + alive_cands, batches, max_new, eos, seed, bar)
            for row in got:
                row.update(concurrency=concurrency, rung=r, batches=b, incumbent=bool(fixed) and row is got[0])
            rows += got
            inc_row, got = (got[0], got[1:]) if fixed else (None, got)
            got.sort(key=lambda x: -x["speedup"])
            keep = 1 if r == len(plan) - 1 else max(1, math.ceil(len(got) / eta))
            by_label = {c.label: c for c in alive_cands}
            alive_cands = [by_label[x["label"]] for x in got[:keep]]
    if inc_row is None:
        return got[0], rows
    duel = over_incumbent(got[0], inc_row)
    kept = dict(got[0]) if duel["beats"] else dict(inc_row)
    kept.update(over_incumbent=dict(duel, challenger=got[0]["label"], incumbent=inc_row["label"],
                                    challenger_speedup=got[0]["speedup"], incumbent_speedup=inc_row["speedup"]),
                chosen="challenger" if duel["beats"] else "incumbent")
    return kept, rows
