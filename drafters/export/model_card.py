"""The ``README.md`` model card ``drafterkit export`` writes into every export folder (and uploads with
``--push-to-hub``).

The card holds:

* Hub metadata front matter: ``base_model`` (the target recorded in the training checkpoint's
  ``recipe.yaml``, else ``--target``; written only when it is a Hub model id, since the Hub refuses
  other values; drafterkit's pinned default target ``smollm2-135m`` is the dequantized Q4_1 build of
  ``HuggingFaceTB/SmolLM2-135M-Instruct``), ``library_name`` (``vllm``, ``sglang`` or ``transformers``) and
  ``tags`` (``drafterkit``, ``speculative-decoding``, ``eagle3`` / ``medusa`` / ``draft-model``, the engine);
* how to serve it: vLLM's ``--speculative-config`` (method ``eagle3``, ``medusa`` or ``draft_model``,
  ``num_speculative_tokens``), SGLang's ``--speculative-algorithm EAGLE3`` command for ``sglang-eagle3``,
  transformers' ``assistant_model`` for ``hf-assistant``;
* the decoding setting ``drafterkit tune`` recorded in the drafter's ``decoding.json``, when there is one
  (its batch-size-1 K is then the ``num_speculative_tokens`` served);
* what it was trained on, read from the training checkpoint folder around ``drafter/`` (see
  ``train/checkpoint.py``): ``recipe.yaml`` (drafter, data, loss, optimizer, budget) and
  ``trainer_state.json`` (optimizer steps, epoch, tokens seen);
* its measured numbers when an evaluation of these very weights was recorded: the ``drafterkit quickstart``
  report that the drafter folder's ``decoding.json`` names (``speceval/recorded.py``; used while the folder
  still holds the weights whose sha256 it records): per benchmark, tau, per-position acceptance and the
  drafter alone over the engine's plain decoding as vLLM serves it, a chain of K without a draft threshold (the
  factor the export carries), with drafterkit's own shape (a tree, a cutoff) and the prompt lookup + retrieval
  figure shown apart as not carried; else ``eval.json`` (in ``checkpoints/best``), the entry of
  ``trainer_state.json``'s ``history`` at its ``global_step``, or the run's ``eval/step-N.json`` at that step;
  else "Not measured" and the ``drafterkit eval`` command that measures it. The serve section states the
  decoding shape that was measured (a draft tree, a draft threshold) beside the chain the engines serve.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from drafterkit.assets.pinned import DEFAULT_TARGET_ALIAS
from drafterkit.drafters.base import read_config
from drafterkit.drafters.export.card_measured import (
    measured_section,
    measured_shape,
    quickstart_record,
    read_json,
    recipe_section,
    served_chain,
    tree_words,
)
from drafterkit.drafters.export.portable import scrubbed, shown_path
from drafterkit.drafters.export.vllm_support import eagle3_serve_problem, target_architecture
from drafterkit.drafters.kinds import KINDS, export_format, export_formats, max_draft_tokens, resolve
from drafterkit.drafters.tuned import DECODING_FILE, TUNED, beats_plain

#: the Hub model drafterkit's pinned default target was quantized from (assets.pinned: the Q4_1 GGUF of
#: SmolLM2-135M-Instruct), and the folder it is dequantized into under $DRAFTERKIT_HOME
PINNED_TARGET_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PINNED_TARGET_DIR = '"${DRAFTERKIT_HOME:-$HOME/.cache/drafterkit}/smollm2-135m-instruct-hf"'

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def training_record(ckpt: Path) -> dict[str, Any]:
    """What the training checkpoint around the drafter folder ``ckpt`` holds: ``folder`` (the checkpoint,
    or None for a bare drafter folder), ``recipe`` (``recipe.yaml`` as a dict), ``state``
    (``trainer_state.json``), ``eval`` (the measured evaluation of these weights) and ``eval_source`` (the
    file it came from). Missing or unreadable files give None."""
    folder = ckpt.parent if ckpt.name == "drafter" else None
    rec: dict[str, Any] = {"folder": folder, "recipe": None, "state": None, "eval": None, "eval_source": None}
    if folder is None:
        return rec
    try:
        recipe = yaml.safe_load((folder / "recipe.yaml").read_text())
        rec["recipe"] = recipe if isinstance(recipe, dict) else None
    except (OSError, yaml.YAMLError):
        pass
    rec["state"] = state = read_json(folder / "trainer_state.json")
    step = state.get("global_step") if state else None
    run = folder.parent.parent if folder.parent.name == "checkpoints" else None
    candidates = [(folder / "eval.json", read_json(folder / "eval.json"))]
    candidates += [(folder / "trainer_state.json", h) for h in reversed((state or {}).get("history") or [])
                   if isinstance(h, dict) and h.get("step") == step]
    if run is not None and step is not None:
        candidates.append((run / "eval" / f"step-{step}.json", read_json(run / "eval" / f"step-{step}.json")))
    for source, ev in candidates:
        if ev and "tau" in ev:  # named from the run (checkpoints/best/eval.json), not by a local absolute path
            rec["eval"], rec["eval_source"] = ev, source.relative_to(run if run is not None else folder.parent)
            break
    return rec


def hub_base_model(target: str | None) -> str | None:
    """``target`` as Hub ``base_model`` metadata: a Hub model id (the pinned default target's origin for
    ``smollm2-135m``), else None (a local folder is not a Hub id, and the Hub refuses the card)."""
    if target == DEFAULT_TARGET_ALIAS:
        return PINNED_TARGET_HUB_ID
    if target and _HUB_ID.match(target) and not Path(target).exists():
        return target
    return None


#: the license of drafterkit's pinned default target (HuggingFaceTB/SmolLM2-135M-Instruct's model card)
PINNED_TARGET_LICENSE = "apache-2.0"
_LICENSE = re.compile(r"^[A-Za-z0-9][\w.+-]*$")


def _front_license(text: str) -> str | None:
    """The ``license`` of a model card's YAML front matter (``---`` ... ``---``), or None."""
    if not text.startswith("---"):
        return None
    try:
        meta = yaml.safe_load(text.split("---", 2)[1])
    except (yaml.YAMLError, IndexError):
        return None
    value = meta.get("license") if isinstance(meta, dict) else None
    return value if isinstance(value, str) and _LICENSE.match(value) else None


def target_license(target: str | None) -> str | None:
    """The license ``target`` states: the pinned default target's; a folder's ``config.json`` ``license`` or its
    ``README.md`` front matter; a Hub id's model card where the Hub cache holds it (no network); else None."""
    if not target:
        return None
    if target == DEFAULT_TARGET_ALIAS:
        return PINNED_TARGET_LICENSE
    folder = Path(target)
    cards = [folder / "README.md"] if folder.is_dir() else []
    if folder.is_dir():
        value = (read_json(folder / "config.json") or {}).get("license")
        if isinstance(value, str) and _LICENSE.match(value):
            return value
    elif _HUB_ID.match(target):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(target, "README.md")
        cards += [Path(cached)] if isinstance(cached, str) else []
    for card in cards:
        try:
            if found := _front_license(card.read_text(encoding="utf-8", errors="replace")):
                return found
        except OSError:
            continue
    return None


def card_license(target: str | None, recipe: dict | None) -> tuple[str, str]:
    """The card's ``license`` (Hub metadata) and the line saying where it comes from: the target's
    (:func:`target_license`), else the training recipe's ``license``, else ``other``."""
    if found := target_license(target):
        return found, f"License: `{found}`, the target's (a drafter is trained on the target's outputs)."
    value = (recipe or {}).get("license")
    if isinstance(value, str) and _LICENSE.match(value):
        return value, f"License: `{value}`, as the training recipe's `license` sets it."
    return "other", ("License: `other`: neither the target's config / model card nor the training recipe states "
                     "one; set the recipe's `license` (or edit this card's `license`) before publishing.")


def vllm_serve_problem(fmt: str, target: str | None) -> str | None:
    """Why vLLM cannot serve the ``fmt`` export next to ``target`` (:mod:`drafters.export.vllm_support`: an EAGLE-3 /
    P-EAGLE head or a DFlash / DSpark drafter for a target architecture vLLM gives no auxiliary hidden states; the
    sentence names the export's kind), or None."""
    if fmt not in export_formats() or not export_format(fmt).aux_hidden:  # drafters.kinds.ExportFormat
        return None
    return eagle3_serve_problem(target_architecture(target), KINDS[export_formats()[fmt]].with_article)


def _front_matter(fmt: str, kind: str, target: str | None, license_id: str) -> str:
    meta: dict[str, Any] = {"license": license_id}
    if base := hub_base_model(target):
        meta["base_model"] = base
    library = export_format(fmt).library
    meta["library_name"] = library
    meta["tags"] = ["drafterkit", "speculative-decoding", KINDS[kind].tag, library]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _shell_target(target: str | None) -> str:
    if target == DEFAULT_TARGET_ALIAS:
        return PINNED_TARGET_DIR
    return shlex.quote(scrubbed(target)) if target else "TARGET"


def shape_lines(fmt: str, shape: dict | None, k: int, served: dict | None = None) -> list[str]:
    """Markdown lines: the chain of ``k`` draft tokens the commands below serve, with its measured figures
    (``served``, :func:`drafters.export.card_measured.served_chain`), beside the decoding shape drafterkit measured
    otherwise (``shape``, :func:`measured_shape`)."""
    if served:
        batches = f", {served['batches']} batches" if served.get("batches") else ""
        lines = [f"**Served shape: a chain of {k} draft tokens**, what the commands below run. `drafterkit tune` "
                 f"measured that chain at tau {served['tau']:.2f} (tokens per target forward, bonus included), "
                 f"{served['speedup']:.2f}x plain decoding (batch size 1, no draft threshold{batches}, on the "
                 "machine under Tuned decoding).", ""]
        if shape and (shape["tree"] is not None or shape["threshold"]):
            other = tree_words(shape["tree"], shape["k"]) if shape["tree"] else f"a chain of {shape['k']}"
            thr = f" with draft threshold {shape['threshold']:g}" if shape["threshold"] else ""
            lines += [f"Tuned decoding's winner is drafterkit's own decoder in {other}{thr}, a shape the engines do "
                      "not run; Measured gives the drafter as a chain without a draft threshold, as they serve it, "
                      "where the quickstart measured it.", ""]
        return lines
    if not shape:
        return []
    thr = f" with draft threshold {shape['threshold']:g} (draft tokens whose path probability under the " \
          "drafter falls below it are not proposed)" if shape["threshold"] else ""
    if shape["tree"] is None:
        return [f"drafterkit measured this drafter as a chain of {shape['k']} draft tokens{thr} (numbers under "
                f"Measured); the commands below serve a chain of {k}.", ""]
    chain = "vLLM drafts chains" if fmt != "sglang-eagle3" else "The command below drafts a chain"
    return [f"drafterkit measured this drafter as {tree_words(shape['tree'], shape['k'])}{thr}: the numbers "
            f"under Tuned decoding, and drafterkit's own shape under Measured. {chain}: "
            f"`num_speculative_tokens` {k} is a chain as deep as that tree, whose acceptance differs from the "
            "tree's: Measured's table is that chain where the quickstart measured it (else add `--served-chain` to "
            "the eval commands under Measured).", ""]


def serve_section(fmt: str, cfg: dict, model: str, target: str | None, k: int,
                  shape: dict | None = None, served: dict | None = None) -> list[str]:
    """Markdown lines: how to serve the export ``model`` (a Hub repo id or a folder) next to ``target``,
    ``k`` draft tokens per verification; ``shape``: the decoding shape drafterkit measured
    (:func:`measured_shape`), stated beside the chain served."""
    t, m = _shell_target(target), shlex.quote(model)
    lines = ["## Serve it", "", *shape_lines(fmt, shape, k, served)]
    if target == DEFAULT_TARGET_ALIAS:
        lines += ["Serve the target it was trained for: drafterkit's pinned SmolLM2-135M-Instruct, dequantized "
                  "from its Q4_1 GGUF into `$DRAFTERKIT_HOME/smollm2-135m-instruct-hf` (`drafterkit assets fetch "
                  "smollm2-135m` builds it); the Hub's full-precision weights differ.", ""]
    elif target is None:
        lines += ["`TARGET` is the model the drafter was trained for (not recorded with the checkpoint).", ""]
    elif hub_base_model(target) is None:  # a local folder: named as the card names paths (drafters.export.portable)
        lines += [f"`{scrubbed(target)}` stands for the local target folder the drafter was trained for (an export "
                  "names no absolute folder of the machine that wrote it; config.json's `drafterkit.source.drafter` "
                  "is the training checkpoint's folder relative to the export, which `drafterkit serve-check` "
                  "reads where both still sit side by side): serve those weights.", ""]
    if fmt == "sglang-eagle3":
        lines += ["```bash", f"python -m sglang.launch_server --model-path {t} --speculative-algorithm EAGLE3 \\",
                  f"    --speculative-draft-model-path {m} \\",
                  f"    --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}",
                  "```", "", "A draft tree instead of a chain: raise `--speculative-eagle-topk` and "
                  "`--speculative-num-draft-tokens`."]
        return lines
    if export_format(fmt).method is None:  # a format no engine drafterkit checks loads (drafters.kinds.ExportFormat)
        return lines + [f"No serving engine drafterkit checks loads `{fmt}` exports: decode with drafterkit's own "
                        "decoder (`drafterkit eval` / `decode.generate`)."]
    extra = export_format(fmt).speculative_config()  # P-EAGLE: eagle3 with parallel_drafting (all K in one pass)
    spec = json.dumps({"method": extra.pop("method"), "model": model, "num_speculative_tokens": k, **extra})
    if problem := vllm_serve_problem(fmt, target):
        lines += [f"**vLLM cannot serve this export yet.** {problem}. The command below is what vLLM takes once "
                  "it implements that interface for this architecture; until then use drafterkit's own decoder "
                  "(`drafterkit eval` / `decode.generate`).", ""]
    lines += ["vLLM:", "", "```bash", f"vllm serve {t} --speculative-config {shlex.quote(spec)}", "```"]
    lines += list(export_format(fmt).card_note)
    if fmt == "hf-assistant":
        py_target = ('os.path.join(os.environ.get("DRAFTERKIT_HOME", os.path.expanduser("~/.cache/drafterkit")), '
                     '"smollm2-135m-instruct-hf")' if target == DEFAULT_TARGET_ALIAS
                     else repr(scrubbed(target) or "TARGET"))
        lines += ["", "transformers (assisted generation):", "", "```python"]
        lines += ["import os"] if target == DEFAULT_TARGET_ALIAS else []
        lines += ["from transformers import AutoModelForCausalLM, AutoTokenizer", f"target_path = {py_target}",
                  "target = AutoModelForCausalLM.from_pretrained(target_path)",
                  "tok = AutoTokenizer.from_pretrained(target_path)",
                  f"assistant = AutoModelForCausalLM.from_pretrained({model!r})",
                  'ids = tok.apply_chat_template([{"role": "user", "content": "Hi!"}], add_generation_prompt=True,',
                  '                              return_tensors="pt", return_dict=True)["input_ids"]',
                  "out = target.generate(ids, assistant_model=assistant, max_new_tokens=128)", "```"]
    return lines


def _drafter_line(kind: str, cfg: dict, export_config: dict | None) -> str:
    if kind in KINDS and (own := KINDS[kind].card_line):  # the kind's own words (drafters.kinds.Kind.card_line)
        return resolve(own, KINDS[kind].module)(cfg, export_config)
    return f"draft model: a {cfg.get('num_layers', '?')}-layer causal LM sharing the target's tokenizer"


def _options(options: dict, cfg: dict) -> str:
    """The recipe's drafter options, each option left to its default (``null``) shown as the value the drafter
    resolved it to (its ``config.json``), e.g. EAGLE-3's ``feature_layers``."""
    shown = _resolved({"drafter": {"options": options}}, cfg)["drafter"]["options"]
    return ", ".join(f"{k} {json.dumps(v)}" for k, v in shown.items()) or "defaults"


def _resolved(recipe: dict, cfg: dict) -> dict:
    """``recipe`` with its drafter options left to their defaults (``null``) set to the values the drafter
    resolved them to (it trains the same drafter when rerun)."""
    drafter = recipe_section(recipe, "drafter")
    options = drafter.get("options") or {}
    resolved = {k: cfg[k] if v is None and k in cfg else v for k, v in options.items()}
    return {**recipe, "drafter": {**drafter, "options": resolved}} if options else recipe


def changes_text(changed: dict) -> str:
    """``{"optim.lr": [0.001, 0.0005], ...}`` (a resume's recipe changes) as ``optim.lr 0.001 -> 0.0005, ...``."""
    return ", ".join(f"{k} {json.dumps(b)} -> {json.dumps(a)}" for k, (b, a) in changed.items())


def training_section(kind: str, cfg: dict, rec: dict, export_config: dict | None) -> list[str]:
    """Markdown lines: the drafter, and what the recipe and trainer state recorded about its training."""
    lines = ["## Training", "", f"- Drafter: {_drafter_line(kind, cfg, export_config)}."]
    recipe, state = rec["recipe"], rec["state"]
    if recipe is None and state is None:
        return lines + ["- No training record beside the drafter folder (`recipe.yaml`, `trainer_state.json` of a "
                        "training checkpoint): it was exported from a bare drafter folder.", ""]
    target, drafter = recipe_section(recipe, "target"), recipe_section(recipe, "drafter")
    data, loss, optim, train = (recipe_section(recipe, n) for n in ("data", "loss", "optim", "train"))
    if recipe is not None:
        fmt = "ShareGPT conversations" if data.get("source") == "sharegpt" else "chat JSONL"
        source = f"`{shown_path(data['path'])}` ({fmt})" if data.get("path") else \
            "ShareGPT V3 unfiltered cleaned split (drafterkit's pinned `sharegpt` asset)"
        extra = ", responses regenerated by the target" if data.get("regenerate") else ""
        extra += f", on-policy fraction {data['on_policy_fraction']}" if data.get("on_policy_fraction") else ""
        terms = loss.get("weights") or {loss.get("name", "?"): 1.0}
        lines += [
            f"- Target: `{scrubbed(target.get('name_or_path'))}` ({target.get('dtype', '?')}).",
            f"- Options: {_options(drafter.get('options') or {}, cfg)}.",
            f"- Data: {source}, {data.get('num_examples') or 'all'} conversations, "
            f"sequences of at most {data.get('max_length')} tokens, held-out fraction "
            f"{data.get('heldout_fraction')}{extra}.",
            f"- Loss: {', '.join(f'{n} x {w}' for n, w in terms.items())} (temperature {loss.get('temperature')}).",
            f"- Optimizer: AdamW, lr {optim.get('lr')}, {optim.get('schedule')} schedule, {optim.get('warmup_steps')} "
            f"warmup steps, weight decay {optim.get('weight_decay')}, grad clip {optim.get('grad_clip')}.",
            f"- Budget: max_steps {train.get('max_steps')}"
            f"{f', max_minutes {m}' if (m := train.get('max_minutes')) else ''}, batch "
            f"{train.get('batch_size')} x grad_accum {train.get('grad_accum')} per process, mixed precision "
            f"{train.get('mixed_precision')}, seed {train.get('seed')}."]
    changes = (state or {}).get("recipe_changes") or []
    if state is not None:
        lines.append(f"- Trained: {state.get('global_step')} optimizer steps, epoch {state.get('epoch')}, "
                     f"{state.get('tokens_seen')} tokens seen.")
        lines += [f"- Resumed at step {c.get('step')} with a changed recipe: {changes_text(c.get('changed') or {})} "
                  "(the steps before it ran the earlier values)." for c in changes]
    if recipe is not None:
        rerun = ("the recipe of the last resume: the run changed its recipe when resumed (above), so rerunning it "
                 "trains a different drafter" if changes else "<code>drafterkit train recipe.yaml</code> reruns it")
        lines += ["", "<details><summary>The resolved recipe (<code>recipe.yaml</code> of the training checkpoint; "
                  f"{rerun})</summary>", "", "```yaml",
                  yaml.safe_dump(scrubbed(_resolved(recipe, cfg)), sort_keys=False).rstrip(), "```", "",
                  "</details>"]
    return lines + [""]


def tuned_section(ckpt: Path) -> tuple[list[str], int | None]:
    """Markdown lines stating the setting ``drafterkit tune`` recorded in ``ckpt/decoding.json`` (per
    concurrency: shape, K, threshold, measured speedup and tau; the machine it holds for), and the batch-size-1
    winner's K (``num_speculative_tokens``); ``([], None)`` when nothing was tuned. The winner's shape is
    :func:`tuned_shape`."""
    tuned = (read_json(ckpt / DECODING_FILE) or {}).get(TUNED)
    winners = tuned.get("winners") if isinstance(tuned, dict) else None
    if not isinstance(winners, dict) or not winners:
        return [], None
    m = tuned.get("machine") or {}
    lines = ["## Tuned decoding", "",
             f"`drafterkit tune` measured these fastest over plain decoding on held-out prompts "
             f"({(tuned.get('prompts') or {}).get('benchmark', '?')}), on {m.get('cpu', '?')} "
             f"({m.get('cpu_count', '?')} "
             f"cores, {m.get('threads', '?')} threads, {m.get('device', '?')}), target in {tuned.get('dtype', '?')}, "
             f"drafterkit {tuned.get('drafterkit', '?')}, {tuned.get('created', '?')}. On another machine, tune again.",
             "", "| concurrency | shape | K | draft threshold | tokens/s over plain decoding | tau |",
             "|---|---|---|---|---|---|"]
    for c in sorted(winners, key=int):
        w = winners[c]
        lines.append(f"| {c} | {w.get('tree')} | {w.get('k')} | {w.get('draft_threshold')} | "
                     f"{w.get('speedup', float('nan')):.2f}x | {w.get('tau', float('nan')):.2f} |")
    k = int(winners["1"]["k"]) if "1" in winners and beats_plain(winners["1"]) else None
    if served := served_chain(ckpt):
        lines += ["", f"The serve commands above run the chain the engines can: the fastest chain without a draft "
                  f"threshold this search measured at batch size 1 (K={served['k']}, under Serve it)."]
    elif "1" in winners and k is None:
        lines += ["", "No setting beat plain decoding at batch size 1 on that machine: the serve commands above do "
                  "not take their K from this search."]
    elif k is not None:
        lines += ["", f"The serve commands above use the batch-size-1 winner's K as `num_speculative_tokens` ({k}); "
                  "a tree's K is its depth (the search measured no chain without a draft threshold)."]
    return lines + [""], k


def tuned_shape(ckpt: Path) -> dict | None:
    """The batch-size-1 winner of ``drafterkit tune`` in ``ckpt/decoding.json`` as :func:`measured_shape` gives a
    shape (``{"tree", "k", "threshold"}``), or None."""
    tuned = (read_json(ckpt / DECODING_FILE) or {}).get(TUNED)
    w = ((tuned or {}).get("winners") or {}).get("1") if isinstance(tuned, dict) else None
    if not isinstance(w, dict) or "k" not in w:
        return None
    return dict(tree=None if w.get("tree") in (None, "chain") else str(w["tree"]), k=int(w["k"]),
                threshold=float(w.get("draft_threshold") or 0.0))


def write_model_card(out: Path, fmt: str, kind: str, ckpt: Path, *, target: str | None = None,
                     repo: str | None = None) -> Path:
    """Write ``out/README.md`` for the ``fmt`` export of the ``kind`` drafter folder ``ckpt`` (see the
    module docstring). ``target``: ``--target`` (used when no recipe records one); ``repo``: the Hub repo
    the export is pushed to (named in the serve commands instead of ``out``). Returns the card's path."""
    _, cfg = read_config(ckpt)
    rec = training_record(ckpt)
    rec["quickstart"] = quickstart_record(ckpt)
    shape = measured_shape(rec["quickstart"]["decoding"]) if rec["quickstart"] else None
    target = recipe_section(rec["recipe"], "target").get("name_or_path") or target
    license_id, license_line = card_license(target, rec["recipe"])
    k = shape["k"] if shape else int(recipe_section(rec["recipe"], "eval").get("k") or 5)
    tuned_lines, tuned_k = tuned_section(ckpt)
    if tuned_k:  # a setting drafterkit tune measured wins over the quickstart's: its shape is stated, tree or chain
        k, shape = tuned_k, tuned_shape(ckpt)
    if served := served_chain(ckpt):  # the engines serve a chain: the fastest one tune measured, K and figures
        k = served["k"]
    if (cap := max_draft_tokens(kind, cfg)) is not None:  # Medusa's heads, DFlash's one block
        k = min(k, cap)
    export_config = read_json(out / "config.json")
    title = f"{KINDS[kind].title} for `{scrubbed(target)}`" if target else KINDS[kind].title
    lines = [_front_matter(fmt, kind, target, license_id), f"# {title}", "",
             f"A speculative-decoding drafter trained with drafterkit and exported as "
             f"`{fmt}` from `{shown_path(ckpt)}`. The target verifies every draft token, so the output is the "
             "target's own (greedy: token for token; sampling: in distribution); the drafter only changes the speed.",
             "", license_line, ""]
    # the export is named by the Hub repo it is pushed to, else by its folder's name: never by a machine path
    lines += serve_section(fmt, cfg, repo or f"./{out.name}", target, k, shape, served) + [""]
    lines += training_section(kind, cfg, rec, export_config)
    lines += tuned_lines
    lines += measured_section(rec, ckpt, target, k)
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path
