"""The quickstart report's headline lines: the factor an export carries and the drafter against prompt lookup."""

from train.quickstart_report import headline_lines


def _factor(factor, ratio, export=False):
    return dict(factor=factor, ratio=ratio, export=export, role="factor", group="g", method=factor, over="engine",
                what=factor)


def test_the_report_says_whether_the_drafter_alone_beats_prompt_lookup():
    def lines(drafter, ngram):
        rec = {"factors": [_factor("drafter", drafter, export=True), _factor("ngram", ngram)]}
        return [x for x in headline_lines({"evals": {"mt-bench": rec}}) if "prompt lookup alone" in x]

    ahead, behind = lines(1.21, 1.10), lines(1.10, 1.25)
    assert len(ahead) == 1 and "the drafter alone is 1.10x: faster" in ahead[0]
    assert len(behind) == 1 and "0.88x: not faster" in behind[0] and "1.25x" in behind[0]
    assert lines(1.2, None) == []  # no lookup row measured: nothing to compare
