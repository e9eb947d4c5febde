"""The quickstart report's headline lines: the factor an export carries and the drafter against prompt lookup."""

from drafterkit.quickstart.report import LOSS_WINDOW, headline_lines, loss_words


def _factor(factor, ratio, export=False):
    return dict(factor=factor, ratio=ratio, export=export, role="factor", group="g", method=factor, over="engine",
                what=factor, shape="chain of 5" if export else None)


def test_the_report_says_whether_the_drafter_alone_beats_prompt_lookup():
    def lines(drafter, ngram):
        rec = {"factors": [_factor("drafter", drafter, export=True), _factor("ngram", ngram)]}
        return [x for x in headline_lines({"evals": {"mt-bench": rec}}) if "prompt lookup alone" in x]

    ahead, behind = lines(1.21, 1.10), lines(1.10, 1.25)
    assert len(ahead) == 1 and "the drafter alone is 1.10x: faster" in ahead[0]
    assert len(behind) == 1 and "0.88x: slower, so at this budget" in behind[0] and "1.25x" in behind[0]

    def judged(low, high):  # the paired ratio and its interval, as speceval.factors records them on the ngram row
        ngram = dict(_factor("ngram", 1.1), drafter_over=dict(ratio=(low + high) / 2, interval=[low, high]))
        rec = {"factors": [_factor("drafter", 1.2, export=True), ngram]}
        return [x for x in headline_lines({"evals": {"mt-bench": rec}}) if "prompt lookup alone" in x][0]

    assert judged(1.02, 1.10).endswith("1.06x (95% interval over the prompts 1.02-1.10x): faster, beyond the noise")
    assert judged(0.95, 1.09).endswith(": level with it within the noise (the interval spans 1)")
    assert "0.90x (95% interval over the prompts 0.85-0.95x): slower, so at this budget" in judged(0.85, 0.95)
    assert lines(1.2, None) == []  # no lookup row measured: nothing to compare


def test_the_factor_an_export_carries_is_the_chain_vllm_serves_measured_not_the_tree():
    tree = dict(_factor("drafter", 1.24), shape="tree 3,2,1,1,1, confidence cutoff 0.1")
    chain = dict(_factor("served", 1.01, export=True), shape="chain of 5", interval=[0.95, 1.08])
    lines = headline_lines({"evals": {"mt-bench": {"factors": [tree, chain]}}})
    assert lines == ["- mt-bench: the drafter alone as vLLM serves it, a chain of 5 without a draft threshold: the "
                     "factor `drafterkit export` carries to a serving engine, 1.01x the engine's plain decoding (95% "
                     "interval over the prompts 0.95-1.08x)",
                     "- mt-bench: the drafter alone in drafterkit's own engine, drafting a tree 3,2,1,1,1, confidence "
                     "cutoff 0.1 (a shape vLLM does not serve): 1.24x the engine's plain decoding"]
    unmeasured = headline_lines({"evals": {"mt-bench": {"factors": [tree]}}})
    assert "carries to a serving engine (the drafter alone as a chain of K without a draft threshold, what vLLM " \
           "serves) was not measured: `drafterkit eval --served-chain` measures it" in unmeasured[0]
    assert not any("1.24x" in x and "carries" in x for x in unmeasured)  # the tree is never called the carried factor


def test_the_report_s_loss_is_a_mean_over_steps_not_one_noisy_step():
    assert loss_words([]) == "no optimizer step"
    assert loss_words([4.0, 2.0]) == "loss 3.0000 (mean of the last 2 steps)"
    losses = [10.0] * LOSS_WINDOW + [5.0] * (LOSS_WINDOW - 1) + [1.0]
    assert loss_words(losses) == f"loss {(5.0 * (LOSS_WINDOW - 1) + 1.0) / LOSS_WINDOW:.4f} (mean of the last " \
                                 f"{LOSS_WINDOW} steps; first {LOSS_WINDOW}: 10.0000)"


def test_the_drafter_is_judged_against_the_stronger_model_free_proposer_measured():
    def line(ngram, suffix):
        rec = {"factors": [_factor("drafter", 1.2, export=True), _factor("ngram", ngram), _factor("suffix", suffix)]}
        return [x for x in headline_lines({"evals": {"mt-bench": rec}}) if " alone (`" in x and "untrained" in x]

    stronger = line(1.10, 1.30)  # suffix decoding measured faster: the drafter is held against it
    assert len(stronger) == 1
    assert "against the stronger model-free proposer measured, suffix decoding alone (`suffix`" in stronger[0]
    assert "1.30x the engine's plain decoding; prompt lookup 1.10x" in stronger[0]
    assert "the drafter alone is 0.92x: slower, so at this budget the training has not yet paid for itself over " \
           "suffix decoding" in stronger[0]
    weaker = line(1.10, 1.05)
    assert "prompt lookup alone (`ngram`" in weaker[0] and "suffix decoding 1.05x" in weaker[0]
