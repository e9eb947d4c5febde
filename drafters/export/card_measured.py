"""The Measured section of the model card (:mod:`drafters.export.model_card`): the numbers recorded for the very
weights exported, in this order: the ``drafterkit quickstart`` report the drafter folder's ``decoding.json``
names (:func:`quickstart_record`, used while the folder still holds the weights whose sha256 it records: per
benchmark, tau, acceptance, per-position acceptance with ``(n=...)`` where few proposals reached a position,
and the drafter alone over the engine's plain decoding as vLLM serves it, a chain of K without a draft threshold, the
factor an export carries; the drafter in drafterkit's own shape (a tree, a confidence cutoff) and the prompt lookup +
retrieval figure apart, as not carried), else the evaluation recorded during training, else "Not measured"
and the ``drafterkit eval`` command that measures it. Also the measured decoding shape (:func:`measured_shape`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from drafterkit.assets.device import busy_note
from drafterkit.assets.records import FEW_PROPOSALS, position_rates
from drafterkit.drafters.base import weights_sha256
from drafterkit.drafters.export.portable import scrubbed, shown_path


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
    decoding = read_json(ckpt / "decoding.json")
    if not decoding or not decoding.get("report"):
        return None
    try:
        if decoding.get("weights_sha256") and decoding["weights_sha256"] != weights_sha256(ckpt):
            return None  # trained further or replaced since the quickstart measured it
    except OSError:
        return None
    candidates = [Path(decoding["report"])] + ([ckpt.parents[3] / "report.json"] if len(ckpt.parents) > 3 else [])
    for i, path in enumerate(candidates):
        rep = read_json(path)
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
    # a static tree's depth is its number of levels; a dynamic tree's (dynamic:TOTAL:DEPTH:TOPK) is the K
    # recorded with it (drafterkit tune records a tree's depth as its K)
    static = tree is not None and not tree.startswith("dynamic")
    k = len(tree.split(",")) if static else int(decoding.get("k") or 5)
    return dict(tree=tree, k=k, threshold=next(iter(decoding.get("draft_thresholds") or []), 0.0))


def served_chain(ckpt: Path) -> dict | None:
    """The chain a serving engine runs, as ``drafterkit tune`` measured it for the drafter folder ``ckpt`` (its
    ``decoding.json`` ``tuned`` table): among the chains at batch size 1 without a draft threshold (engines have
    none), the one measured furthest into the search (the latest rung), fastest there; ``{"k", "tau", "speedup",
    "batches"}``, or None when tune measured no such chain."""
    tuned = (read_json(ckpt / "decoding.json") or {}).get("tuned")
    table = tuned.get("table") if isinstance(tuned, dict) else None
    rows = [r for r in table or [] if isinstance(r, dict) and r.get("tree") == "chain" and r.get("concurrency") == 1
            and not r.get("draft_threshold") and isinstance(r.get("k"), int)
            and all(isinstance(r.get(x), (int, float)) for x in ("tau", "speedup"))]
    if not rows:
        return None
    best = max(rows, key=lambda r: (r.get("rung") or 0, r["speedup"]))
    return dict(k=best["k"], tau=float(best["tau"]), speedup=float(best["speedup"]), batches=best.get("batches"))


def tree_words(tree: str, depth: int) -> str:
    """``the static draft tree `3,2,1` (branching factors per depth, depth 3)`` or, for ``dynamic:...``, the
    EAGLE-2 dynamic tree."""
    if tree.startswith("dynamic"):
        return f"the EAGLE-2 dynamic draft tree `{tree}` (grown per round from the drafter's confidence, depth {depth})"
    return f"the static draft tree `{tree}` (branching factors per depth, depth {depth})"


def recipe_section(recipe: dict | None, name: str) -> dict:
    value = (recipe or {}).get(name)
    return value if isinstance(value, dict) else {}


def eval_command(ckpt: Path, target: str | None, k: int) -> str:
    """The ``drafterkit eval`` line that measures the checkpoint at ``ckpt`` (tau, acceptance, tokens/s and
    the speedup over plain decoding, on MT-bench); ``TARGET`` stands for a target nothing recorded."""
    tgt = f" --target {shlex.quote(scrubbed(target))}" if target else " --target TARGET"
    return f"drafterkit eval{tgt} --drafter {shlex.quote(shown_path(ckpt))} --benchmark mt-bench --k {k}"


def _pct(values, reached=None) -> str:
    """Per-position acceptance (``assets.records.position_rates``): ``-`` at a position no proposal reached,
    ``(n=...)`` after a rate few proposals reached (``reached``: the proposals per position)."""
    return position_rates(values, reached, sep=", ", spec="{:.3f}")


def _fmt(value, spec: str = "{:.2f}") -> str:
    return spec.format(value) if isinstance(value, (int, float)) else "-"


def _spread(interval) -> str:
    # the 95% interval over the eval's prompts (speceval.factors.ratio_interval), where the report has one
    return f"; 95% interval {interval[0]:.2f}-{interval[1]:.2f}x" if interval else ""


def served_shape(factor: dict) -> bool:
    """Whether a factor row (``speceval.factors``) measured the shape a serving engine drafts: a chain of K without a
    confidence cutoff (reports written before the ``served`` row marked a tree row as carried too)."""
    shape = factor.get("shape") or ""
    return shape.startswith("chain of") and "cutoff" not in shape


def quickstart_section(qs: dict) -> list[str]:
    """Markdown lines: the ``drafterkit quickstart`` measurement (:func:`quickstart_record`): per benchmark the
    drafter alone as vLLM serves it, a chain of K without a draft threshold (the factor an export carries: tau,
    acceptance, per-position acceptance, its speed over the engine's plain decoding), then, labelled as not carried,
    the drafter in drafterkit's own shape (a tree, a cutoff) and behind prompt lookup + retrieval. A report that
    measured no such chain gets a table of none and says so."""
    rows, extra, own_lines, setup = [], [], [], None
    for bench, ev in qs["report"]["evals"].items():
        factors = ev.get("factors") or []
        alone = next((f for f in factors if f.get("export") and served_shape(f)), None)
        own = next((f for f in factors if f.get("factor") == "drafter" and f is not alone), None)
        summary = {r["method"]: r for r in ev.get("summary") or []}
        if own is not None and own.get("ratio") is not None:
            own_lines.append(f"- {bench}: `{scrubbed(own['method'])}` ({own.get('shape') or '?'}): "
                             f"{_fmt(own['ratio'])}x the engine's plain decoding{_spread(own.get('interval'))}.")
        setup = setup or ev
        row = summary.get(alone["method"]) if alone else None
        if row is None:
            continue
        rows.append(f"| {bench} | {row.get('prompts', '?')} x {ev['config'].get('max_new_tokens', '?')} | "
                    f"{row.get('k', '?')} | {_fmt(row.get('tau'), '{:.3f}')} | "
                    f"{_fmt(row.get('acceptance_rate'), '{:.3f}')} | "
                    f"{_pct(row.get('accept_per_position'), row.get('reached_per_position'))} | "
                    f"{_fmt(alone['ratio'])}x "
                    f"({_fmt(alone['tokens_per_s'], '{:.1f}')} vs {_fmt(alone['over_tokens_per_s'], '{:.1f}')} "
                    f"tokens/s{_spread(alone.get('interval'))}) |")
        group = [f for f in factors if f.get("group") == alone.get("group")]
        spec = next((f for f in group if f["factor"] == "speculation"), None)
        e2e = next((f for f in group if f["factor"] == "end to end"), None)
        if spec is not None:
            extra.append(f"- {bench}: `{scrubbed(spec['method'])}`: {_fmt(spec['ratio'])}x the engine's plain decoding"
                         + (f", {_fmt(e2e['ratio'])}x transformers `generate` end to end" if e2e else "") + ".")
    if setup is None:
        return []
    return _quickstart_lines(qs, setup, rows, own_lines, extra)


def _quickstart_lines(qs: dict, setup: dict, rows: list[str], own_lines: list[str], extra: list[str]) -> list[str]:
    """The Measured section's lines around :func:`quickstart_section`'s table rows."""
    dec = qs["decoding"]
    mach, cfg = setup.get("machine") or {}, setup.get("config") or {}
    lines = ["## Measured", "",
             f"Measured by `drafterkit quickstart` with drafterkit's decoder (exact verification, greedy), recorded "
             f"in `{shown_path(qs['source'])}`. The drafter alone as vLLM serves it (a chain of K draft tokens, no "
             "draft threshold), against plain decoding through the same engine in the same run: the factor "
             "`drafterkit export` carries to a serving engine.", ""]
    if rows:
        lines += ["| benchmark | prompts x new tokens | K | tau (bonus included) | acceptance rate | acceptance per "
                  f"draft position (`-`: no proposal reached it; `(n=...)`: fewer than {FEW_PROPOSALS} did) | speed "
                  "vs plain decoding |", "|---|---|---|---|---|---|---|", *rows, ""]
    else:
        lines += ["**Not measured as served**: this quickstart measured the drafter in drafterkit's own shape only "
                  "(below), not as a chain of K without a draft threshold; `drafterkit eval --served-chain` with the "
                  "commands under Reproduce measures it.", ""]
    lines += [f"- Temperature {cfg.get('temperature', 0.0)}, dtype {dec.get('dtype', '?')}.",
              f"- Machine: {mach.get('device', '?')}, {mach.get('cpu_count', '?')} CPUs, {mach.get('threads', '?')} "
              f"threads, torch {mach.get('torch', '?')}, transformers {mach.get('transformers', '?')}."]
    if note := busy_note(mach):
        lines.append(f"- **Busy machine**: {note}.")
    shape = measured_shape(dec)
    if own_lines and shape:
        drafted = (tree_words(shape["tree"], shape["k"]) if shape["tree"] else f"chains of {shape['k']} draft "
                   "tokens") + (f", draft threshold {shape['threshold']:g}" if shape["threshold"] else "")
        lines += ["", f"**Not carried by this export**: drafterkit's own decoder drafting {drafted} (a shape the "
                  "engines do not serve), the same drafter alone:", "", *own_lines]
    if extra:
        lines += ["", "**Not carried by this export**: drafterkit's decoder also measured the drafter behind "
                  "prompt lookup and retrieval from ShareGPT (`+rest`), which serving engines do not run with it:",
                  "", *extra]
    commands = [scrubbed(c) for c in dec.get("commands") or [] if isinstance(c, str)]
    if commands:
        lines += ["", "Reproduce (the same rows, side by side with plain decoding):", "", "```bash", *commands, "```"]
    return lines + [""]


def measured_section(rec: dict, ckpt: Path, target: str | None, k: int) -> list[str]:
    """Markdown lines: the recorded evaluation of these weights (the quickstart's first, :func:`quickstart_section`),
    else "Not measured" and the command."""
    if rec.get("quickstart") and (lines := quickstart_section(rec["quickstart"])):
        return lines
    ev, ev_cfg = rec["eval"], recipe_section(rec["recipe"], "eval")
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
             f"{recipe_section(rec['recipe'], 'target').get('dtype', '?')}")
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
