"""Draft shapes a drafter cannot draft are refused when eval / tune / quickstart validate their flags, before the
target loads (the target named here does not exist, so an error that names it came too late): trees for a
chain-only drafter (DFlash), a K above Medusa's heads or DFlash's block, a threshold for model-free proposers."""

from __future__ import annotations

import pytest
from conftest import tiny_llama

from drafterkit.cli import build_parser, main, parse
from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.quickstart import stages as quickstart_stages
from drafterkit.speceval import methods


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """A DFlash drafter with block_size 4 (3 draft tokens a round) and a Medusa drafter with 2 heads."""
    root, target = tmp_path_factory.mktemp("shapes"), tiny_llama(0)
    DFlashDrafter(DFlashConfig.from_target(target, num_layers=1, block_size=4), target=target).save_pretrained(
        root / "dflash")
    MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target).save_pretrained(root / "medusa")
    return {"dflash": str(root / "dflash"), "medusa": str(root / "medusa"), "target": target}


def _eval(tmp_path, capsys, *argv) -> tuple[int, str]:
    rc = main(["eval", "--target", str(tmp_path / "no-target"), "--num-prompts", "1", "--output",
               str(tmp_path / "x.json"), *argv])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("drafters, trees, message", [
    (["dflash"], ["3,2,1"], "--tree 3,2,1: --drafter {dflash} is a dflash drafter, which drafts chains only; drop "
                            "--tree (it is measured as a chain of --k tokens) or pass --tree chain"),
    (["dflash"], ["dynamic"], "--tree dynamic: --drafter {dflash} is a dflash drafter, which drafts chains only"),
    (["dflash+ngram"], ["2,1"], "--drafter {dflash}+ngram is a dflash drafter, which drafts chains only"),
    (["dflash+suffix"], ["2,1"], "--drafter {dflash}+suffix is a dflash drafter"),
    (["medusa", "dflash"], ["chain", "2,1"], "--tree 2,1: --drafter {dflash} is a dflash drafter, which drafts chains "
                                             "only; measure it in a drafterkit eval of its own without --tree (a "
                                             "chain of --k tokens), or pass --tree chain to measure every drafter as "
                                             "a chain"),
])
def test_eval_refuses_a_tree_for_a_chain_only_drafter(ckpts, tmp_path, capsys, drafters, trees, message):
    """It used to measure a chain under the tree's row silently (a mixed list: the tree row went missing)."""
    argv = [a for d in drafters for a in ("--drafter", d.replace(d.split("+")[0], ckpts[d.split("+")[0]]))]
    rc, err = _eval(tmp_path, capsys, *argv, *[a for t in trees for a in ("--tree", t)])
    assert rc == 2 and err.count("\n") == 1 and message.format(**ckpts) in err and "no-target" not in err


@pytest.mark.parametrize("argv", [["--tree", "chain"], ["--tree", "auto"], []])
def test_eval_takes_chains_for_a_chain_only_drafter(ckpts, tmp_path, capsys, argv):
    rc, err = _eval(tmp_path, capsys, "--drafter", ckpts["dflash"], *argv)
    assert rc == 2 and "no-target" in err  # validation passed: the (missing) target is the first problem


def test_build_drafters_refuses_a_tree_for_a_chain_only_drafter_too(ckpts):
    with pytest.raises(ValueError, match="drafts chains only; pass --tree chain"):
        methods.build_drafters([ckpts["dflash"]], ckpts["target"], [0.0], ["chain", "2,1"])


@pytest.mark.parametrize("argv, message", [
    (["--drafter", "{medusa}", "--k", "3"], "--k 3: --drafter {medusa}: a medusa drafter with 2 heads drafts at most "
                                            "2 tokens a round; give --k values up to 2 (without --k its rows use K=2)"),
    (["--drafter", "ngram", "--drafter", "{dflash}", "--k", "4"], "--k 4: --drafter {dflash}: a dflash drafter drafts "
                                                                  "at most 3 tokens a round (block_size 4)"),
    (["--drafter", "{medusa}", "--sweep"], "--sweep-k 8: --drafter {medusa}: a medusa drafter with 2 heads drafts at "
                                           "most 2 tokens a round; give --sweep-k values up to 2"),
    (["--drafter", "ngram", "--draft-threshold", "0.1"], "--draft-threshold 0.1: ngram drafts without a probability"),
    (["--drafter", "suffix", "--drafter", "ngram", "--draft-threshold", "0,0.2"],
     "--draft-threshold 0.2: suffix and ngram draft without a probability to cut at (prompt lookup and suffix "
     "decoding copy tokens); drop --draft-threshold, or add a trained --drafter (PATH) it applies to"),
    (["--drafter", "{medusa}", "--drafter", "draft:1", "--tree", "2,1", "--baselines", "engine,hf-assisted"],
     "--baselines hf-assisted: transformers has its own speculative path only for prompt lookup (--drafter ngram) "
     "and draft LMs (draft:N, a draft_lm checkpoint, a transformers folder) measured as a chain (--tree chain) at "
     "--draft-threshold 0, and no --drafter here is one; drop hf-assisted from --baselines or add such a drafter"),
])
def test_eval_refuses_a_k_or_threshold_the_drafters_cannot_take(ckpts, tmp_path, capsys, argv, message):
    """Medusa / DFlash drafted fewer tokens than the K their rows showed; ngram / suffix ignored the threshold;
    hf-assisted measured nothing for drafters transformers has no path for."""
    rc, err = _eval(tmp_path, capsys, *[a.format(**ckpts) for a in argv])
    assert rc == 2 and err.count("\n") == 1 and message.format(**ckpts) in err and "no-target" not in err


@pytest.mark.parametrize("argv", [
    ["--drafter", "{medusa}", "--k", "2"], ["--drafter", "{medusa}+ngram", "--k", "5"],  # lookup rows draft K
    ["--drafter", "{medusa}", "--sweep", "--sweep-k", "1,2"], ["--drafter", "{medusa}", "--drafter", "ngram",
                                                                "--draft-threshold", "0.1"],
    ["--drafter", "{medusa}", "--drafter", "draft:1", "--baselines", "hf-assisted"],  # draft:1's chain has one
    ["--drafter", "{medusa}"],  # the default baselines (all): hf-assisted rows where a drafter has one
])
def test_eval_takes_what_the_drafters_can_draft(ckpts, tmp_path, capsys, argv):
    rc, err = _eval(tmp_path, capsys, *[a.format(**ckpts) for a in argv])
    assert rc == 2 and "no-target" in err


def test_a_row_of_a_bounded_drafter_says_the_k_it_drafts(ckpts):
    """Eval's default K (5) above Medusa's 2 heads: the row runs and is labelled K=2; behind lookup it keeps K."""
    specs = methods.build_drafters([ckpts["medusa"], f"{ckpts['medusa']}+ngram"], ckpts["target"], [0.0])
    sampling = dict(temperature=0.0, top_k=0, top_p=1.0)
    assert [methods.engine_method(ckpts["target"], s, 5, sampling, [2]).k for s in specs] == [2, 5]


@pytest.mark.parametrize("argv, message", [
    (["{dflash}", "--tree", "2,1"], "--tree 2,1: tune {dflash}: a dflash drafter drafts chains only: tune searches "
                                    "its chain lengths (--k) and thresholds; drop --tree"),
    (["{dflash}", "--dynamic", "dynamic:12:4:3"], "--dynamic dynamic:12:4:3: tune {dflash}: a dflash drafter drafts "
                                                  "chains only"),
    (["{dflash}+ngram", "--incumbent", "2,1@0.1"], "--incumbent 2,1@0.1: tune {dflash}+ngram: a dflash drafter drafts "
                                                   "chains only: tune searches its chain lengths (--k) and thresholds; "
                                                   "drop --incumbent or give a chain, chain:K@THRESHOLD"),
    (["{medusa}", "--k", "2,3"], "--k 3: tune {medusa}: a medusa drafter with 2 heads drafts at most 2 tokens a round; "
                                 "give --k values up to 2 (without --k it tries K up to 2)"),
    (["ngram", "--draft-threshold", "0.1"], "--draft-threshold 0.1: ngram drafts without a probability to cut at"),
])
def test_tune_refuses_flags_the_drafter_cannot_take(ckpts, tmp_path, capsys, argv, message):
    """tune used to drop a --tree / --dynamic / --draft-threshold given for such a drafter from its search silently."""
    rc = main(["tune", *[a.format(**ckpts) for a in argv], "--target", str(tmp_path / "no-target"), "--no-write"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message.format(**ckpts) in err and "no-target" not in err


def test_tune_takes_its_defaults_for_a_chain_only_drafter(ckpts, tmp_path, capsys):
    rc = main(["tune", ckpts["dflash"], "--target", str(tmp_path / "no-target"), "--no-write"])
    assert rc == 2 and "no-target" in capsys.readouterr().err


def test_quickstart_measures_a_chain_only_kind_as_chains_and_refuses_a_tree(tmp_path, capsys):
    rc = main(["quickstart", "--kind", "dflash", "--tree", "2,1", "--output-dir", str(tmp_path / "qs")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--tree 2,1: a dflash drafter drafts chains only; drop --tree" in err
    args = parse(build_parser(), ["quickstart", "--kind", "dflash"])
    args.chain_only = True  # quickstart.run sets it from the recipe's kind
    cfg = quickstart_stages.eval_config(tmp_path / "train", args, "mt-bench", 4)
    assert cfg.trees == ["chain"] and quickstart_stages.fixed_trees(args) == ["chain"]
    args.chain_only = False
    assert quickstart_stages.eval_config(tmp_path / "train", args, "mt-bench", 4).trees == ["3,2,1,1,1"]


def test_quickstart_refuses_hf_assisted_where_no_row_would_have_it(tmp_path, capsys):
    rc = main(["quickstart", "--baselines", "engine,hf-assisted", "--output-dir", str(tmp_path / "qs")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--baselines hf-assisted: transformers' assisted generation runs " \
        "prompt lookup and draft LMs as chains only" in err and "add --tree chain" in err
