"""The target a trained drafter was trained for (its training recipe's record), and what is said when it is used
with another (:mod:`drafters.target.trained_for` resolves a checkpoint path first; ``drafters.load_drafter`` calls
:func:`drafter_problem` on the folder it resolved).

A feature-level head (EAGLE, EAGLE-3, P-EAGLE, Medusa, DFlash) reads the target's hidden states: loaded next to
another target of the same hidden size and layer count it runs (``drafters.heads.feature_head.check_target_shape``
compares only shapes), and decodes exactly, but drafts from features it was never fitted to. The training
checkpoint around the drafter folder records its target (``recipe.yaml``'s ``target.name_or_path``);
:func:`drafter_problem` compares it with the target given (:func:`assets.target.same_target`: a folder, the
alias naming it and a copy of it are the same target):

* the same target, or no record (a bare drafter folder): nothing to say;
* another target whose tokenizer maps some token to another id: refused (``DrafterLoadError``), since the
  head's draft token ids would name other tokens (the DESIGN's contract: a drafter whose vocabulary cannot match
  the target is refused before any token is generated);
* another target with the same vocabulary: a warning line naming both and the fix. Not an error, since a
  fine-tuned sibling of the trained target is a legitimate use (the acceptance then measures how far its
  features moved); a target of another ``model_type`` is no such sibling, and the line says it is another
  architecture instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from drafterkit.assets.target import TargetLoadError, load_target_tokenizer, resolve_target_path, same_target
from drafterkit.drafters.base import DrafterLoadError, read_config
from drafterkit.drafters.kinds import feature_kinds


def trained_target(folder: str | Path) -> str | None:
    """The target the drafter folder ``folder`` was trained for: ``target.name_or_path`` of the ``recipe.yaml``
    of the training checkpoint holding it (``.../checkpoints/<name>/drafter``), or None (a bare drafter folder,
    or an unreadable recipe)."""
    folder = Path(folder)
    if folder.name != "drafter":
        return None
    try:
        recipe = yaml.safe_load((folder.parent / "recipe.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    target = recipe.get("target") if isinstance(recipe, dict) else None
    name = target.get("name_or_path") if isinstance(target, dict) else None
    return str(name) if name else None


def _tokenizer(name: str):
    """The tokenizer of target ``name``, or None where it cannot be loaded here (a Hub id offline, a folder gone)."""
    try:
        return load_target_tokenizer(name)
    except (TargetLoadError, OSError, ValueError):
        return None


def vocabulary_difference(a, b) -> int:
    """How many tokens of tokenizer ``a`` have another id in tokenizer ``b`` (or none there), plus how many more
    tokens ``b`` holds; 0 when both map every token text to the same id."""
    va, vb = a.get_vocab(), b.get_vocab()
    return sum(1 for t, i in va.items() if vb.get(t) != i) + max(0, len(vb) - len(va))


def drafter_problem(folder: Path, kind: str, target: str, *, label: str | None = None,
                    flag: str = "--target") -> str | None:
    """The warning line for the ``kind`` drafter in the drafter folder ``folder`` (already resolved:
    ``drafters.resolve_checkpoint``) used with ``target`` (a name, folder or Hub id, as ``flag`` gave it), or None:
    not a feature-level kind, no recorded target, the same target (:func:`assets.target.same_target`), or a target
    of another hidden size, layer count or LM head rows (:func:`shapes_match`: the shape error, raised when the
    drafter meets it, says it all). ``label`` names the drafter in the line (default: the folder).

    Raises:
        DrafterLoadError: the recorded target's tokenizer maps tokens to other ids than ``target``'s (both
            loadable here): the head's draft ids would name other tokens. The message names both targets and the fix.
    """
    recorded = trained_target(folder)
    if kind not in feature_kinds() or recorded is None or same_target(recorded, target):
        return None
    label = label or str(folder)
    fix = f"pass {flag} {recorded}, or train a drafter for {target}"
    mine, theirs = _tokenizer(recorded), _tokenizer(target)
    if mine is not None and theirs is not None and (n := vocabulary_difference(mine, theirs)):
        raise DrafterLoadError(
            f"{label}: this {kind} drafter was trained for target {recorded} (its recipe.yaml), whose vocabulary "
            f"differs from target {target}'s ({n} token(s) have other ids), so its draft token ids would name other "
            f"tokens; {fix}")
    shapes = shapes_match(folder, target)
    if shapes is False:
        return None  # the target's shape error (drafters.heads.feature_head.check_target_shape) says it all
    types = (model_type(recorded), model_type(target))
    if None not in types and types[0] != types[1]:  # not a fine-tune of the recorded target
        return (f"{label}: this {kind} drafter was trained for target {recorded} (its recipe.yaml, model_type "
                f"{types[0]}), not {target} (model_type {types[1]}): a different architecture, whose features the "
                f"drafter was not fitted to; {fix}")
    vocab = "the same vocabulary" if mine is not None and theirs is not None else \
        f"a vocabulary not compared ({(recorded if mine is None else target)}'s tokenizer is not available here)"
    shape = "the hidden size and layer count the drafter reads" if shapes else \
        f"hidden size and layer count not compared ({target}'s config.json is not available here)"
    return (f"{label}: this {kind} drafter was trained for target {recorded} (its recipe.yaml), not {target}; "
            f"{target} has {shape} and {vocab}, but the drafter reads features it was not fitted to: right for a "
            f"fine-tune of {recorded}, otherwise {fix}")


def model_type(target: str) -> str | None:
    """The ``model_type`` of target ``target``'s ``config.json`` (a local folder or the default alias's), or None where
    it is not readable here (a Hub id)."""
    try:
        config = json.loads((Path(resolve_target_path(target)).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("model_type") if isinstance(config, dict) else None
    return found if isinstance(found, str) else None


def shapes_match(folder: str | Path, target: str) -> bool | None:
    """Whether target ``target``'s ``config.json`` (a local folder or the default alias's) gives the hidden size,
    decoder layer count and LM head rows the feature-level drafter in ``folder`` records (its ``config.json``'s
    ``hidden_size``, ``target_num_layers`` and ``vocab_size``, :func:`drafters.base.read_config`: what
    ``drafters.heads.feature_head.check_target_shape`` and the heads' LM head checks compare once both are loaded; a
    copy whose vocabulary is padded to more rows has the same tokenizer but not the same shapes); None where either is
    not readable here (a Hub id, a drafter config without them)."""
    try:
        mine = read_config(folder)[1]
        theirs = json.loads((Path(resolve_target_path(target)).expanduser() / "config.json").read_text())
    except (DrafterLoadError, OSError, ValueError):
        return None
    if not (isinstance(mine, dict) and isinstance(theirs, dict)):
        return None
    theirs = theirs.get("text_config", theirs) if isinstance(theirs.get("text_config"), dict) else theirs
    want = (mine.get("hidden_size"), mine.get("target_num_layers"))
    got = (theirs.get("hidden_size"), theirs.get("num_hidden_layers"))
    if None in want or None in got:
        return None
    rows = (mine.get("vocab_size"), theirs.get("vocab_size"))  # the LM head rows: a padded copy has more
    return want == got and (None in rows or rows[0] == rows[1])


def target_from_records(folders: dict[str, Path | None], *, flag: str = "--target") -> tuple[str, str] | None:
    """The target to use when ``flag`` is not given: ``(target, label)``, the target the drafter folders'
    training recipes record (:func:`trained_target`; ``folders`` maps each drafter's label, such as
    ``--drafter SPEC``, to its resolved folder or None) and the label of the first drafter recording it; None
    where none records one (the caller keeps its default target).

    Raises:
        ValueError: two drafters record different targets (:func:`assets.target.same_target`): one line naming
            both, asking for ``flag``.
    """
    found: tuple[str, str] | None = None
    for label, folder in folders.items():
        recorded = trained_target(folder) if folder is not None else None
        if recorded is None:
            continue
        if found is None:
            found = (recorded, label)
        elif not same_target(found[0], recorded):
            raise ValueError(f"{found[1]} was trained for target {found[0]} but {label} for {recorded} (their "
                             f"recipe.yaml): pass {flag} to say which target to measure them with")
    return found
