"""Draft lengths and options a recipe gives that a kind does not train are refused or made explicit when the recipe
is validated, never cut at step 1: ``accept_len`` over more steps than EAGLE / EAGLE-3 unroll or P-EAGLE trains
(``train.draft_lengths``), DSpark's Markov head left untrained (``train_markov_head``, an ablation), and vLLM's
refusal of a target names the kind of the export it refuses (``drafters.export.vllm_support``)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama
from families import save_family
from test_drafters_conformance import build

from drafterkit.drafters.export.model_card import vllm_serve_problem
from drafterkit.speceval.serve_parity import serve_refusal
from drafterkit.train.recipe import RecipeError, load_recipe, recipe_from_dict
from drafterkit.train.strategies import get_strategy

#: kind, its options, the steps one training chain unrolls, the option that sets it
TRAINED_CHAINS = [("eagle", {"ttt_steps": 2}, 2, "ttt_steps"),
                  ("eagle3", {"ttt_steps": 3, "ttt_tokens": "draft"}, 3, "ttt_steps"),
                  ("peagle", {"num_depths": 3}, 3, "num_depths")]


@pytest.mark.parametrize("kind,options,most,option", TRAINED_CHAINS)
def test_accept_len_longer_than_the_trained_chain_is_refused_naming_both_keys(kind, options, most, option):
    """EAGLE / EAGLE-3 unroll ``ttt_steps`` and P-EAGLE trains ``num_depths`` positions: ``accept_len`` over a
    ``loss.draft_steps`` the recipe sets above that was cut to it without a word; now refused when the recipe is
    validated, one line naming both keys and both fixes. ``eval.k`` is not bounded by it (these kinds draft chains
    of any length at decode time), nor is ``draft_steps`` without accept_len (not read)."""
    base = {"output_dir": "x", "drafter": {"kind": kind, "options": options}}
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({**base, "loss": {"name": "accept_len", "draft_steps": most + 1}})
    line = str(err.value).splitlines()[-1]
    assert line.startswith(f"loss.draft_steps: {most + 1} ") and f"'{kind}'" in line, line
    assert f"drafter.options.{option}: {most}" in line and f"set loss.draft_steps to at most {most}" in line, line
    assert f"drafter.options.{option} to at least {most + 1}" in line, line
    r = recipe_from_dict({**base, "eval": {"k": most + 3}, "loss": {"name": "fkl", "draft_steps": most + 2}})
    assert r.eval.k == most + 3 and r.loss.draft_steps == most + 2


@pytest.mark.parametrize("kind,options,most,option", TRAINED_CHAINS)
def test_default_accept_len_steps_follow_the_trained_chain_in_the_saved_recipe(kind, options, most, option,
                                                                               tmp_path):
    """Left out, ``loss.draft_steps`` (4) becomes the trained chain's length where that is shorter, so the saved
    recipe holds the K the loss runs with and validates again as it is."""
    r = recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind, "options": options},
                          "loss": {"name": "accept_len"}})
    assert r.loss.draft_steps == min(4, most)
    assert load_recipe(r.save(tmp_path)).loss.draft_steps == min(4, most)


def test_the_markov_head_left_untrained_adds_nothing_and_gets_no_gradient():
    """``train_markov_head: false`` (the ablation of a backbone trained without it): the chain terms read the
    block's own logits, so the Markov head gets no gradient and its zero-initialised output matrix keeps adding
    nothing at decode time; the confidence head still trains. Refused for a kind without a Markov head."""
    target = tiny_llama(0)
    torch.manual_seed(0)
    ids = torch.randint(4, 128, (2, 24))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    options = {"block_size": 4, "num_anchors": 6, "markov_rank": 8}
    grads = {}
    for train_markov in (True, False):
        d = build("dspark", target).train()
        recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"}, "drafter": {
            "kind": "dspark", "options": {**options, "train_markov_head": train_markov}}})
        loss, _ = get_strategy("dspark").loss(d, target, batch, recipe)
        loss.backward()
        params = dict(d.named_parameters())
        grads[train_markov] = {n: params[n].grad for n in ("markov_head.markov_w2.weight", "fc.weight",
                                                           "confidence_head.proj.weight")}
    assert grads[True]["markov_head.markov_w2.weight"].abs().sum() > 0
    w2 = grads[False]["markov_head.markov_w2.weight"]
    assert w2 is None or w2.abs().sum() == 0
    assert grads[False]["fc.weight"].abs().sum() > 0 and grads[False]["confidence_head.proj.weight"].abs().sum() > 0
    with pytest.raises(RecipeError, match=r"drafter\.options\.train_markov_head"):
        recipe_from_dict({"output_dir": "/tmp/unused", "drafter": {"kind": "dflash",
                                                                   "options": {"train_markov_head": False}}})


@pytest.mark.parametrize("fmt,method,title", [("vllm-dspark", "dspark", "a DSpark block drafter"),
                                              ("vllm-dflash", "dflash", "a DFlash block drafter"),
                                              ("vllm-peagle", "peagle", "a P-EAGLE head"),
                                              ("vllm-eagle3", "eagle3", "an EAGLE-3 head")])
def test_the_vllm_refusal_names_the_kind_of_the_export(fmt, method, title, tmp_path):
    """A target class without vLLM's EAGLE-3 interface (Gemma-3) is refused for every export that reads auxiliary
    hidden states; export's warning and serve-check's refusal name that export's kind, not a list of four."""
    save_family("gemma3", target := tmp_path / "gemma3")
    for line in (vllm_serve_problem(fmt, str(target)), serve_refusal(method, str(target))):
        assert line.startswith(f"vLLM 0.32.0 cannot serve {title} for a Gemma3ForCausalLM target: "), line
        assert " / " not in line.split(" for a ")[0], line
