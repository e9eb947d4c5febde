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
  drafter alone over the engine's plain decoding (the factor the export carries), with the prompt lookup +
  retrieval figure shown apart as not carried; else ``eval.json`` (in ``checkpoints/best``), the entry of
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

from drafterkit.assets.device import busy_note
from drafterkit.assets.pinned import DEFAULT_TARGET_ALIAS
from drafterkit.drafters.base import read_config, weights_sha256
from drafterkit.drafters.tuned import DECODING_FILE, TUNED, beats_plain

#: the Hub model drafterkit's pinned default target was quantized from (assets.pinned: the Q4_1 GGUF of
#: SmolLM2-135M-Instruct), and the folder it is dequantized into under $DRAFTERKIT_HOME
PINNED_TARGET_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PINNED_TARGET_DIR = '"${DRAFTERKIT_HOME:-$HOME/.cache/drafterkit}/smollm2-135m-instruct-hf"'

KIND_TAGS = {"eagle3": "eagle3", "medusa": "medusa", "draft_lm": "draft-model", "dflash": "dflash", "peagle": "p-eagle"}
KIND_TITLES = {"eagle3": "EAGLE-3 head", "medusa": "Medusa heads", "draft_lm": "Draft model",
               "dflash": "DFlash block drafter", "peagle": "P-EAGLE head"}
LIBRARIES = {"vllm-eagle3": "vllm", "sglang-eagle3": "sglang", "medusa": "vllm", "hf-assistant": "transformers",
             "vllm-dflash": "vllm", "vllm-peagle": "vllm"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
    rec["state"] = state = _read_json(folder / "trainer_state.json")
    step = state.get("global_step") if state else None
    run = folder.parent.parent if folder.parent.name == "checkpoints" else None
    candidates = [(folder / "eval.json", _read_json(folder / "eval.json"))]
    candidates += [(folder / "trainer_state.json", h) for h in reversed((state or {}).get("history") or [])
                   if isinstance(h, dict) and h.get("step") == step]
    if run is not None and step is not None:
        candidates.append((run / "eval" / f"step-{step}.json", _read_json(run / "eval" / f"step-{step}.json")))
    for source, ev in candidates:
        if ev and "tau" in ev:  # named from the run (checkpoints/best/eval.json), not by a local absolute path
            rec["eval"], rec["eval_source"] = ev, source.relative_to(run if run is not None else folder.parent)
            break
    return rec


def _same_file(recorded: str | None, actual: Path, tail: int) -> bool:
    """``recorded`` (a path a report holds, absolute or relative to where it ran) names ``actual``: the same
    file, or (a relative path from another working folder) the same last ``tail`` path parts."""
    if not recorded:
        return False
    path = Path(recorded)
    if path.exists() and path.resolve() == actual.resolve():
        return True
    return not path.is_absolute() and path.parts[-tail:] == actual.resolve().parts[-tail:]


def quickstart_record(ckpt: Path) -> dict | None:
    """The ``drafterkit quickstart`` measurement of the drafter folder ``ckpt``: ``{"decoding" (its
    ``decoding.json``), "report" (the quickstart's ``report.json``), "source" (that file's path)}``, or None
    when there is none, the folder's weights are not the ones measured (their sha256 differs from the one
    ``decoding.json`` records), or the report cannot be found: at the absolute path ``decoding.json`` names,
    else ``report.json`` of the quickstart folder around the checkpoint (``OUT/train/checkpoints/NAME/drafter``)."""
    decoding = _read_json(ckpt / "decoding.json")
    if not decoding or not decoding.get("report"):
        return None
    try:
        if decoding.get("weights_sha256") and decoding["weights_sha256"] != weights_sha256(ckpt):
            return None  # trained further or replaced since the quickstart measured it
    except OSError:
        return None
    candidates = [Path(decoding["report"])] + ([ckpt.parents[3] / "report.json"] if len(ckpt.parents) > 3 else [])
    for i, path in enumerate(candidates):
        rep = _read_json(path)
        if not rep or not isinstance(rep.get("evals"), dict) or not rep["evals"]:
            continue
        # the report decoding.json names measured these weights (their hash matched above); a report found by
        # its place must name this decoding.json as its own
        if (i == 0 and decoding.get("weights_sha256")) or \
                _same_file((rep.get("reproduce") or {}).get("decoding_json"), ckpt / "decoding.json", 5):
            return dict(decoding=decoding, report=rep, source=path)
    return None


def measured_shape(decoding: dict | None) -> dict | None:
    """The decoding shape a ``decoding.json`` records as measured: ``{"tree" (the first of its trees, None for a
    chain), "k" (the chain length an engine serves for it: the tree's depth, else K), "threshold" (the first
    draft threshold)}``; None without a record."""
    if not decoding:
        return None
    tree = next(iter(decoding.get("trees") or []), None)
    tree = None if tree in (None, "chain") else str(tree)
    k = len(tree.split(",")) if tree else int(decoding.get("k") or 5)
    return dict(tree=tree, k=k, threshold=next(iter(decoding.get("draft_thresholds") or []), 0.0))


def _section(recipe: dict | None, name: str) -> dict:
    value = (recipe or {}).get(name)
    return value if isinstance(value, dict) else {}


def hub_base_model(target: str | None) -> str | None:
    """``target`` as Hub ``base_model`` metadata: a Hub model id (the pinned default target's origin for
    ``smollm2-135m``), else None (a local folder is not a Hub id, and the Hub refuses the card)."""
    if target == DEFAULT_TARGET_ALIAS:
        return PINNED_TARGET_HUB_ID
    if target and _HUB_ID.match(target) and not Path(target).exists():
        return target
    return None


def _front_matter(fmt: str, kind: str, target: str | None) -> str:
    meta: dict[str, Any] = {}
    if base := hub_base_model(target):
        meta["base_model"] = base
    meta["library_name"] = LIBRARIES[fmt]
    meta["tags"] = ["drafterkit", "speculative-decoding", KIND_TAGS[kind], LIBRARIES[fmt]]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _shell_target(target: str | None) -> str:
    if target == DEFAULT_TARGET_ALIAS:
        return PINNED_TARGET_DIR
    return shlex.quote(target) if target else "TARGET"


def shape_lines(fmt: str, shape: dict | None, k: int) -> list[str]:
    """Markdown lines: the decoding shape drafterkit measured (``shape``, :func:`measured_shape`) beside the
    chain of ``k`` draft tokens the commands below serve."""
    if not shape:
        return []
    thr = f" with draft threshold {shape['threshold']:g} (draft tokens whose path probability under the " \
          "drafter falls below it are not proposed)" if shape["threshold"] else ""
    if shape["tree"] is None:
        return [f"drafterkit measured this drafter as a chain of {shape['k']} draft tokens{thr} (numbers under "
                f"Measured); the commands below serve a chain of {k}.", ""]
    chain = "vLLM drafts chains" if fmt != "sglang-eagle3" else "The command below drafts a chain"
    return [f"drafterkit measured this drafter as the static draft tree `{shape['tree']}` (branching factors per "
            f"depth, depth {shape['k']}){thr}: that is what the numbers under Measured are. {chain}: "
            f"`num_speculative_tokens` {k} is a chain as deep as that tree, whose acceptance differs from the "
            f"tree's (measure the chain with the eval commands under Measured, `--tree {shape['tree']}` replaced by "
            "`--tree chain` and the draft threshold by `--draft-threshold 0`).", ""]


def serve_section(fmt: str, cfg: dict, model: str, target: str | None, k: int,
                  shape: dict | None = None) -> list[str]:
    """Markdown lines: how to serve the export ``model`` (a Hub repo id or a folder) next to ``target``,
    ``k`` draft tokens per verification; ``shape``: the decoding shape drafterkit measured
    (:func:`measured_shape`), stated beside the chain served."""
    t, m = _shell_target(target), shlex.quote(model)
    lines = ["## Serve it", "", *shape_lines(fmt, shape, k)]
    if target == DEFAULT_TARGET_ALIAS:
        lines += ["Serve the target it was trained for: drafterkit's pinned SmolLM2-135M-Instruct, dequantized "
                  "from its Q4_1 GGUF into `$DRAFTERKIT_HOME/smollm2-135m-instruct-hf` (`drafterkit assets fetch "
                  "smollm2-135m` builds it); the Hub's full-precision weights differ.", ""]
    elif target is None:
        lines += ["`TARGET` is the model the drafter was trained for (not recorded with the checkpoint).", ""]
    if fmt == "sglang-eagle3":
        lines += ["```bash", f"python -m sglang.launch_server --model-path {t} --speculative-algorithm EAGLE3 \\",
                  f"    --speculative-draft-model-path {m} \\",
                  f"    --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}",
                  "```", "", "A draft tree instead of a chain: raise `--speculative-eagle-topk` and "
                  "`--speculative-num-draft-tokens`."]
        return lines
    method = {"vllm-eagle3": "eagle3", "medusa": "medusa", "hf-assistant": "draft_model", "vllm-dflash": "dflash",
              "vllm-peagle": "eagle3"}[fmt]
    parallel = {"parallel_drafting": True} if fmt == "vllm-peagle" else {}  # P-EAGLE: all K tokens in one pass
    spec = json.dumps({"method": method, "model": model, "num_speculative_tokens": k, **parallel})
    lines += ["vLLM:", "", "```bash", f"vllm serve {t} --speculative-config {shlex.quote(spec)}", "```"]
    if fmt == "hf-assistant":
        py_target = ('os.path.join(os.environ.get("DRAFTERKIT_HOME", os.path.expanduser("~/.cache/drafterkit")), '
                     '"smollm2-135m-instruct-hf")' if target == DEFAULT_TARGET_ALIAS else repr(target or "TARGET"))
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
    if kind == "eagle3":
        ids = (export_config or {}).get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
        held = f"`eagle_aux_hidden_state_layer_ids` {ids}" if ids is not None else \
            "no `eagle_aux_hidden_state_layer_ids` (SGLang's default capture is these layers)"
        return (f"EAGLE-3: one decoder layer over 3 target layers (drafterkit ids {cfg.get('feature_layers')}: "
                f"`hidden_states[i]`, the input of decoder layer i; this export holds {held}), draft vocabulary "
                f"{cfg.get('draft_vocab_size')} of {cfg.get('vocab_size')} target tokens")
    if kind == "peagle":
        return (f"P-EAGLE: the EAGLE-3 head (target layers {cfg.get('feature_layers')}, draft vocabulary "
                f"{cfg.get('draft_vocab_size')} of {cfg.get('vocab_size')}) with learned mask inputs (token "
                f"{cfg.get('mask_token_id')}, `mask_hidden`): one pass drafts every position of the chain "
                f"(trained on {cfg.get('num_depths')})")
    if kind == "dflash":
        return (f"DFlash: {cfg.get('num_layers')} draft layer(s) reading target layers {cfg.get('feature_layers')} "
                f"(`hidden_states[i]`; vLLM `target_layer_ids` i - 1) as keys/values, one non-causal pass over a "
                f"block of {cfg.get('block_size')} drafts {int(cfg.get('block_size', 2)) - 1} tokens, draft vocabulary "
                f"{cfg.get('draft_vocab_size')} of {cfg.get('vocab_size')} target tokens")
    if kind == "medusa":
        return (f"Medusa: {cfg.get('num_heads')} heads of {cfg.get('num_layers')} residual block(s) on the target's "
                f"last hidden state (head k at position t predicts token t+k+2)")
    return f"draft model: a {cfg.get('num_layers', '?')}-layer causal LM sharing the target's tokenizer"


def _options(options: dict, cfg: dict) -> str:
    """The recipe's drafter options, each option left to its default (``null``) shown as the value the drafter
    resolved it to (its ``config.json``), e.g. EAGLE-3's ``feature_layers``."""
    shown = _resolved({"drafter": {"options": options}}, cfg)["drafter"]["options"]
    return ", ".join(f"{k} {json.dumps(v)}" for k, v in shown.items()) or "defaults"


def _resolved(recipe: dict, cfg: dict) -> dict:
    """``recipe`` with its drafter options left to their defaults (``null``) set to the values the drafter
    resolved them to (it trains the same drafter when rerun)."""
    drafter = _section(recipe, "drafter")
    options = drafter.get("options") or {}
    resolved = {k: cfg[k] if v is None and k in cfg else v for k, v in options.items()}
    return {**recipe, "drafter": {**drafter, "options": resolved}} if options else recipe


def training_section(kind: str, cfg: dict, rec: dict, export_config: dict | None) -> list[str]:
    """Markdown lines: the drafter, and what the recipe and trainer state recorded about its training."""
    lines = ["## Training", "", f"- Drafter: {_drafter_line(kind, cfg, export_config)}."]
    recipe, state = rec["recipe"], rec["state"]
    if recipe is None and state is None:
        return lines + ["- No training record beside the drafter folder (`recipe.yaml`, `trainer_state.json` of a "
                        "training checkpoint): it was exported from a bare drafter folder.", ""]
    target, drafter = _section(recipe, "target"), _section(recipe, "drafter")
    data, loss, optim, train = (_section(recipe, n) for n in ("data", "loss", "optim", "train"))
    if recipe is not None:
        fmt = "ShareGPT conversations" if data.get("source") == "sharegpt" else "chat JSONL"
        source = f"`{data['path']}` ({fmt})" if data.get("path") else \
            "ShareGPT V3 unfiltered cleaned split (drafterkit's pinned `sharegpt` asset)"
        extra = ", responses regenerated by the target" if data.get("regenerate") else ""
        extra += f", on-policy fraction {data['on_policy_fraction']}" if data.get("on_policy_fraction") else ""
        terms = loss.get("weights") or {loss.get("name", "?"): 1.0}
        lines += [
            f"- Target: `{target.get('name_or_path')}` ({target.get('dtype', '?')}).",
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
    if state is not None:
        lines.append(f"- Trained: {state.get('global_step')} optimizer steps, epoch {state.get('epoch')}, "
                     f"{state.get('tokens_seen')} tokens seen.")
    if recipe is not None:
        lines += ["", "<details><summary>The resolved recipe (<code>recipe.yaml</code> of the training checkpoint; "
                  "<code>drafterkit train recipe.yaml</code> reruns it)</summary>", "", "```yaml",
                  yaml.safe_dump(_resolved(recipe, cfg), sort_keys=False).rstrip(), "```", "", "</details>"]
    return lines + [""]


def eval_command(ckpt: Path, target: str | None, k: int) -> str:
    """The ``drafterkit eval`` line that measures the checkpoint at ``ckpt`` (tau, acceptance, tokens/s and
    the speedup over plain decoding, on MT-bench); ``TARGET`` stands for a target nothing recorded."""
    tgt = f" --target {shlex.quote(target)}" if target else " --target TARGET"
    return f"drafterkit eval{tgt} --drafter {shlex.quote(str(ckpt))} --benchmark mt-bench --k {k}"


def _pct(values, reached=None) -> str:
    """Per-position acceptance, ``-`` at a position no proposal reached (``reached``: the proposals per position)."""
    reached = reached if reached and len(reached) == len(values or []) else [1] * len(values or [])
    return ", ".join(f"{a:.3f}" if r else "-" for a, r in zip(values or [], reached)) or "-"


def _fmt(value, spec: str = "{:.2f}") -> str:
    return spec.format(value) if isinstance(value, (int, float)) else "-"


def _spread(interval) -> str:
    # the 95% interval over the eval's prompts (speceval.factors.ratio_interval), where the report has one
    return f"; 95% interval {interval[0]:.2f}-{interval[1]:.2f}x" if interval else ""


def quickstart_section(qs: dict) -> list[str]:
    """Markdown lines: the ``drafterkit quickstart`` measurement (:func:`quickstart_record`): per benchmark the
    drafter alone (the factor an export carries: tau, acceptance, per-position acceptance, its speed over the
    engine's plain decoding), then, labelled as not carried, the drafter behind prompt lookup + retrieval."""
    dec, rep = qs["decoding"], qs["report"]
    rows, extra, setup = [], [], None
    for bench, ev in rep["evals"].items():
        factors = ev.get("factors") or []
        alone = next((f for f in factors if f.get("export")), None)
        summary = {r["method"]: r for r in ev.get("summary") or []}
        row = summary.get(alone["method"]) if alone else None
        if row is None:
            continue
        rows.append(f"| {bench} | {row.get('prompts', '?')} x {ev['config'].get('max_new_tokens', '?')} | "
                    f"{_fmt(row.get('tau'), '{:.3f}')} | {_fmt(row.get('acceptance_rate'), '{:.3f}')} | "
                    f"{_pct(row.get('accept_per_position'), row.get('reached_per_position'))} | "
                    f"{_fmt(alone['ratio'])}x "
                    f"({_fmt(alone['tokens_per_s'], '{:.1f}')} vs {_fmt(alone['over_tokens_per_s'], '{:.1f}')} "
                    f"tokens/s{_spread(alone.get('interval'))}) |")
        group = [f for f in factors if f.get("group") == alone.get("group")]
        spec = next((f for f in group if f["factor"] == "speculation"), None)
        e2e = next((f for f in group if f["factor"] == "end to end"), None)
        if spec is not None:
            extra.append(f"- {bench}: `{spec['method']}`: {_fmt(spec['ratio'])}x the engine's plain decoding"
                         + (f", {_fmt(e2e['ratio'])}x transformers `generate` end to end" if e2e else "") + ".")
        setup = setup or ev
    if not rows:
        return []
    mach, cfg = setup.get("machine") or {}, setup.get("config") or {}
    shape = measured_shape(dec)
    drafted = (f"the static draft tree `{shape['tree']}`" if shape["tree"] else f"chains of {shape['k']} draft "
               f"tokens") + (f", draft threshold {shape['threshold']:g}" if shape["threshold"] else "")
    lines = ["## Measured", "",
             f"Measured by `drafterkit quickstart` with drafterkit's decoder (exact verification, greedy), recorded "
             f"in `{qs['source']}`. The drafter alone, against plain decoding through the same engine in the same "
             "run: this is what `drafterkit export` carries to a serving engine.", "",
             "| benchmark | prompts x new tokens | tau (bonus included) | acceptance rate | acceptance per draft "
             "position (`-`: no proposal reached it) | speed vs plain decoding |", "|---|---|---|---|---|---|", *rows,
             "",
             f"- Decoding: {drafted}, temperature {cfg.get('temperature', 0.0)}, dtype {dec.get('dtype', '?')}.",
             f"- Machine: {mach.get('device', '?')}, {mach.get('cpu_count', '?')} CPUs, {mach.get('threads', '?')} "
             f"threads, torch {mach.get('torch', '?')}, transformers {mach.get('transformers', '?')}."]
    if note := busy_note(mach):
        lines.append(f"- **Busy machine**: {note}.")
    if extra:
        lines += ["", "**Not carried by this export**: drafterkit's decoder also measured the drafter behind "
                  "prompt lookup and retrieval from ShareGPT (`+rest`), which serving engines do not run with it:",
                  "", *extra]
    commands = [c for c in dec.get("commands") or [] if isinstance(c, str)]
    if commands:
        lines += ["", "Reproduce (the same rows, side by side with plain decoding):", "", "```bash", *commands, "```"]
    return lines + [""]


def measured_section(rec: dict, ckpt: Path, target: str | None, k: int) -> list[str]:
    """Markdown lines: the recorded evaluation of these weights (the quickstart's first, :func:`quickstart_section`),
    else "Not measured" and the command."""
    if rec.get("quickstart") and (lines := quickstart_section(rec["quickstart"])):
        return lines
    ev, ev_cfg = rec["eval"], _section(rec["recipe"], "eval")
    command = ["```bash", eval_command(ckpt, target, k), "```"]
    if ev is None:
        return ["## Measured", "", "**Not measured**: the checkpoint this export came from holds no evaluation record "
                "(`eval.json`, an entry of `trainer_state.json`'s history at its step, or the run's "
                "`eval/step-N.json`). Measure it with drafterkit's decoder against plain decoding:", "", *command, ""]
    prompts = ev.get("prompts") or {}
    per_pos = ", ".join(f"{a:.3f}" for a in ev.get("accept_per_position") or [])
    setup = (f"step {ev.get('step', '?')}, {prompts.get('used', ev_cfg.get('num_prompts', '?'))} prompts of "
             f"{prompts.get('benchmark', ev_cfg.get('prompts', '?'))}, {ev_cfg.get('max_new_tokens', '?')} new tokens, "
             f"chains of {ev_cfg.get('k', '?')} draft tokens, temperature {ev_cfg.get('temperature', '?')}, target "
             f"{_section(rec['recipe'], 'target').get('dtype', '?')}")
    return ["## Measured", "",
            f"Measured during training by drafterkit's decoder (exact verification), recorded in "
            f"`{rec['eval_source']}`:",
            "", "| metric | value |", "|---|---|",
            f"| tau (tokens per target forward, bonus included) | {ev['tau']:.3f} |",
            f"| acceptance rate | {ev.get('acceptance_rate', float('nan')):.3f} |",
            f"| acceptance per draft position | {per_pos} |",
            f"| tokens/s (on the training machine) | {ev.get('tokens_per_s', float('nan')):.1f} |",
            f"| setup | {setup} |", "",
            "Speed depends on the machine and the engine; measure it against plain decoding with:", "", *command, ""]


def tuned_section(ckpt: Path) -> tuple[list[str], int | None]:
    """Markdown lines stating the setting ``drafterkit tune`` recorded in ``ckpt/decoding.json`` (per
    concurrency: shape, K, threshold, measured speedup and tau; the machine it holds for), and the batch-size-1
    winner's K (``num_speculative_tokens``); ``([], None)`` when nothing was tuned."""
    tuned = (_read_json(ckpt / DECODING_FILE) or {}).get(TUNED)
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
    if "1" in winners and k is None:
        lines += ["", "No setting beat plain decoding at batch size 1 on that machine: the serve commands above do "
                  "not take their K from this search."]
    if k is not None:
        lines += ["", f"The serve commands above use the batch-size-1 winner's K as `num_speculative_tokens` ({k}); "
                  "a tree's K is its depth."]
    return lines + [""], k


def write_model_card(out: Path, fmt: str, kind: str, ckpt: Path, *, target: str | None = None,
                     repo: str | None = None) -> Path:
    """Write ``out/README.md`` for the ``fmt`` export of the ``kind`` drafter folder ``ckpt`` (see the
    module docstring). ``target``: ``--target`` (used when no recipe records one); ``repo``: the Hub repo
    the export is pushed to (named in the serve commands instead of ``out``). Returns the card's path."""
    _, cfg = read_config(ckpt)
    rec = training_record(ckpt)
    rec["quickstart"] = quickstart_record(ckpt)
    shape = measured_shape(rec["quickstart"]["decoding"]) if rec["quickstart"] else None
    target = _section(rec["recipe"], "target").get("name_or_path") or target
    k = shape["k"] if shape else int(_section(rec["recipe"], "eval").get("k") or 5)
    tuned_lines, tuned_k = tuned_section(ckpt)
    if tuned_k:  # a setting drafterkit tune measured wins over the quickstart's measured shape
        k, shape = tuned_k, None
    if kind == "medusa":  # its heads propose at most num_heads tokens
        k = min(k, int(cfg["num_heads"]))
    if kind == "dflash":  # one block drafts at most block_size - 1 tokens
        k = min(k, int(cfg["block_size"]) - 1)
    export_config = _read_json(out / "config.json")
    title = f"{KIND_TITLES[kind]} for `{target}`" if target else KIND_TITLES[kind]
    lines = [_front_matter(fmt, kind, target), f"# {title}", "",
             f"A speculative-decoding drafter trained with drafterkit and exported as "
             f"`{fmt}` from `{ckpt}`. The target verifies every draft token, so the output is the target's own "
             "(greedy: token for token; sampling: in distribution); the drafter only changes the speed.", ""]
    lines += serve_section(fmt, cfg, repo or str(out), target, k, shape) + [""]
    lines += training_section(kind, cfg, rec, export_config)
    lines += tuned_lines
    lines += measured_section(rec, ckpt, target, k)
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path
