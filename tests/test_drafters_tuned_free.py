"""The tuned records of the model-free proposers (``drafters.lookup.tuned_free``): keyed by the target's weights, its
dtype, the proposer's knobs and corpus; used under the checkpoint rules (machine, faster than plain decoding);
``decode.generate(tree="auto")`` decodes in the recorded shape once attached."""

import json

import pytest
import torch
from conftest import tiny_llama

from drafterkit.assets.device import host_info
from drafterkit.decode import generate
from drafterkit.drafters.lookup.datastore import Datastore
from drafterkit.drafters.lookup.hybrid import LookupHybrid
from drafterkit.drafters.lookup.tuned_free import (
    attach_free_tuned,
    proposer_key,
    read_free_tuned,
    record_path,
    target_identity,
    write_free_tuned,
)
from drafterkit.drafters.ngram import NGramConfig, NGramDrafter
from drafterkit.drafters.suffix import SuffixConfig, SuffixDrafter, corpus_index


def _record(speedup=1.5, machine=None, **winner):
    w = dict(tree="chain", k=3, draft_threshold=0.0, speedup=speedup, **winner)
    return dict(written_by="drafterkit tune", created="2026-12-04T00:00:00+00:00", dtype="fp32", exact_mode=True,
                machine=machine or host_info("cpu"), winners={"1": w})


def test_target_identity_follows_the_weights_not_the_dtype():
    a = tiny_llama(0)
    assert target_identity(a) == target_identity(tiny_llama(0))
    assert target_identity(a) == target_identity(tiny_llama(0).to(torch.bfloat16))  # one identity, two dtypes
    assert target_identity(a) != target_identity(tiny_llama(1))  # another model
    tuned = tiny_llama(0)
    with torch.no_grad():  # a fine-tune: every weight of one layer moved a little
        tuned.model.layers[1].mlp.down_proj.weight.add_(0.05)
    assert target_identity(a) != target_identity(tuned)
    assert target_identity(a).startswith("llama-")


def test_proposer_key_follows_the_knobs_and_the_corpus():
    assert proposer_key(NGramDrafter()) == proposer_key(NGramDrafter())
    assert proposer_key(NGramDrafter()) != proposer_key(NGramDrafter(NGramConfig(max_ngram=4)))
    depth = SuffixConfig.max_tree_depth
    one = Datastore.from_documents([[5, 6, 7, 8]] * 3, vocab_size=128)
    two = Datastore.from_documents([[9, 6, 7, 8]] * 3, vocab_size=128)
    s1 = SuffixDrafter(SuffixConfig(max_cached_requests=0), corpus=corpus_index(one, depth))
    assert proposer_key(s1) == proposer_key(SuffixDrafter(SuffixConfig(max_cached_requests=0),
                                                          corpus=corpus_index(one, depth)))
    assert proposer_key(s1) != proposer_key(SuffixDrafter(SuffixConfig(max_cached_requests=0),
                                                          corpus=corpus_index(two, depth)))
    assert proposer_key(s1) != proposer_key(SuffixDrafter(SuffixConfig(max_cached_requests=0)))
    rest = LookupHybrid(NGramDrafter(), datastore=one)  # `rest`: prompt lookup, else retrieval from the datastore
    assert proposer_key(rest) == proposer_key(LookupHybrid(NGramDrafter(), datastore=one))
    assert proposer_key(rest) != proposer_key(LookupHybrid(NGramDrafter(), datastore=two))
    assert proposer_key(rest) != proposer_key(LookupHybrid(NGramDrafter(), datastore=one, datastore_depth=2))
    assert record_path(tiny_llama(0), rest).name.startswith("rest-")
    with pytest.raises(ValueError, match="model-free proposers ngram, rest, suffix"):
        record_path(tiny_llama(0), object())


def test_a_record_is_used_for_its_target_dtype_corpus_and_machine_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path))
    target = tiny_llama(0)
    assert read_free_tuned(target, NGramDrafter())[0] is None
    path = write_free_tuned(target, NGramDrafter(), _record())
    assert path == tmp_path / "tuned" / target_identity(target) / f"ngram-{proposer_key(NGramDrafter())}.float32.json"
    saved = json.loads(path.read_text())
    assert saved["target_identity"] == target_identity(target) and saved["target_dtype"] == "float32"
    winner, why = read_free_tuned(target, NGramDrafter())
    assert winner["k"] == 3 and winner["exact_mode"] is True and why.startswith("tuned by drafterkit tune")
    # another target, another dtype, other knobs: not used, each with its reason
    assert read_free_tuned(tiny_llama(1), NGramDrafter()) == (None, read_free_tuned(tiny_llama(1), NGramDrafter())[1])
    assert "no tuned setting for ngram on this target in float32" in read_free_tuned(tiny_llama(1), NGramDrafter())[1]
    none, why = read_free_tuned(tiny_llama(0).to(torch.bfloat16), NGramDrafter())
    assert none is None and "measured in float32 and the target runs in bfloat16 here: give --dtype fp32" in why
    none, why = read_free_tuned(target, NGramDrafter(NGramConfig(max_ngram=4)))
    assert none is None and "another --datastore or other settings" in why
    # another machine, a slowdown: the checkpoint rules (drafters.tuned.tuned_winner)
    write_free_tuned(target, NGramDrafter(), _record(machine=dict(host_info("cpu"), cpu="another CPU")))
    none, why = read_free_tuned(target, NGramDrafter())
    assert none is None and "measured on another machine" in why
    write_free_tuned(target, NGramDrafter(), _record(speedup=0.8))
    assert "slower than plain decoding" in read_free_tuned(target, NGramDrafter())[1]


def test_generate_tree_auto_decodes_in_the_attached_shape(tmp_path, monkeypatch):
    """``attach_free_tuned`` makes ``tree="auto"`` decode prompt lookup in its recorded shape (a chain of 3 here,
    against ``num_draft_tokens=5``), exactly; without a record it warns and drafts a chain of num_draft_tokens."""
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path))
    target = tiny_llama(0)
    rows = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]]
    plain = generate(target, rows, max_new_tokens=12, eos_token_id=[])
    with pytest.warns(UserWarning, match="no tuned setting for ngram on this target"):
        chain = generate(target, rows, drafter=attach_free_tuned(NGramDrafter(), target), tree="auto",
                         num_draft_tokens=5, max_new_tokens=12, eos_token_id=[])
    assert len(chain.stats.accept_per_position) == 5
    write_free_tuned(target, NGramDrafter(), _record())
    auto = generate(target, rows, drafter=attach_free_tuned(NGramDrafter(), target), tree="auto",
                    num_draft_tokens=5, max_new_tokens=12, eos_token_id=[])
    assert len(auto.stats.accept_per_position) == 3 and auto.sequences == plain.sequences == chain.sequences
