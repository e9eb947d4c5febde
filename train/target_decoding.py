"""What of a recipe decodes with the target, refused for a target that ``decode.generate`` cannot verify with.

Training itself only reads the target's hidden states and logits (one forward per batch, or the offline feature
cache), so a target with recurrent / linear-attention layers (Qwen3.5, Qwen3-Next, Nemotron-H, Granite-4.0-H,
Falcon-H1, LFM2, Jamba, Bamba, Zamba2) trains every drafter kind. What decodes does not, while
``decode.generate`` refuses such a target (Zamba, RecurrentGemma, MiniMax, xLSTM, RWKV)
(``decode.recurrent.recurrent_problem``, applied to the target's local config by
``drafters.target.recurrent.recurrent_target_problem``): the in-training evaluation (``eval.every``,
``eval.at_end``), ``data.regenerate`` (the target writes the responses) and on-policy batches of a draft LM
truncated from the target (the draft samples through ``decode.generate``). :func:`decoding_refusal` names them in
one line at recipe validation, with the fix; when the decoder verifies such targets, its rule returns None and
nothing here is refused.
"""

from __future__ import annotations

from typing import Any

from drafterkit.drafters.target.recurrent import recurrent_target_problem

__all__ = ["decoding_keys", "decoding_refusal"]


def decoding_keys(recipe: Any) -> list[tuple[str, str]]:
    """``(key = value the recipe sets, the value that turns it off)`` for each part of ``recipe`` that decodes
    with the target (or with a draft LM made of its first layers)."""
    keys = []
    if recipe.eval.every:
        keys.append((f"eval.every={recipe.eval.every}", "eval.every=0"))
    if recipe.eval.at_end:
        keys.append(("eval.at_end=true", "eval.at_end=false"))
    if recipe.data.regenerate:
        keys.append(("data.regenerate=true", "data.regenerate=false"))
    options = recipe.drafter.parsed_options()
    if recipe.data.on_policy_fraction > 0 and getattr(options, "init", None) == "truncated":
        keys.append((f"data.on_policy_fraction={recipe.data.on_policy_fraction}", "data.on_policy_fraction=0"))
    return keys


def decoding_refusal(recipe: Any) -> str | None:
    """Why ``recipe`` cannot run on its target: one line naming the keys that decode with it, the reason the
    decoder gives for the target and the fix; None when nothing decodes or the decoder takes the target (or its
    config is not local: the build applies the same rule to the loaded target)."""
    keys = decoding_keys(recipe)
    if not keys:
        return None
    name = recipe.target.name_or_path
    why = recurrent_target_problem(name, f"target.name_or_path: {name}")
    if why is None:
        return None
    return (f"{' '.join(k for k, _ in keys)}: these decode with the target, and {why}; training alone reads only "
            f"the target's hidden states and trains every drafter kind on it: set {' '.join(f for _, f in keys)} "
            "and measure the drafter once the decoder verifies this target")
