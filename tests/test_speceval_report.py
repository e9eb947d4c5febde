"""Sweep / concurrency outputs of ``drafterkit eval``: PNGs that are real images, a Markdown table whose
rows are the JSON rows, speedups that are ratios of measurements in the same JSON."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_llama

from drafterkit.assets.console import make_console
from drafterkit.assets.pinned import default_target_dir
from drafterkit.assets.records import FEW_PROPOSALS
from drafterkit.cli import main
from drafterkit.speceval import factors, plots, report
from drafterkit.speceval.harness import check_exactness

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_record(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("sweep")
    tiny_llama(0, vocab_size=49152, hidden_size=32).save_pretrained(root / "tiny")
    AutoTokenizer.from_pretrained(default_target_dir()).save_pretrained(root / "tiny")
    out = root / "out" / "sweep.json"
    rc = main(["eval", "--target", str(root / "tiny"), "--drafter", "ngram", "--drafter", "draft:1",
               "--benchmark", "mt-bench", "--num-prompts", "2", "--max-new-tokens", "8", "--device", "cpu",
               "--baselines", "engine,hf", "--sweep", "--sweep-k", "1,3", "--sweep-temperature", "0,1",
               "--concurrency", "1,2", "--no-progress", "--output", str(out)])
    assert rc == 0
    return json.loads(out.read_text()), out


def test_sweep_pngs_are_valid_images(sweep_record):
    import matplotlib.image as mpimg

    rec, _ = sweep_record
    names = sorted(p.rsplit("/", 1)[-1] for p in rec["artifacts"]["plots"])
    assert names == sorted(["acceptance_vs_k.png", "tokens_per_s_vs_k.png", "speedup_vs_acceptance.png",
                            "acceptance_per_position.png", "drafter_economics.png", "concurrency.png"])
    for p in rec["artifacts"]["plots"]:
        with open(p, "rb") as f:
            assert f.read(8) == PNG_SIGNATURE
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0


def test_sweep_markdown_rows_match_json(sweep_record):
    rec, out = sweep_record
    rows = rec["sweep"]["rows"]
    cats = {p["category"] for p in rec["prompts"]}
    assert len(cats) == 2  # two MT-bench prompts -> two categories (balanced selection)
    assert {(r["drafter"], r["k"], r["temperature"], r["category"]) for r in rows} == {
        (d, k, t, c) for d in ("ngram", "draft:1") for k in (1, 3) for t in (0.0, 1.0) for c in cats | {"all"}}
    parsed = report.parse_markdown_table(out.with_suffix(".md").read_text(), heading="Sweep")
    assert len(parsed) == len(rows)
    for got, row in zip(parsed, rows):
        for header, key, spec in report.SWEEP_COLUMNS:
            assert got[header] == report.fmt(row[key], spec), (header, got, row)


def test_sweep_speedups_are_ratios_of_measurements_in_the_json(sweep_record):
    rec, _ = sweep_record
    runs = rec["sweep"]["runs"]
    for row in rec["sweep"]["rows"]:
        sel = [r for r in runs if r["temperature"] == row["temperature"]
               and (row["category"] == "all" or r["category"] == row["category"])]
        spec = [r for r in sel if r["role"] == "spec" and r["drafter"] == row["drafter"] and r["k"] == row["k"]]
        plain = [r for r in sel if r["role"] == "plain"]
        tps = sum(r["new_tokens"] for r in spec) / sum(r["wall_s"] for r in spec)
        plain_tps = sum(r["new_tokens"] for r in plain) / sum(r["wall_s"] for r in plain)
        assert row["tokens_per_s"] == pytest.approx(tps) and row["engine_tokens_per_s"] == pytest.approx(plain_tps)
        assert row["speedup_vs_engine"] == pytest.approx(tps / plain_tps)
        assert len(row["accept_per_position"]) <= row["k"]
        dv = sum(r["stats"]["draft_time_s"] + r["stats"]["verify_time_s"] for r in spec)
        assert row["accepted_per_dv_s"] == pytest.approx(sum(r["stats"]["accepted"] for r in spec) / dv)
    greedy_one = [r for r in rec["sweep"]["rows"] if r["k"] == 1 and r["category"] == "all"]
    assert all(len(r["accept_per_position"]) == 1 for r in greedy_one)


def test_concurrency_rows_batch_prompts_together(sweep_record):
    rec, out = sweep_record
    rows = {(r["concurrency"], r["method"]): r for r in rec["concurrency"]["rows"]}
    assert set(rows) == {(c, m) for c in (1, 2) for m in ("engine", "ngram", "draft:1")}
    assert {r["rows"] for r in rec["concurrency"]["runs"] if r["concurrency"] == 2} == {2}
    for (c, m), row in rows.items():
        assert row["speedup_vs_plain"] == pytest.approx(row["tokens_per_s"] / rows[(c, "engine")]["tokens_per_s"])
        assert row["tpot_ms"] > 0
    parsed = report.parse_markdown_table(out.with_suffix(".md").read_text(), heading="Concurrency")
    assert [(int(p["concurrency"]), p["method"]) for p in parsed] == [(r["concurrency"], r["method"])
                                                                       for r in rec["concurrency"]["rows"]]


def test_aggregate_pools_counts_not_means():
    stats = dict(committed=9, target_forwards=4, drafted=8, accepted=4, tau=2.0, acceptance_rate=0.5,
                 accept_per_position=[0.75, 1 / 3], draft_time_s=0.5, verify_time_s=1.5, total_time_s=2.5,
                 ttft_s=0.5, tokens_per_s=3.6, tpot_ms=250.0)
    other = dict(stats, committed=5, target_forwards=4, drafted=8, accepted=0, tau=1.0, acceptance_rate=0.0,
                 accept_per_position=[0.0, 0.0], total_time_s=1.0, ttft_s=0.2)
    runs = [dict(method="m", new_tokens=9, wall_s=3.0, stats=stats), dict(method="m", new_tokens=5, wall_s=4.0,
                                                                          stats=other)]
    agg = report.aggregate(runs)
    assert agg["tokens_per_s"] == pytest.approx(14 / 7.0)  # total tokens / total seconds, not a mean of ratios
    assert agg["tau"] == pytest.approx((8 + 4) / 8) and agg["acceptance_rate"] == pytest.approx(4 / 16)
    assert agg["accept_per_position"] == pytest.approx([3 / 8, 1 / 3])
    assert agg["tpot_ms"] == pytest.approx(1000 * (2.0 + 0.8) / (14 - 2))
    assert agg["accepted_per_dv_s"] == pytest.approx(4 / 4.0)


def test_parse_markdown_table_errors_name_the_problem():
    with pytest.raises(ValueError, match="no Markdown table"):
        report.parse_markdown_table("just text\n")
    with pytest.raises(ValueError, match="no '## Sweep' heading"):
        report.parse_markdown_table("| a |\n|---|\n| 1 |\n", heading="Sweep")
    assert report.parse_markdown_table("| a | b |\n|---|---|\n| 1 | x |\n") == [{"a": "1", "b": "x"}]


def test_positions_no_proposal_reached_print_as_a_dash_not_zero():
    """The record keeps 0.0 (decoder contract) and the reached counts; the tables tell 'never reached'
    apart from 'reached, never accepted'."""
    stats = dict(committed=6, target_forwards=4, drafted=6, accepted=1, tau=1.25, acceptance_rate=1 / 6,
                 accept_per_position=[0.25, 0.0, 0.0], reached_per_position=[4, 2, 0], draft_time_s=0.1,
                 verify_time_s=0.4, total_time_s=0.6, ttft_s=0.1, tokens_per_s=10.0, tpot_ms=100.0)
    row = dict(report.aggregate([dict(method="m", new_tokens=6, wall_s=0.6, stats=stats)]), method="m")
    assert row["accept_per_position"] == [0.25, 0.0, 0.0] and row["reached_per_position"] == [4, 2, 0]
    # a rate resting on fewer than FEW_PROPOSALS proposals carries its count
    assert report.cell(row, "accept_per_position") == "0.25 (n=4) 0.00 (n=2) -"
    many = dict(row, reached_per_position=[FEW_PROPOSALS, FEW_PROPOSALS - 1, 0])
    assert report.cell(many, "accept_per_position") == f"0.25 0.00 (n={FEW_PROPOSALS - 1}) -"
    md = report.markdown_table([many], [("method", "method", "{}"), ("per-position", "accept_per_position", "{}")])
    assert f"| m | 0.25 0.00 (n={FEW_PROPOSALS - 1}) - |" in md


def test_small_samples_carry_a_noise_note_in_the_markdown(sweep_record):
    sweep_record, _ = sweep_record
    """The eval says when a method measured too few tokens for its tokens/s ratios to mean much."""
    small = report.small_sample_note(sweep_record)
    counts = [r["new_tokens"] for r in sweep_record["summary"]]
    assert (small is not None) == (min(counts) < report.SMALL_SAMPLE_TOKENS)
    assert (("Note: only" in report.render_markdown(sweep_record)) == (small is not None))
    big = dict(sweep_record, summary=[dict(r, new_tokens=report.SMALL_SAMPLE_TOKENS) for r in sweep_record["summary"]])
    assert report.small_sample_note(big) is None and "Note: only" not in report.render_markdown(big)
    tiny = dict(sweep_record, summary=[dict(r, new_tokens=32) for r in sweep_record["summary"]])
    assert "only 32 new tokens" in report.small_sample_note(tiny)


def test_markdown_eval_table_does_not_repeat_the_method_as_drafter(sweep_record):
    """Every method already names its drafter (``X``, ``X [hf-assisted]``; references run none), so the
    Markdown table leaves the ``drafter`` column out; the JSON rows keep both keys."""
    rec, _ = sweep_record
    assert all({"method", "drafter"} <= set(r) for r in rec["summary"])
    assistant = dict(rec["summary"][0], method="draft:1 [hf-assisted]", drafter="draft:1", role="hf-assisted")
    for summary in (rec["summary"], rec["summary"] + [assistant]):
        md = report.render_markdown(dict(rec, summary=summary))
        table = report.parse_markdown_table(md)
        assert "drafter" not in table[0] and {r["method"] for r in table} == {r["method"] for r in summary}
        assert "| ngram | ngram |" not in md
    # a record whose method does not name its drafter keeps the column
    renamed = [dict(r, method="mine") if r["drafter"] == "ngram" else r for r in rec["summary"]]
    table = report.parse_markdown_table(report.render_markdown(dict(rec, summary=renamed)))
    assert {(r["method"], r["drafter"]) for r in table} >= {("mine", "ngram"), ("engine", "none")}


def test_tree_rows_show_their_tree_not_a_k_that_did_not_apply(sweep_record):
    import io

    rec, _ = sweep_record
    ngram = next(r for r in rec["summary"] if r["method"] == "ngram")
    tree = dict(ngram, method="ngram tree=3,2,1,1,1", drafter="ngram tree=3,2,1,1,1", k=5)
    record = dict(rec, summary=[tree] + rec["summary"], config=dict(rec["config"], trees=["3,2,1,1,1", "chain"]))
    table = {r["method"]: r for r in report.parse_markdown_table(report.render_markdown(record))}
    assert "K" not in table["ngram"]
    assert table["ngram tree=3,2,1,1,1"]["drafts"] == "tree 3,2,1,1,1"
    assert table["ngram"]["drafts"] == f"chain of {ngram['k']}" and table["engine"]["drafts"] == "-"
    assert "trees: 3,2,1,1,1, chains of K: " in report.render_markdown(record)
    buf = io.StringIO()
    report.print_eval(record["summary"], "eval", console=make_console(file=buf))
    line = next(ln for ln in buf.getvalue().splitlines() if "tree=3,2,1,1,1" in ln)
    assert "tree 3,2,1,1,1" in line and " 5 " not in line.split("tree 3,2,1,1,1")[1][:12]


def test_console_tables_wrap_long_drafter_names_instead_of_cutting_them():
    """Two checkpoints whose labels differ only at the end stay distinguishable on a narrow console."""
    import io

    from rich.console import Console

    names = ["eagle3:some/long/run/name/checkpoints/last-A", "eagle3:some/long/run/name/checkpoints/last-B"]
    rows = [dict(drafter=n, k=5, temperature=0.0, category="all", tau=1.5, acceptance_rate=0.3) for n in names]
    buf = io.StringIO()
    Console(file=buf, width=60).print(report.rich_table("sweep", rows, report.SWEEP_COLUMNS))
    body = [ln for ln in buf.getvalue().splitlines() if ln.startswith("│")]
    first_column = "".join(ln.split("│")[1].strip() for ln in body)
    assert first_column == names[0] + names[1]


def _row(role, method, tps):
    return dict(role=role, method=method, drafter="none" if role in ("plain", "hf") else method, tokens_per_s=tps)


def _prompts(*pairs):
    return [[i, t, w] for i, (t, w) in enumerate(pairs)]


def test_a_tau_ratio_s_interval_pairs_the_prompts_and_pools_committed_tokens_over_passes():
    """paired_interval is the ratio of two pooled rates over the same resampled prompts: tau (committed tokens over
    verification passes) of one drafter over another's, as benchmarks/objective_ablation.py reports it."""
    first = {0: (100, 80), 1: (120, 100), 2: (90, 70), 3: (110, 90)}
    assert factors.paired_interval(first, first) == pytest.approx([1.0, 1.0])
    longer = {p: (c * 1.1, n) for p, (c, n) in first.items()}  # 10% more tokens per pass on every prompt
    assert factors.paired_interval(longer, first) == pytest.approx([1.1, 1.1])
    mixed = {0: (130, 80), 1: (110, 100), 2: (100, 70), 3: (100, 90)}
    lo, hi = factors.paired_interval(mixed, first)
    pooled = (440 / 340) / (420 / 340)
    assert lo < pooled < hi and lo < 1.0 < hi  # one prompt carries the lead: the interval spans 1
    assert factors.paired_interval({0: (1, 1)}, {0: (1, 1), 1: (2, 2)}) is None  # one shared prompt


def test_a_factor_s_interval_is_a_paired_bootstrap_over_the_prompts_both_rows_decoded():
    den = dict(per_prompt=_prompts((10, 1.0), (20, 2.0), (30, 2.0), (40, 5.0)))
    steady = dict(per_prompt=[[i, 2 * t, w] for i, t, w in den["per_prompt"]])  # twice as fast on every prompt
    assert factors.ratio_interval(steady, den) == pytest.approx([2.0, 2.0])
    uneven = dict(per_prompt=_prompts((10, 0.5), (20, 2.0), (60, 2.0), (40, 2.5)))
    lo, hi = factors.ratio_interval(uneven, den)
    pooled = (130 / 7.0) / (100 / 10.0)
    assert lo < pooled < hi and lo > 1.0 and hi < 3.0
    assert factors.ratio_interval(uneven, den) == [lo, hi]  # seeded: the same record gives the same interval
    assert factors.ratio_interval(dict(per_prompt=_prompts((1, 1.0))), dict(per_prompt=_prompts((1, 1.0)))) is None
    assert factors.ratio_interval({}, den) is None  # a record written before per_prompt existed
    assert factors.interval_words([0.981, 1.254]) == "0.98-1.25x" and factors.interval_words(None) == "-"
    # summarize_eval keeps what the interval resamples: per prompt, tokens and seconds summed over its runs
    runs = [dict(method="m", prompt=1, new_tokens=5, wall_s=0.5), dict(method="m", prompt=0, new_tokens=3, wall_s=0.2),
            dict(method="m", prompt=1, new_tokens=4, wall_s=0.25)]
    assert factors.per_prompt(runs) == [[0, 3, 0.2], [1, 9, 0.75]]


def test_factor_rows_multiply_to_the_end_to_end_ratio_of_the_same_run():
    """The headline over generate = engine x drafter x lookup, each a ratio of two measured tokens/s; prompt
    lookup alone and speculation over plain decoding are references; what an export carries is the drafter alone as
    vLLM serves it, a chain of K without a draft threshold (a reference beside the tree in the product)."""
    head = "eagle3:train/last+rest@0.1 tree=3,2,1,1,1"
    summary = [_row("spec", "eagle3:train/last@0.1 tree=3,2,1,1,1", 12.7), _row("spec", "ngram tree=3,2,1,1,1", 13.0),
               _row("spec", head, 18.4), _row("spec", "eagle3:train/last+rest@0.2 tree=3,2,1,1,1", 17.0),
               _row("spec", "eagle3:train/last@0.2 tree=3,2,1,1,1", 12.0), _row("plain", "engine", 10.0),
               _row("hf", "hf", 7.1), dict(_row("spec", "eagle3:train/last", 11.0), k=5)]
    rows = factors.headline_factors(summary)
    assert {r["group"] for r in rows} == {head, "eagle3:train/last+rest@0.2 tree=3,2,1,1,1"}
    mine = {r["factor"]: r for r in rows if r["group"] == head}
    assert list(mine) == ["engine", "drafter", "served", "lookup", "ngram", "speculation", "end to end"]
    assert [r["role"] for r in mine.values()] == ["factor", "factor", "reference", "factor", "reference", "subtotal",
                                                  "headline"]
    assert mine["engine"]["ratio"] == pytest.approx(10.0 / 7.1) and mine["drafter"]["ratio"] == pytest.approx(1.27)
    assert mine["lookup"]["ratio"] == pytest.approx(18.4 / 12.7) and mine["ngram"]["ratio"] == pytest.approx(1.3)
    assert mine["end to end"]["ratio"] == pytest.approx(18.4 / 7.1) == mine["end to end"]["product"]
    assert mine["engine"]["ratio"] * mine["drafter"]["ratio"] * mine["lookup"]["ratio"] == pytest.approx(18.4 / 7.1)
    assert all(r["what"] for r in rows) and [r["factor"] for r in rows if r["export"]] == ["served", "served"]
    # the exported factor is the chain of K vLLM serves, measured; the tree stays drafterkit's engine's figure
    assert mine["served"]["ratio"] == pytest.approx(1.1) and mine["served"]["shape"] == "chain of 5"
    assert mine["drafter"]["shape"] == "tree 3,2,1,1,1, confidence cutoff 0.1" and mine["lookup"]["shape"] is None
    assert factors.draft_shape(dict(method="eagle3:train/last", k=5), cutoff=True) == "chain of 5"
    assert factors.draft_shape(dict(method="engine", role="plain", k=0)) == "-"
    tuned = dict(method="eagle3:train/last@0.1 (tuned) tree=3,2,1,1,1", k=5)  # an --tree auto row
    assert factors.draft_shape(tuned, cutoff=True) == "tree 3,2,1,1,1, confidence cutoff 0.1"
    # one table: rows shared by both headlines (engine over generate, prompt lookup alone) shown once
    table = report.parse_markdown_table(report.markdown_table(factors.factor_cells(rows), report.factor_columns(rows)))
    assert [r["factor"] for r in table].count("engine") == 1 and [r["factor"] for r in table].count("ngram") == 1
    ends = [r for r in table if r["factor"] == "end to end"]
    assert [r["headline row"] for r in ends] == [head, "eagle3:train/last+rest@0.2 tree=3,2,1,1,1"]
    assert ends[0]["ratio"] == "2.59x" and ends[0]["in the headline"] == "= engine x drafter x lookup = 2.59x"
    carried = [r["carried by `drafterkit export`"] for r in table if r["factor"] in ("drafter", "served")][:2]
    assert carried == ["no: tree 3,2,1,1,1, confidence cutoff 0.1 is drafterkit's engine only (vLLM serves a chain of "
                       "K)", "yes: the drafter alone as vLLM serves it, measured here as chain of 5"]
    assert [r["factor"] for r in table].count("served") == 1  # the same chain under both headlines, shown once
    # no chain measured: nothing is marked carried (the tree is not what an engine serves)
    assert not any(r["export"] for r in factors.headline_factors([r for r in summary if r.get("k") != 5]))
    assert factors.factors_sentence(rows)[0] == f"{head}: 2.59x over `generate` = 1.41x (engine) x 1.27x (drafter) " \
                                                "x 1.45x (lookup)"
    # without the generate baseline: no engine factor and no headline over generate; without plain: nothing
    assert [r["factor"] for r in factors.headline_factors([r for r in summary if r["role"] != "hf"])][:3] == [
        "drafter", "served", "lookup"]
    assert factors.headline_factors([r for r in summary if r["role"] != "plain"]) == []
    assert report.factor_reference(rows) == "generate"  # the title names what the headline is over
    assert report.factor_reference(factors.headline_factors([r for r in summary if r["role"] != "hf"])) == \
        "the engine's plain decoding"


def test_an_eval_with_baselines_splits_each_drafter_s_speedup_over_generate(sweep_record):
    """Without a drafter behind prompt lookup, the headline of a drafter row is engine x drafter."""
    rec, out = sweep_record
    rows = {(r["group"], r["factor"]): r for r in rec["factors"]}
    summary = {r["method"]: r for r in rec["summary"]}
    assert {g for g, _ in rows} == {"draft:1"}  # prompt lookup alone is a reference, never a headline
    assert rows[("draft:1", "end to end")]["ratio"] == pytest.approx(summary["draft:1"]["speedup_vs_hf"])
    assert rows[("draft:1", "engine")]["ratio"] * rows[("draft:1", "drafter")]["ratio"] == pytest.approx(
        summary["draft:1"]["speedup_vs_hf"])
    assert rows[("draft:1", "ngram")]["ratio"] == pytest.approx(summary["ngram"]["speedup_vs_engine"])
    n = rec["config"]["num_prompts"]
    assert len(summary["draft:1"]["per_prompt"]) == n and all(r["interval"] for r in rec["factors"]) == (n > 1)
    if n > 1:  # every factor's 95% interval over the prompts holds its pooled ratio
        assert all(r["interval"][0] <= r["ratio"] <= r["interval"][1] for r in rec["factors"])
    md = out.with_suffix(".md").read_text()
    assert "Where the speedup of `draft:1` over `generate` comes from" in md
    assert "| drafter | the drafter alone vs the engine's plain decoding, in the shape measured here |" in md


def test_bf16_off_the_cpu_speed_over_prompts_whose_text_did_not_diverge():
    def run(role, method, prompt, ids, wall):
        return dict(role=role, method=method, prompt=prompt, prompt_id=f"p{prompt}", output_ids=ids,
                    new_tokens=len(ids), wall_s=wall)

    runs = [run("plain", "engine", 0, [1, 2, 3, 4], 2.0), run("plain", "engine", 1, [4, 5], 1.0),
            run("spec", "a", 0, [1, 2, 3, 4], 1.0), run("spec", "a", 1, [4, 6], 0.1),
            run("spec", "b", 0, [1, 2, 9, 9], 1.0), run("spec", "b", 1, [4, 6], 1.0)]
    ex = check_exactness(runs, 0.0, torch.bfloat16, "cuda")
    assert ex["differs_from_plain"] == {"a": 1, "b": 2}
    assert ex["same_text"]["a"] == dict(prompts=1, speedup_vs_engine=pytest.approx((4 / 1.0) / (4 / 2.0)))
    assert ex["same_text"]["b"] == dict(prompts=0, speedup_vs_engine=None)
    text = report.exactness_text(ex)
    assert "a: 1 of 2, b: 2 of 2" in text and text.endswith(
        "over the prompts whose text did not diverge, vs plain decoding on the same prompts: a: 2.00x on 1, b: - on 0")
    assert check_exactness(runs, 0.0, torch.float32)["same_text"] is None  # fp32: exactness, not near-ties


def test_acceptance_points_resting_on_few_proposals_are_hollow(tmp_path):
    plt = plots.pyplot()
    fig, ax = plt.subplots()
    hollow = plots.plot_positions(ax, [0.5, 0.4, 0.3, 0.0], [200, 40, 7, 0], "head")
    assert hollow == 1  # position 3 (7 proposals); position 4 (none reached) is left out
    line, few = ax.lines
    assert list(line.get_xdata()) == [1, 2] and list(few.get_xdata()) == [3]  # no line drawn down to a rate of 7
    assert few.get_markerfacecolor() == "white" and few.get_linestyle() == "None"
    assert [t.get_text() for t in ax.texts] == ["n=7"]
    assert plots.plot_positions(ax, [0.5, 0.4], None, "no counts") == 0  # counts unknown: all solid
    plt.close(fig)
    row = dict(role="spec", method="m", tokens_per_s=1.0, accept_per_position=[0.5, 0.2], reached_per_position=[100, 5])
    path = plots.plot_eval_summary({"b": [row]}, tmp_path)[1]
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_each_acceptance_row_has_one_legend_entry_and_whole_counts():
    """A row with solid and hollow points, and one whose points are all hollow (a quickstart's few proposals), each
    get ONE legend entry (before: the hollow markers of the second came in as a second entry of the same label, and
    an empty line of the first as well); pooled counts, floats, are annotated as whole numbers (before: n=5.0)."""
    plt = plots.pyplot()
    fig, ax = plt.subplots()
    plots.plot_positions(ax, [0.5, 0.4, 0.3], [200.0, 40.0, 7.0], "both on mt-bench")
    plots.plot_positions(ax, [0.2, 1.0], [5.0, 2.6], "few on humaneval")
    plots._style_acceptance_axes(ax, 3)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["both on mt-bench", "few on humaneval"]
    assert [t.get_text() for t in ax.texts if t.get_text().startswith("n=")] == ["n=7", "n=5", "n=3"]
    plt.close(fig)


def test_legends_sit_outside_the_data_and_the_loss_plot_shows_its_running_mean(tmp_path, monkeypatch):
    """A legend inside the axes covered bars and points: every legend is placed right of the plotting area, and
    the saved image is wide enough to hold it; the training loss is drawn raw and as a running mean."""
    from drafterkit.quickstart.report import plot_losses

    plt = plots.pyplot()
    fig, ax = plt.subplots()
    ax.bar([0, 1], [3.0, 4.0], label="a")
    plots.outside_legend(ax)
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= axes.x1  # wholly right of the data
    plt.close(fig)
    rows = [dict(method=m, tokens_per_s=t, role="spec", accept_per_position=[0.5], reached_per_position=[50])
            for m, t in (("a", 3.0), ("b", 4.0))]
    png = plots.plot_eval_summary({"mt-bench": rows}, tmp_path)[0]
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    captured, real = [], plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: captured.append(
        [ln.get_label() for ln in fig.axes[0].lines]) or real(fig, path))
    plot_losses([2.0, 1.0] * 60, tmp_path / "loss.png")
    assert captured == [["per step", "mean of the last 50 steps"]]



def test_the_carried_column_says_no_where_vllm_cannot_serve_the_drafter(tmp_path):
    """The row export carries says "no" with vLLM's reason where the target's class has no SupportsEagle3 (it used to
    say "yes: ... as vLLM serves it" while export warned and serve-check refused); the reason is export's own."""
    summary = [_row("plain", "engine", 10.0), _row("hf", "hf", 7.0), dict(_row("spec", "eagle3:run/best", 12.0), k=5)]
    rows = factors.headline_factors(summary, {"eagle3:run/best": "vLLM cannot serve it"})
    cells = {r["factor"]: r["export"] for r in factors.factor_cells(rows)}
    assert cells["drafter"] == "no: vLLM cannot serve it"
    assert factors.factor_cells(factors.headline_factors(summary))[1]["export"].startswith("yes: ")

    from families import save_family

    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
    from drafterkit.drafters.export.model_card import vllm_serve_problem

    model, _ = save_family("gemma3", tmp_path / "gemma3")  # Gemma3ForCausalLM: no SupportsEagle3 in vLLM 0.32
    torch.manual_seed(0)
    head = Eagle3Drafter(Eagle3Config.from_target(model, draft_vocab_size=64), target=model)
    head.set_draft_vocab(torch.arange(64), target=model)
    head.save_pretrained(tmp_path / "head")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "hello world"}) + "\n")
    out = tmp_path / "e.json"
    assert main(["eval", "--target", str(tmp_path / "gemma3"), "--drafter", str(tmp_path / "head"), "--benchmark",
                 str(tmp_path / "p.jsonl"), "--num-prompts", "1", "--max-new-tokens", "4", "--baselines", "engine",
                 "--no-progress", "--device", "cpu", "--output", str(out)]) == 0
    carried = [r for r in json.loads(out.read_text())["factors"] if r["export"]]
    said = vllm_serve_problem("vllm-eagle3", str(tmp_path / "gemma3"))
    assert said.startswith("vLLM 0.32.0 cannot serve an EAGLE-3 head for a Gemma3ForCausalLM target")
    assert len(carried) == 1 and carried[0]["serve_problem"] == said
    assert f"| no: {said} |" in out.with_suffix(".md").read_text()
