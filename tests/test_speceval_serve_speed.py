"""Both engines' speed side by side (``speceval.serve_speed``) and the chain a serving engine drafts, measured by
``drafterkit eval --served-chain`` (``speceval.methods.build_drafters``)."""

from __future__ import annotations

import argparse

import pytest
from conftest import tiny_llama

from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.ngram import NGramDrafter
from drafterkit.serve_check_args import add_arguments
from drafterkit.speceval import methods, serve_speed


def test_served_chain_adds_the_chain_of_k_without_threshold_only_where_none_is_measured(tmp_path):
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    DraftLM.from_target(target, 1).save_pretrained(tmp_path / "run" / "checkpoints" / "last" / "drafter")
    a = str(tmp_path / "run")
    specs = methods.build_drafters([a, f"{a}+ngram", "ngram"], target, [0.1], ["3,2"], served=True)
    labels = [s.label for s in specs]
    assert labels == ["draft_lm:run/last@0.1 tree=3,2", "draft_lm:run/last", "draft_lm:run/last+ngram@0.1 tree=3,2",
                      "ngram tree=3,2"]  # behind lookup and model-free rows are not what an export carries
    served = specs[1]
    assert served.tree is None and served.drafter.draft_threshold == 0.0 and served.k is None  # the eval's --k
    # already measured as a chain at threshold 0: nothing added; without --served-chain nothing either
    assert [s.label for s in methods.build_drafters([a], target, [0.0, 0.1], ["chain"], served=True)] == [
        "draft_lm:run/last", "draft_lm:run/last@0.1"]
    assert [s.label for s in methods.build_drafters([a], target, [0.1], ["3,2"])] == ["draft_lm:run/last@0.1 tree=3,2"]


def test_speed_rows_pool_prompts_and_repeats():
    row = serve_speed.speed_row("m", [[1, 10, 1.0], [0, 20, 1.0], [1, 10, 1.0]])
    assert row["per_prompt"] == [[0, 20, 1.0], [1, 20, 2.0]] and row["tokens_per_s"] == pytest.approx(40 / 3)
    assert serve_speed.speed_row("m", [])["tokens_per_s"] is None


def test_vllm_speed_jobs_are_timed_plain_first_and_refuse_bad_methods():
    jobs = serve_speed.vllm_jobs("/t", [[1, 2]], [2], 16, [dict(label="ngram", method="ngram", k=5, ngram={"a": 1}),
                                                            dict(label="e", method="eagle3", k=3, draft="/e")],
                                 dtype="bfloat16")
    assert [(j["label"], j["method"], j["k"]) for j in jobs] == [("plain", "none", 0), ("ngram", "ngram", 5),
                                                                   ("e", "eagle3", 3)]
    assert all(j["timed"] and j["eager"] is False and j["dtype"] == "bfloat16" for j in jobs)
    assert jobs[1]["ngram"] == {"a": 1} and jobs[2]["draft"] == "/e" and "draft" not in jobs[1]
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        serve_speed.vllm_jobs("/t", [[1]], [2], 8, [dict(label="x", method="ngram", k=0)], dtype="float32")
    with pytest.raises(ValueError, match="distinct labels"):
        serve_speed.vllm_jobs("/t", [[1]], [2], 8, [dict(label="plain", method="ngram", k=2)], dtype="float32")


def test_each_engine_s_speedup_is_over_its_own_plain_decoding_with_an_interval():
    jobs = [dict(label="plain"), dict(label="ngram"), dict(label="suffix")]
    result = {"results": [
        {"per_prompt": [[0, 10, 1.0], [1, 10, 1.0]], "metrics": {}},
        {"per_prompt": [[0, 10, 0.5], [1, 10, 0.4]], "metrics": {"num_drafts": 4, "num_accepted_tokens": 6}},
        {"error": "ImportError: no arctic_inference"}]}
    theirs = serve_speed.vllm_rows(jobs, result)
    assert theirs[1]["tau"] == pytest.approx(2.5) and theirs[2]["error"].startswith("ImportError")
    assert theirs[1]["tau_all"] == pytest.approx(18 / (18 - 6))  # 9 tokens after each prompt's first, 6 accepted
    assert "tau_all" not in theirs[0]  # plain decoding drafted nothing
    ours = [serve_speed.speed_row("plain", [[0, 10, 2.0], [1, 10, 2.0]]),
            serve_speed.speed_row("ngram", [[0, 10, 1.0], [1, 10, 2.0]])]
    table = {r["method"]: r for r in serve_speed.side_by_side(ours, theirs)}
    assert table["plain"]["vs_vllm"] == pytest.approx(0.5) and table["plain"]["drafterkit"]["speedup"] == 1.0
    ngram = table["ngram"]
    assert ngram["vllm"]["speedup"] == pytest.approx((20 / 0.9) / 10) and ngram["drafterkit"]["speedup"] == \
        pytest.approx((20 / 3) / 5)
    assert ngram["speedup_ratio"] == pytest.approx(ngram["drafterkit"]["speedup"] / ngram["vllm"]["speedup"])
    lo, hi = ngram["vllm"]["interval"]
    assert lo <= ngram["vllm"]["speedup"] <= hi
    assert table["suffix"]["vllm"]["speedup"] is None and table["suffix"]["drafterkit"]["tokens_per_s"] is None
    md = "\n".join(serve_speed.markdown_rows(list(table.values())))
    assert "| plain | 5.0 |" in md and "0.50x (plain tokens/s)" in md and "(failed: ImportError" in md
    assert "| 1.50 / 2.50 |" in md  # vLLM's tau over every pass, then over its drafting passes
    assert len(serve_speed.text_lines(list(table.values()))) == 4


def test_drafterkit_rows_time_each_prompt_and_count_tau():
    target = tiny_llama(0)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 9, 8, 9, 8]]
    rows = serve_speed.drafterkit_rows(target, {"ngram": (NGramDrafter(), 3)}, prompts, 12, [])
    assert [r["method"] for r in rows] == ["plain", "ngram"]
    assert all(len(r["per_prompt"]) == 2 and r["new_tokens"] == 24 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["tau"] == pytest.approx(1.0) and rows[1]["tau"] >= 1.0
    assert rows[0]["tau_drafting"] is None  # plain decoding verifies no draft
    # per pass that verified a draft: at least the per-pass figure, as passes without an n-gram match drop out
    assert rows[1]["tau_drafting"] >= rows[1]["tau"]


def test_serve_check_measures_speed_unless_told_not_to():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["exports/e", "--target", "t"]
    assert parser.parse_args(base).speed is True and parser.parse_args(base).speed_dtype == "auto"
    assert parser.parse_args([*base, "--no-speed"]).speed is False
