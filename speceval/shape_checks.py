"""What draft shapes a ``--drafter`` spec can take, checked from its folder's ``config.json`` alone, so that
``drafterkit eval``, ``tune`` and ``quickstart`` refuse a shape a drafter cannot draft when their flags are
validated (before the target loads) instead of measuring something else under its name.

* Trees: a chain-only kind (``drafters.kinds.Kind.trees`` False: DFlash, DSpark) drafts chains only, also behind
  ``+ngram`` / ``+rest`` / ``+suffix`` (the wrappers hand its rows to it).
* K: Medusa drafts at most ``num_heads`` tokens a round, DFlash ``block_size - 1``, DSpark ``block_size``
  (``drafters.kinds.max_draft_tokens``); a larger K given explicitly would be measured as that bound.
* Confidence thresholds: the model-free proposers (``ngram``, ``rest``, ``suffix``) have no draft probability to
  cut at (``supports_draft_threshold`` False).
"""

from __future__ import annotations

from drafterkit.decode.dynamic_tree import parse_tree
from drafterkit.decode.inputs import AUTO
from drafterkit.drafters import TRANSFORMERS_KIND, DrafterLoadError, resolve_checkpoint
from drafterkit.drafters.base import read_config
from drafterkit.drafters.kinds import KINDS, max_draft_tokens
from drafterkit.drafters.tuned import LOOKUP_SUFFIXES

#: specs whose proposer has no confidence to cut drafts at (``--draft-threshold`` cannot apply)
MODEL_FREE = ("ngram", "rest", "suffix")


def base_spec(spec: str) -> str:
    """``spec`` without its ``+ngram`` / ``+rest`` / ``+suffix`` suffix: the drafter that drafts its rows."""
    for suffix in LOOKUP_SUFFIXES:
        if spec.endswith(suffix):
            return spec[: -len(suffix)]
    return spec


def checkpoint_kind(spec: str) -> tuple[str, dict] | None:
    """``(kind, config.json dict)`` of the drafter checkpoint behind ``spec`` (its suffix stripped), read
    without loading weights; ``None`` for ``none`` / ``ngram`` / ``suffix`` / ``draft:N``, a transformers
    folder, or a path that holds no drafter (``speceval.methods.check_drafter_spec`` reports that one)."""
    base = base_spec(spec)
    if base in ("none", *MODEL_FREE) or base.startswith("draft:"):
        return None
    try:
        folder, kind = resolve_checkpoint(base, allow_transformers=True)
        return read_config(folder) if kind in KINDS else None
    except DrafterLoadError:
        return None


def chain_only(spec: str) -> str | None:
    """The kind of ``spec``'s drafter when it drafts chains only (``drafters.kinds.Kind.trees`` False), else None."""
    found = checkpoint_kind(spec)
    return found[0] if found is not None and not KINDS[found[0]].trees else None


def draft_cap(spec: str) -> tuple[str, int] | None:
    """``(kind, most draft tokens a round)`` of ``spec``'s drafter when its kind has a fixed bound
    (``drafters.kinds.max_draft_tokens``: Medusa's heads, DFlash's block), else None; None for a spec behind
    ``+ngram`` / ``+rest`` / ``+suffix`` too: their lookup rows draft up to K tokens whatever the drafter's bound."""
    found = checkpoint_kind(spec) if base_spec(spec) == spec else None
    cap = max_draft_tokens(*found) if found is not None else None
    return (found[0], cap) if cap is not None else None


def cap_words(kind: str, cap: int) -> str:
    """Why a ``kind`` drafter drafts at most ``cap`` tokens a round, in words."""
    if kind == "medusa":
        return f"a medusa drafter with {cap} heads drafts at most {cap} tokens a round"
    field, offset = KINDS[kind].draft_limit  # cap = config[field] + offset (DSpark's block drafts from its first slot)
    return f"a {kind} drafter drafts at most {cap} tokens a round ({field} {cap - offset})"


def check_tree_shapes(drafters: list[str], trees: list[str]) -> None:
    """Refuse a static or dynamic tree among ``trees`` (``drafterkit eval --tree``) when a drafter of
    ``drafters`` drafts chains only (:func:`chain_only`). ``chain`` and ``auto`` (its tuned setting, a chain
    for such a drafter) are fine.

    Raises:
        ValueError: one line naming the tree, the drafter and its kind, and what to pass instead.
    """
    shapes = [t for t in trees if t not in ("chain", AUTO)]
    if not shapes:
        return
    for spec in dict.fromkeys(drafters):
        kind = chain_only(spec)
        if kind is None:
            continue
        others = [d for d in drafters if d not in (spec, "none")]
        fix = ("measure it in a drafterkit eval of its own without --tree (a chain of --k tokens), or pass --tree "
               "chain to measure every drafter as a chain" if others else
               "drop --tree (it is measured as a chain of --k tokens) or pass --tree chain")
        raise ValueError(f"--tree {shapes[0]}: --drafter {spec} is a {kind} drafter, which drafts chains only; {fix}")


def has_hf_path(spec: str, trees: list[str], thresholds: list[float]) -> bool:
    """Whether transformers has its own speculative path for a row of ``spec`` (eval's ``hf-assisted`` baseline,
    ``speceval.methods.hf_method``): prompt lookup (``ngram``), or a draft LM (``draft:N``, a ``draft_lm``
    checkpoint, a transformers folder) measured as a chain (``chain`` in ``trees``) at threshold 0; never behind
    ``+ngram`` / ``+rest`` / ``+suffix``."""
    if base_spec(spec) != spec or "chain" not in trees:
        return False
    if spec == "ngram":
        return True
    if 0 not in thresholds:
        return False
    if spec.startswith("draft:"):
        return True
    try:
        return resolve_checkpoint(spec, allow_transformers=True)[1] in ("draft_lm", TRANSFORMERS_KIND)
    except DrafterLoadError:
        return False


def check_hf_assisted(drafters: list[str], trees: list[str], thresholds: list[float]) -> None:
    """Refuse ``--baselines`` naming ``hf-assisted`` when no row of ``drafters`` has a transformers path
    (:func:`has_hf_path`): the baseline would measure nothing.

    Raises:
        ValueError: one line naming the drafters that have one and the fix.
    """
    if any(has_hf_path(d, trees, thresholds) for d in drafters):
        return
    raise ValueError("--baselines hf-assisted: transformers has its own speculative path only for prompt lookup "
                     "(--drafter ngram) and draft LMs (draft:N, a draft_lm checkpoint, a transformers folder) "
                     "measured as a chain (--tree chain) at --draft-threshold 0, and no --drafter here is one; "
                     "drop hf-assisted from --baselines or add such a drafter")


def check_tune_flags(checkpoint: str, ks: list[int] | None, trees: list[str] | None, dynamic: list[str] | None,
                     thresholds: list[float] | None, incumbent: str | None) -> None:
    """Refuse the ``drafterkit tune`` flags given (each ``None`` when left out: the defaults are cut to what the
    drafter can draft, as they always were) that ``checkpoint`` cannot take: a tree (``--tree``, ``--dynamic``, a
    tree ``--incumbent``) for a chain-only drafter (:func:`chain_only`), a ``--k`` above its bound
    (:func:`draft_cap`), a ``--draft-threshold`` other than 0 for ``ngram`` / ``suffix``.

    Raises:
        ValueError: one line naming the flag, the drafter and the fix.
    """
    kind = chain_only(checkpoint)
    shapes = [("--tree", t) for t in trees or []] + [("--dynamic", t) for t in dynamic or []]
    if incumbent not in (None, "none") and not incumbent.startswith("chain:"):
        shapes.append(("--incumbent", incumbent))
    if kind is not None and shapes:
        flag, value = shapes[0]
        raise ValueError(f"{flag} {value}: tune {checkpoint}: a {kind} drafter drafts chains only: tune searches its "
                         f"chain lengths (--k) and thresholds; drop {flag}" +
                         (" or give a chain, chain:K@THRESHOLD" if flag == "--incumbent" else ""))
    if ks is not None:
        check_k([checkpoint], ks, who="tune ")
    if thresholds is not None:
        check_thresholds([checkpoint], thresholds, fix=f"tune a trained drafter (PATH) instead of {checkpoint}")


def refuse_trees(name: str, drafter, shapes: list[str]) -> list[str]:
    """``["chain"]`` when ``shapes`` (the draft shapes ``speceval.methods.build_drafters`` measures drafter spec
    ``name`` in) are chains only; the loaded ``drafter`` drafts no trees (``drafters.lookup.hybrid.drafts_trees``).

    Raises:
        ValueError: ``shapes`` holds a tree (as :func:`check_tree_shapes`, which eval runs before loading).
    """
    trees = [t for t in shapes if t != "chain"]
    if trees:
        kind = getattr(drafter, "kind", type(drafter).__name__)
        raise ValueError(f"--tree {trees[0]}: --drafter {name} ({kind}) drafts chains only; pass --tree chain")
    return ["chain"]


def distinct_trees(trees: list[str]) -> list[str]:
    """``trees`` with repeats left out, compared as trees, not as text: ``"1"``, ``"[[0]]"`` and
    ``"[[0],[0]]"`` are one tree (:meth:`decode.tree.DraftTree.parse` sorts paths and drops duplicate
    ones), measured once under the first spelling given. ``"chain"`` and specs that do not parse are
    compared as text (``EvalConfig.validate`` rejects the latter)."""
    seen, out = set(), []
    for t in trees:
        try:
            tree = None if t in ("chain", AUTO) else parse_tree(t)
            key = t if tree is None else getattr(tree, "paths", str(tree))
        except ValueError:
            key = t
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def check_k(drafters: list[str], ks: list[int], flag: str = "--k", who: str = "--drafter ") -> None:
    """Refuse a K in ``ks`` (given explicitly) above what a drafter of ``drafters`` drafts in one round
    (:func:`draft_cap`): its rows would draft fewer tokens than their K says.

    Raises:
        ValueError: one line naming the K, the drafter and its bound, and the K to give instead.
    """
    for spec in dict.fromkeys(drafters):
        found = draft_cap(spec)
        if found is None or max(ks, default=0) <= found[1]:
            continue
        kind, cap = found
        raise ValueError(cap_refusal(flag, max(ks), f"{who}{spec}", kind, cap,
                                     {"--k": f" (without --k its rows use K={min(5, cap)})"}.get(flag, "")
                                     if who == "--drafter " else f" (without {flag} it tries K up to {cap})"))


def cap_refusal(flag: str, k: int, label: str, kind: str, cap: int, default: str = "") -> str:
    """The line refusing ``flag`` ``k`` for the ``kind`` drafter ``label`` (a spec, a checkpoint or an export) that
    drafts at most ``cap`` tokens a round (:func:`cap_words`); ``default`` says what runs without the flag."""
    return f"{flag} {k}: {label}: {cap_words(kind, cap)}; give {flag} values up to {cap}{default}"


def check_thresholds(drafters: list[str], thresholds: list[float],
                     fix: str = "add a trained --drafter (PATH) it applies to") -> None:
    """Refuse a confidence threshold other than 0 when no drafter of ``drafters`` has a confidence
    (every one is ``none`` or model-free, :data:`MODEL_FREE`): nothing would read it. With a drafter that has
    one, the model-free rows are measured once, without a threshold (their label carries none).

    Raises:
        ValueError: one line naming the threshold and what to do instead.
    """
    used = [t for t in thresholds if t != 0]
    if not used or any(base_spec(d) not in ("none", *MODEL_FREE) for d in drafters):
        return
    free = [d for d in drafters if d != "none"]
    if not free:  # --drafter none alone: drafterkit eval refuses every shaping flag with it
        return
    raise ValueError(f"--draft-threshold {used[0]:g}: {' and '.join(free)} draft{'s' if len(free) == 1 else ''} "
                     f"without a probability to cut at (prompt lookup and suffix decoding copy tokens); drop "
                     f"--draft-threshold, or {fix}")


__all__ = ["MODEL_FREE", "base_spec", "cap_refusal", "chain_only", "check_hf_assisted", "check_k", "check_thresholds",
           "check_tree_shapes", "check_tune_flags", "checkpoint_kind", "distinct_trees", "draft_cap", "has_hf_path",
           "refuse_trees"]


def serves_alone(spec: str) -> bool:
    """Whether a ``--drafter`` spec may name a checkpoint measured alone (not ``ngram`` / ``rest`` / ``suffix`` /
    ``none`` / ``draft:N``, nor a drafter behind prompt lookup or suffix decoding): a shape a serving engine drafts
    with an export of it (``--served-chain``)."""
    return spec not in ("none", "ngram", "rest", "suffix") and not spec.startswith("draft:") \
        and not spec.endswith(LOOKUP_SUFFIXES)


def serves_chain(tuned: tuple | None, shapes: list[str], thresholds: list[float]) -> bool:
    """Whether an eval already measures a spec as a chain without a draft threshold (the shape vLLM serves): its
    ``--tree auto`` row (``tuned``: ``(spec, suffix)``, ``speceval.methods.tuned_row``) is one, or ``shapes``
    holds ``chain`` and ``thresholds`` 0."""
    if tuned is not None and tuned[0].tree is None and not tuned[1].startswith("@"):
        return True
    return "chain" in shapes and 0.0 in [float(t) for t in thresholds]
