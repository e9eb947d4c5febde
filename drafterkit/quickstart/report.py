"""The report of ``drafterkit quickstart`` (``drafterkit.quickstart.run``): ``report.json``, ``report.md``, PNGs and the
closing console summary.

``report.md`` opens with the stage timings and the training summary, then, per benchmark, the headline
speedup over transformers ``generate`` as the product of its measured factors (``speceval.factors``),
the exactness check (outputs identical to plain decoding, in fp32, and in bf16 / fp16 on a CPU where the
engine is bitwise exact; elsewhere how many outputs differ and the speed over those that did not), the
``drafterkit eval`` commands that reproduce the rows, and
each benchmark's full eval report (``speceval.report.render_markdown``).
"""

from __future__ import annotations

import json
from pathlib import Path

from drafterkit.assets.device import busy_note
from drafterkit.speceval import plots, report
from drafterkit.speceval.factors import MODEL_FREE, factors_sentence, interval_words
from drafterkit.train.checkpoint import TrainerState


#: how the report names a dtype
DTYPE_WORDS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def exactness_summary(records: dict, source: str) -> dict:
    """The exactness check over ``{benchmark: eval record}`` (records whose ``exactness`` was checked,
    ``speceval.harness.check_exactness``), pooled over benchmarks by method.

    Returns:
        ``{"source" (which run was checked), "checked", "dtype" (the checked target's, e.g. ``"bfloat16"``),
        "mode" (``speceval.report.mode_words`` of the decoder mode it ran in, ``""`` in fp32), "prompts"
        (compared with plain decoding, all
        benchmarks), "max_new_tokens", "methods": {method: {"identical", "compared"}},
        "mismatched_prompts": {method: [prompt ids]}, "per_benchmark": {benchmark: exactness}}``.
    """
    out = dict(source=source, checked=False, prompts=0, max_new_tokens=None, methods={}, mismatched_prompts={},
               per_benchmark={})
    for bench, rec in records.items():
        ex = rec["exactness"]
        out["per_benchmark"][bench] = ex
        if not ex["checked"]:
            continue
        out["checked"], out["max_new_tokens"] = True, rec["config"]["max_new_tokens"]
        out["dtype"] = (rec.get("machine") or {}).get("dtype", "float32")
        # the decoder's mode the checked rows ran in, where it matters (fp32 is exact in either mode)
        out["mode"] = report.mode_words(rec["config"]) if out["dtype"] != "float32" else ""
        out["prompts"] += ex["prompts_compared"]
        for method, bad in ex["mismatches"].items():
            m = out["methods"].setdefault(method, dict(identical=0, compared=0))
            m["identical"] += ex["prompts_compared"] - bad
            m["compared"] += ex["prompts_compared"]
        for method, ids in ex["mismatched_prompts"].items():
            out["mismatched_prompts"].setdefault(method, []).extend(ids)
    return out


def merge_checks(records: list[dict]) -> dict:
    """One eval record of a benchmark from the fp32 checks of its rows run apart (each drafter in its own tuned
    shape, on the same prompts): the first record, with every record's rows, summary and mismatch counts."""
    if len(records) == 1:
        return records[0]
    out = {**records[0], "summary": list({r["method"]: r for rec in records for r in rec["summary"]}.values())}
    ex = out["exactness"] = {**records[0]["exactness"]}
    for key in ("mismatches", "mismatched_prompts"):
        ex[key] = {m: v for rec in records for m, v in (rec["exactness"].get(key) or {}).items()}
    ex["checked"] = all(rec["exactness"]["checked"] for rec in records)
    return out


def exactness_lines(report_data: dict) -> list[str]:
    """The exactness lines of the report: the fp32 check's count of outputs identical to plain decoding per
    drafter row and, for evals in another dtype, how many measured outputs differ from plain decoding's and
    the speed over the prompts whose text did not diverge."""
    ex = report_data["exactness"]
    if ex["checked"]:
        counts = "; ".join(f"`{m}`: {c['identical']} of {c['compared']} outputs identical"
                           for m, c in ex["methods"].items())
        dtype = DTYPE_WORDS.get(ex.get("dtype") or "float32", ex.get("dtype"))
        lines = [f"- {dtype}{ex.get('mode', '')}, greedy, vs plain decoding token for token ({ex['source']}, "
                 f"{ex['prompts']} prompts x "
                 f"{ex['max_new_tokens']} new tokens at most): {counts}."]
        if any(c["identical"] < c["compared"] for c in ex["methods"].values()):
            lines.append(f"- NOT EXACT: outputs differ from plain decoding in {dtype} (prompts: "
                         f"{ex['mismatched_prompts']}); this is a decoder bug, please report it.")
    else:
        why = {check["reason"] for check in ex["per_benchmark"].values()} or {ex["source"]}
        lines = [f"- exactness not checked ({'; '.join(sorted(why))})."]
    for bench, rec in report_data["evals"].items():
        note = (report.differs_note(rec["exactness"]) + report.same_text_note(rec["exactness"])).removeprefix("; ")
        if note:
            lines.append(f"- {rec['machine']['dtype']} (the measured rows{report.mode_words(rec['config'])}), "
                         f"{bench}: {note}.")
    return lines


def headline_lines(report_data: dict) -> list[str]:
    """Per benchmark, the headline over ``generate`` as the product of its measured factors; the factor an export
    carries to a serving engine (the drafter alone as a chain of K without a draft threshold, vLLM's shape, measured;
    said to be missing where no such row was measured); the drafter alone in drafterkit's own engine where it drafted
    another shape (a tree, a confidence cutoff), each with its 95% interval over prompts; and the drafter alone
    against the stronger of the model-free proposers measured (prompt lookup, suffix decoding: the one with the higher
    tokens/s over plain decoding), paired on the same prompts: faster or slower beyond the noise, or level within
    it."""
    lines = []
    for bench, rec in report_data["evals"].items():
        lines += [f"- {bench}: {s}" for s in factors_sentence(rec.get("factors") or [])]
        factors = rec.get("factors") or []
        alone = [r for r in factors if r["factor"] == "drafter" and r["ratio"] is not None][:1]
        lines += carried_lines(bench, factors)
        free = {}  # the first reference row of each model-free proposer (one per name; groups repeat them)
        for r in factors:
            if r["factor"] in MODEL_FREE and r["ratio"] is not None:
                free.setdefault(r["factor"], r)
        strongest = max(free.values(), key=lambda r: r["ratio"], default=None)
        for a in alone if strongest is not None else []:
            n = strongest
            vs = n.get("drafter_over") or dict(ratio=a["ratio"] / n["ratio"], interval=None)
            same = n.get("shape") == (a.get("shape") or "").split(", confidence cutoff")[0]
            shape = "same shape" if same or not n.get("shape") else f"drafting a {n['shape']}"
            other = [f"{FREE_WORDS[r['factor']]} {r['ratio']:.2f}x" for r in free.values() if r is not n]
            which = f"the stronger model-free proposer measured, {FREE_WORDS[n['factor']]}" if other else \
                FREE_WORDS[n["factor"]]
            lines.append(f"- {bench}: against {which} alone (`{n['factor']}`, untrained, {shape}: "
                         f"{n['ratio']:.2f}x the engine's plain decoding{'; ' + ', '.join(other) if other else ''}), "
                         f"the drafter alone{_in_shape(a, factors)} is {vs['ratio']:.2f}x"
                         f"{_interval(vs['interval'])}: {_verdict(vs, FREE_WORDS[n['factor']])}")
    return lines


def carried_lines(bench: str, factors: list[dict]) -> list[str]:
    """The factor ``drafterkit export`` carries (``speceval.factors``: the row marked ``export``, a chain of K
    without a draft threshold), and the drafter alone in drafterkit's own engine where it drafted another shape."""
    carried = next((r for r in factors if r["export"] and r["ratio"] is not None), None)
    own = next((r for r in factors if r["factor"] == "drafter" and not r["export"] and r["ratio"] is not None), None)
    lines = []
    if carried is not None:
        lines.append(f"- {bench}: the drafter alone as vLLM serves it, a {carried['shape']} without a draft "
                     "threshold: the factor `drafterkit export` carries to a serving engine, "
                     f"{carried['ratio']:.2f}x the engine's plain decoding{_interval(carried.get('interval'))}"
                     + (f"; but {carried['serve_problem']}" if carried.get("serve_problem") else ""))
    elif own is not None:
        lines.append(f"- {bench}: the factor `drafterkit export` carries to a serving engine (the drafter alone as a "
                     "chain of K without a draft threshold, what vLLM serves) was not measured: `drafterkit eval "
                     "--served-chain` measures it")
    if own is not None:
        lines.append(f"- {bench}: the drafter alone in drafterkit's own engine, drafting a {own['shape']} (a shape "
                     f"vLLM does not serve): {own['ratio']:.2f}x the engine's plain decoding"
                     f"{_interval(own.get('interval'))}")
    return lines


def _in_shape(row: dict, factors: list[dict]) -> str:
    """`` (tree 3,2,1,1,1, ...)`` after "the drafter alone" where the report also gives it in another shape."""
    other = any(r["export"] and r is not row for r in factors)
    return f" ({row['shape']})" if other and row.get("shape") else ""


def _interval(interval: list[float] | None) -> str:
    return f" (95% interval over the prompts {interval_words(interval)})" if interval else ""


#: the model-free proposers in words (``speceval.factors.MODEL_FREE``)
FREE_WORDS = {"ngram": "prompt lookup", "rest": "prompt lookup + retrieval", "suffix": "suffix decoding"}


def _verdict(vs: dict, over: str = "lookup") -> str:
    """Whether a drafter-over-lookup ratio says the training paid for itself, judged by its interval when it
    has one (:func:`speceval.factors.ratio_interval`)."""
    lo, hi = vs["interval"] or (vs["ratio"], vs["ratio"])
    if lo > 1:
        return "faster" + (", beyond the noise" if vs["interval"] else "")
    if hi < 1 or not vs["interval"]:
        return ("slower" if hi < 1 else "not faster") + ", so at this budget the training has not yet paid for " \
            f"itself over {over}"
    return "level with it within the noise (the interval spans 1)"


#: steps the report's loss figures average over (one step's loss at batch 1 moves by tens of percent)
LOSS_WINDOW = 50


def loss_words(losses: list[float] | None) -> str:
    """``"loss 9.81 (mean of the last 50 steps; first 50: 14.2)"``: means over :data:`LOSS_WINDOW` steps at each
    end of the run (fewer when the run made fewer), or ``"no optimizer step"``; ``None``: not recorded."""
    if losses is None:
        return "its losses not recorded (measured again with --no-train)"
    if not losses:
        return "no optimizer step"
    n = min(LOSS_WINDOW, len(losses))
    last = sum(losses[-n:]) / n
    if len(losses) < 2 * n:
        return f"loss {last:.4f} (mean of the last {n} steps)"
    return f"loss {last:.4f} (mean of the last {n} steps; first {n}: {sum(losses[:n]) / n:.4f})"


def write_report(out: Path, report_data: dict) -> dict:
    """Write ``report.json``, ``report.md`` and the PNGs into ``out``; returns their paths."""
    pngs = [str(p) for p in plots.plot_eval_summary({b: r["summary"] for b, r in report_data["evals"].items()},
                                                     out)]
    if report_data["train"]["losses"]:
        pngs.append(str(plot_losses(report_data["train"]["losses"], out / "train_loss.png")))
    report_data["artifacts"] = dict(json=str(out / "report.json"), markdown=str(out / "report.md"), plots=pngs)
    lines = ["# drafterkit quickstart", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {secs:.1f} |" for name, secs in report_data["timings"].items()]
    tr = report_data["train"]
    lines += ["", f"Trained `{tr['kind']}` from `{tr['recipe']}`: {tr['global_step']} optimizer steps, stopped by "
              f"{tr['stopped']}, {loss_words(tr['losses'])}; evaluated `{tr['checkpoint']}`.", ""]
    for bench, ev in report_data["evals"].items():
        if note := busy_note(ev.get("machine") or {}):
            lines += [f"**Busy machine** ({bench}): {note}.", ""]
    if tuned := report_data.get("tuned"):
        rest, free = report_data.get("tuned_rest"), report_data.get("tuned_free") or {}
        seconds = sum(r["search"]["seconds"] for r in (tuned, rest, *free.values()) if r)
        runs = "two searches, the drafter alone and behind prompt lookup + retrieval, each of " if rest else ""
        then = (f", then {' and '.join(f'`{s}`' for s in free)} alone, "
                f"{next(iter(free.values()))['search']['candidates']} candidates each" if free else "")
        lines += ["## Decoding shape", "", f"`drafterkit tune` ({runs}{tuned['search']['candidates']} candidates"
                  f"{then}, {tuned['prompts']['count']} {tuned['prompts']['benchmark']} prompts x "
                  f"{tuned['prompts']['max_new_tokens']} new tokens, {seconds:.0f} s): {tuned['note']}.", ""]
    if heads := headline_lines(report_data):
        lines += ["## Where the speedup comes from", "", *heads, "",
                  "Each factor is a ratio of two tokens/s measured in the same run (tables below).", ""]
    lines += ["## Exactness", "", *exactness_lines(report_data), ""]
    rep = report_data["reproduce"]
    lines += ["## Reproduce the eval rows", "", f"The decoding settings are recorded in `{rep['decoding_json']}`, "
              "which `drafterkit eval --drafter` reads when its flags do not say otherwise.", "", "```bash",
              *rep["commands"], "```", ""]
    for rec in report_data["evals"].values():
        lines.append(report.render_markdown(rec).replace("# drafterkit eval:", "## eval:", 1))
    lines += [f"![{Path(p).stem}]({Path(p).name})" for p in pngs]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    report.write_json(out / "report.json", report_data)
    return report_data["artifacts"]


def plot_losses(losses: list[float], path: Path) -> Path:
    """``train_loss.png``: the mean loss of every optimizer step (faint) and its running mean over the last
    :data:`LOSS_WINDOW` steps (the trend the per-step noise hides)."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, alpha=0.35, linewidth=0.8, label="per step")
    n = min(LOSS_WINDOW, len(losses))
    running = [sum(losses[max(0, i - n + 1):i + 1]) / (i + 1 - max(0, i - n + 1)) for i in range(len(losses))]
    ax.plot(steps, running, linewidth=1.6, label=f"mean of the last {n} steps")
    plots.outside_legend(ax)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss")
    ax.grid(alpha=0.3)
    return plots.save_figure(fig, path)


def print_summary(report_data: dict, paths: dict) -> None:
    """The quickstart's closing lines: the headline factors, exactness, the commands that reproduce the
    eval rows, and where the report is."""
    if tuned := report_data.get("tuned"):
        print(f"\ndecoding shape: {tuned['note']}")
    print("\nwhere the speedup comes from (ratios of tokens/s measured side by side):")
    print("\n".join(line.replace("`", "") for line in headline_lines(report_data)) or "- (no headline row)")
    print("exactness:")
    print("\n".join(line.replace("`", "") for line in exactness_lines(report_data)))
    rep = report_data["reproduce"]
    print(f"reproduce the eval rows (decoding settings also recorded in {rep['decoding_json']}):")
    print("\n".join(f"  {c}" for c in rep["commands"]))
    timings = ", ".join(f"{n} {s:.0f}s" for n, s in report_data["timings"].items())
    print(f"quickstart report: {paths['markdown']} ({timings})")


def drop_report(out: Path) -> None:
    """Delete the report an earlier quickstart wrote in ``out`` (``report.json``, ``report.md`` and the plots
    ``report.json`` lists): with ``--overwrite`` it would describe a training that no longer exists."""
    try:
        plots = json.loads((out / "report.json").read_text()).get("artifacts", {}).get("plots", [])
    except (OSError, ValueError, AttributeError):
        plots = []
    for path in [out / "report.json", out / "report.md", *(Path(p) for p in plots)]:
        path.unlink(missing_ok=True)


def earlier_training(out: Path, recipe) -> dict:
    """The training summary of the quickstart that trained ``out``: its ``report.json``'s when that report
    measured the same step, else rebuilt from the checkpoint's ``trainer_state.json`` (``losses`` None: a
    checkpoint does not keep them)."""
    state = TrainerState.from_json((recipe.paths.last / "trainer_state.json").read_text())
    try:
        earlier = json.loads((out / "report.json").read_text()).get("train") or {}
    except (OSError, ValueError):
        earlier = {}
    if earlier.get("global_step") == state.global_step:
        return earlier
    return dict(recipe=str(recipe.paths.last / "recipe.yaml"), kind=recipe.drafter.kind,
                output_dir=str(recipe.output_dir), checkpoint=str(recipe.paths.last), global_step=state.global_step,
                stopped="the end of its earlier run", losses=None, final_loss=None, best_score=state.best_score,
                in_loop_evals=[], signal=None)
