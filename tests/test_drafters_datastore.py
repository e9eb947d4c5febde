"""drafters.lookup.datastore (REST-style corpus retrieval) and its use by the hybrid: lookups, document
boundaries, persistence, building from a conversation file, tree overlay, exactness."""

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import tiny_llama

from drafterkit.decode import generate
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.decode.tree import DraftTree
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.lookup import datastore as datastore_module
from drafterkit.drafters.lookup.datastore import Datastore, build_datastore, cached_datastore
from drafterkit.drafters.lookup.hybrid import LookupHybrid
from drafterkit.drafters.ngram import fill_tree, overlay_tree
from drafterkit.speceval.methods import build_drafter


def _brute(docs, row, depth, lo=2, hi=4):
    """Every continuation of the row's longest matching n-gram, by brute force."""
    for n in range(min(hi, len(row)), lo - 1, -1):
        key = row[-n:]
        found = [d[i + n: i + n + depth] for d in docs for i in range(len(d) - n) if d[i: i + n] == key]
        found = [f for f in found if f]
        if found:
            return n, found
    return 0, []


def test_lookup_matches_brute_force_and_never_crosses_documents():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 6, size=rng.integers(1, 40)).tolist() for _ in range(30)]
    store = Datastore.from_documents(docs, vocab_size=6)
    assert len(store) == sum(map(len, docs))
    for _ in range(200):
        row = rng.integers(0, 6, size=rng.integers(1, 6)).tolist()
        n, want = _brute(docs, row, 3)
        got_n, starts, total = store.matches(row, max_matches=10_000)
        assert (got_n, total) == (n, len(want))
        got = store.continuations(row, 3, max_matches=10_000)
        assert sorted(got) == sorted(want)  # same multiset: no continuation runs into the next document


def test_max_matches_samples_evenly_and_keys_are_exact_or_hashed():
    docs = [[1, 2, 3]] * 50 + [[1, 2, 4]] * 50
    store = Datastore.from_documents(docs, vocab_size=5)
    conts = store.continuations([9, 1, 2][1:], 1, max_matches=10)
    assert len(conts) == 10 and sorted(c[0] for c in conts) == [3] * 5 + [4] * 5
    # a vocabulary too large to pack 4 ids in 64 bits uses a hash: same answers
    big = Datastore.from_documents([[70_000, 5, 6, 7, 8]], vocab_size=1 << 20)
    assert big.continuations([70_000, 5, 6, 7], 2) == [[8]]
    assert big.continuations([1, 5, 6], 2) == [[7, 8]]
    assert big.continuations([1, 2, 3], 2) == []


def test_save_load_roundtrip_and_clear_errors(tmp_path):
    docs = [[1, 2, 3, 4, 1, 2, 5], [2, 3, 9]]
    store = Datastore.from_documents(docs, vocab_size=10, min_ngram=1, max_ngram=3)
    path = store.save(tmp_path / "ds.npz")
    back = Datastore.load(path)
    assert (back.min_ngram, back.max_ngram, back.vocab_size) == (1, 3, 10)
    for row in ([1, 2], [2, 3], [9], [4, 1, 2], [7]):
        assert back.continuations(row, 4) == store.continuations(row, 4)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a drafterkit datastore"):
        Datastore.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match=r"ids must be in \[0, 10\)"):
        Datastore.from_documents([[1, 12]], vocab_size=10)
    with pytest.raises(ValueError, match="min_ngram"):
        Datastore.from_documents(docs, vocab_size=10, min_ngram=3, max_ngram=2)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from drafterkit.assets.pinned import default_target_dir

    return AutoTokenizer.from_pretrained(default_target_dir())


@pytest.mark.filterwarnings("ignore:.*rarely match:UserWarning")  # a small corpus, on purpose
def test_build_from_conversations_skips_heldout_and_user_turns(tmp_path, tok):
    recs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": "zebra question"},
                                               {"from": "gpt", "value": f"The answer is {i}."}]}
            for i in range(400)]
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(recs))
    per = {i: len(tok(f"The answer is {i}.", add_special_tokens=False)["input_ids"]) for i in range(400)}
    store = build_datastore(path, tok, heldout_fraction=0.25)
    from drafterkit.assets.conversations import is_heldout

    kept = [i for i in range(400) if not is_heldout(f"c{i}", 0.25)]
    assert 200 <= len(kept) < 400 and len(store) == sum(per[i] for i in kept)
    zebra = tok(" zebra question", add_special_tokens=False)["input_ids"]
    assert store.continuations([1] + zebra[:-1], 3) == []  # user turns are not in it
    assert build_datastore(path, tok, heldout_fraction=0.0, max_tokens=100).__len__() == 100


@pytest.mark.filterwarnings("ignore:.*rarely match:UserWarning")  # a small corpus, on purpose
def test_cached_datastore_builds_once(tmp_path, monkeypatch, tok):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    recs = [{"id": f"c{i}", "messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "hello there friend"}]} for i in range(20)]
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    logs = []
    first = cached_datastore(path, tok, log=logs.append, heldout_fraction=0.0)
    second = cached_datastore(path, tok, log=logs.append, heldout_fraction=0.0)
    n = len(tok("hello there friend", add_special_tokens=False)["input_ids"])
    assert len(logs) == 1 and "datastore:" in logs[0] and len(first) == len(second) == 20 * n
    # provenance for the eval record: what it was built from and the cache file it lives in
    assert first.source == second.source == str(path) and first.path == second.path
    assert first.path.parent == tmp_path / "home" / "datastores" and first.path.suffix == ".npz"
    assert first.describe() == dict(source=str(path), path=str(first.path), tokens=20 * n, vocab_size=len(tok),
                                    min_ngram=2, max_ngram=4)
    saved = first.save(tmp_path / "mine.npz")
    assert len(cached_datastore(saved, tok)) == len(first)
    assert cached_datastore(saved, tok).describe()["path"] == str(saved.resolve())
    Datastore(first.tokens[:5] % 50, 50).save(tmp_path / "small.npz")
    with pytest.raises(ValueError, match="vocabulary of 50 ids"):
        cached_datastore(tmp_path / "small.npz", tok)
    with pytest.raises(FileNotFoundError, match="neither a file nor a pinned asset"):
        cached_datastore(tmp_path / "missing.json", tok)


def test_overlay_merges_into_a_partial_tree():
    tree = DraftTree.parse("2,2,1")
    conts = [[5, 6, 7]] * 3 + [[5, 8]] + [[9]]
    # on an empty tree, overlay is fill_tree
    assert overlay_tree(tree, [0] * tree.num_nodes, [False] * tree.num_nodes, conts) == fill_tree(tree, conts)
    # a drafter proposed 5 at rank 0 and 3 at rank 1, with (0,0) = 4 and the rest pruned
    idx = {p: i for i, p in enumerate(tree.paths)}
    toks, ok = [0] * tree.num_nodes, [False] * tree.num_nodes
    for path, t in (((0,), 5), ((1,), 3), ((0, 0), 4)):
        toks[idx[path]], ok[idx[path]] = t, True
    new_t, new_ok = overlay_tree(tree, toks, ok, conts)
    assert new_t[idx[(0,)]] == 5 and new_t[idx[(1,)]] == 3  # 5 merged into the drafter's node; 9 has no room
    assert new_t[idx[(0, 0)]] == 4 and (new_t[idx[(0, 1)]], new_ok[idx[(0, 1)]]) == (6, True)  # free slot
    assert (new_t[idx[(0, 1, 0)]], new_ok[idx[(0, 1, 0)]]) == (7, True)
    assert 9 not in [t for t, o in zip(new_t, new_ok) if o]
    # min_share: branches held by fewer than that share of the matches stay out
    t2, ok2 = overlay_tree(tree, toks, ok, conts, min_share=0.7)
    assert not ok2[idx[(0, 1)]]  # 6 is held by 3/5 = 0.6 < 0.7
    assert ok == [o for o in ok] and toks[idx[(0, 1)]] == 0  # inputs untouched


def _store_from(seqs, vocab=128):
    return Datastore.from_documents(seqs, vocab_size=vocab)


@pytest.mark.parametrize("tree", [None, "3,2,1", "dynamic:12:3:3"], ids=["chain", "tree", "dynamic"])
def test_rest_hybrid_is_exact_and_uses_the_corpus(tree):
    target = tiny_llama(0)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (7,), generator=g).tolist() for _ in range(3)]
    plain = generate(target, prompts, max_new_tokens=20, eos_token_id=[])
    # the corpus holds the target's own continuations of other prompts' suffixes: retrieval gets hits
    store = _store_from([p + s for p, s in zip(prompts, plain.sequences)])
    hybrid = LookupHybrid(DraftLM.from_target(target, 1), datastore=store, datastore_share=0.2)
    assert hybrid.kind == "draft_lm+rest"
    hybrid.draft_threshold = 0.95  # the weak draft LM proposes little, so its tree leaves slots free
    res = generate(target, prompts, drafter=hybrid, max_new_tokens=20, num_draft_tokens=4, tree=tree,
                   eos_token_id=[])
    assert res.sequences == plain.sequences
    alone = LookupHybrid(DraftLM.from_target(target, 1))
    alone.draft_threshold = 0.95
    no_corpus = generate(target, prompts, drafter=alone, max_new_tokens=20, num_draft_tokens=4, tree=tree,
                         eos_token_id=[])
    assert res.counts.target_forwards < no_corpus.counts.target_forwards  # the corpus's copies were accepted


def test_chain_rows_take_the_corpus_only_when_its_matches_agree():
    target = tiny_llama(0)
    store = _store_from([[1, 2, 3, 4, 5]] * 8 + [[1, 2, 9, 9]] * 2 + [[7, 8, 10]] + [[7, 8, 11]])
    hybrid = LookupHybrid(DraftLM.from_target(target, 1), datastore=store, datastore_share=0.5)
    hybrid.reset(2)
    state = DecodeState(tokens=[[40, 1, 2], [41, 7, 8]], num_stable=[0, 0], features=None, active=[True, True],
                        vocab_size=128)
    prop = hybrid.propose(state, 4, SamplingParams(), None)
    assert prop.tokens[0].tolist()[:3] == [3, 4, 5] and int(prop.lengths[0]) == 3  # 8 of 10 agree
    assert (hybrid.lookup_rows, hybrid.drafter_rows) == (1, 1)  # 10 vs 11: 1 of 2 < CHAIN_SHARE: the drafter


def test_rest_spec_needs_a_datastore_and_builds_it_once():
    target = tiny_llama(0)
    with pytest.raises(ValueError, match=r"--datastore"):
        build_drafter("draft:1+rest", target)
    calls = []
    store = _store_from([[1, 2, 3]])

    def load():
        calls.append(1)
        return store
    spec = build_drafter("draft:1+rest", target, load)
    assert spec.label == "draft:1+rest" and spec.drafter.datastore is store and calls == [1]
    for bad in ("rest+draft:1", "draft:1+rest+ngram", "rest+rest"):
        with pytest.raises(ValueError, match="--drafter"):
            build_drafter(bad, target, load)
    with pytest.raises(ValueError, match="datastore_share"):
        LookupHybrid(spec.drafter.drafter, datastore=store, datastore_share=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_drafter("draft:1+ngram", target, load)  # +ngram never loads the datastore
    assert calls == [1]


def test_drafter_nodes_clear_the_corpus_bar_in_merged_trees():
    target = tiny_llama(0)
    seen = []

    class Spy(DraftLM):
        def propose_tree(self, state, tree, sampling, generator):
            seen.append((self.draft_threshold, self.expand_threshold))
            return super().propose_tree(state, tree, sampling, generator)

    spy = Spy.from_model(DraftLM.from_target(target, 1).lm)
    spy.draft_threshold = 0.1
    hybrid = LookupHybrid(spy, datastore=_store_from([[1, 2, 3]]), datastore_share=0.25)
    hybrid.reset(1)
    state = DecodeState(tokens=[[40, 41, 42]], num_stable=[0], features=None, active=[True], vocab_size=128)
    hybrid.propose_tree(state, DraftTree.parse("2,1"), SamplingParams(), None)
    # nodes from 0.1 are proposed, only those from 0.25 get children; restored after the call
    assert seen == [(0.1, 0.25)] and (spy.draft_threshold, spy.expand_threshold) == (0.1, 0.0)
    LookupHybrid(spy).propose_tree(state, DraftTree.parse("2,1"), SamplingParams(), None)
    assert seen == [(0.1, 0.25), (0.1, 0.0)]  # without a datastore the drafter's own thresholds


def test_bad_datastores_and_specs_name_the_fix(tmp_path):
    target = tiny_llama(0)
    (tmp_path / "broken.npz").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ValueError, match="rebuild it from a conversation file"):
        Datastore.load(tmp_path / "broken.npz")
    with pytest.raises(FileNotFoundError, match="no such datastore file"):
        Datastore.load(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match=r"\+rest' already includes prompt lookup"):
        build_drafter("draft:1+rest+ngram", target, lambda: _store_from([[1, 2]]))
    with pytest.raises(ValueError, match="rest: retrieval needs a datastore"):
        build_drafter("rest", target)
    with pytest.raises(TypeError, match="drafters.lookup.datastore.Datastore"):
        LookupHybrid(DraftLM.from_target(target, 1), datastore="sharegpt")
    with pytest.raises(TypeError, match="wraps a drafter"):
        LookupHybrid(None)
    wide = LookupHybrid(DraftLM.from_target(target, 1), datastore=_store_from([[1, 2]], vocab=1000))
    with pytest.raises(ValueError, match="build it with the target's tokenizer"):
        generate(target, [[1, 2, 3]], drafter=wide, max_new_tokens=4)
    from drafterkit.speceval.eval_run import EvalConfig, datastore_loader

    with pytest.raises(ValueError, match=r"x.jsonl is unused: only \+rest and suffix drafters read a datastore"):
        EvalConfig(drafters=["ngram"], datastore=str(tmp_path / "x.jsonl")).validate()
    with pytest.raises(ValueError, match=r"--datastore .*missing.json.*It takes a ShareGPT"):
        datastore_loader(str(tmp_path / "missing.json"), None, quiet=True)()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_corpus_branches_stop_at_datastore_depth(depth):
    target = tiny_llama(0)
    store = _store_from([[1, 2, 3, 4, 5, 6, 7]] * 4)
    hybrid = LookupHybrid(DraftLM.from_target(target, 1), datastore=store, datastore_depth=depth)
    hybrid.draft_threshold = 0.999  # the random draft LM proposes nothing: every node comes from the corpus
    hybrid.reset(1)
    state = DecodeState(tokens=[[40, 1, 2]], num_stable=[0], features=None, active=[True], vocab_size=128)
    tree = DraftTree.parse("1,1,1,1,1")
    prop = hybrid.propose_tree(state, tree, SamplingParams(), None)
    assert prop.tokens[0][prop.mask[0]].tolist() == [3, 4, 5, 6, 7][:depth]
    chain = hybrid.propose(state, 5, SamplingParams(), None)
    assert chain.tokens[0].tolist()[:depth] == [3, 4, 5][:depth] and int(chain.lengths[0]) == depth
    with pytest.raises(ValueError, match="datastore_depth"):
        LookupHybrid(DraftLM.from_target(target, 1), datastore=store, datastore_depth=0)


def test_thresholds_and_retrieval_settings_are_checked():
    target = tiny_llama(0)
    head = DraftLM.from_target(target, 1)
    hybrid = LookupHybrid(head, datastore=_store_from([[1, 2, 3]]))
    for name in ("draft_threshold", "expand_threshold"):
        for bad in (-0.5, float("nan"), float("inf"), "x", None, True):
            with pytest.raises(ValueError, match=name):
                setattr(head, name, bad)
            with pytest.raises(ValueError, match=name):
                setattr(hybrid, name, bad)  # passed on to the wrapped drafter
    hybrid.expand_threshold = 0.5
    assert head.expand_threshold == 0.5 and hybrid.expand_threshold == 0.5
    for bad in (1.0, 2.0):  # a confidence bar of 1 or more drafts nothing, silently: refused as eval refuses it
        with pytest.raises(ValueError, match=r"draft_threshold must be in \[0, 1\)"):
            head.draft_threshold = bad
    hybrid.expand_threshold = 1.0  # no node gets children: a setting of its own, still taken
    for kw, bad in (("datastore_depth", 2.5), ("datastore_depth", "3"), ("datastore_depth", True),
                    ("datastore_matches", 0), ("datastore_share", float("nan"))):
        with pytest.raises(ValueError, match=kw):
            LookupHybrid(head, datastore=_store_from([[1, 2, 3]]), **{kw: bad})


def test_retrieval_settings_are_checked_on_assignment_too():
    target = tiny_llama(0)
    hybrid = LookupHybrid(DraftLM.from_target(target, 1), datastore=_store_from([[1, 2, 3]]))
    for name, bad in (("datastore_depth", 0), ("datastore_depth", 2.5), ("datastore_depth", True),
                      ("datastore_matches", 0), ("datastore_matches", "64"), ("datastore_matches", False),
                      ("datastore_share", 0.0), ("datastore_share", 1.5), ("datastore_share", float("nan")),
                      ("datastore_share", True), ("datastore_share", "0.2")):
        before = getattr(hybrid, name)
        with pytest.raises(ValueError, match=rf"LookupHybrid needs .*{name}.*got {bad!r}"):
            setattr(hybrid, name, bad)
        assert getattr(hybrid, name) == before  # a refused value leaves the setting as it was
    hybrid.datastore_depth, hybrid.datastore_matches, hybrid.datastore_share = 2, 8, 1
    assert hybrid.settings() == dict(datastore_share=1.0, datastore_matches=8, datastore_depth=2, max_ngram=3,
                                     min_match=2)
    other = LookupHybrid(DraftLM.from_target(target, 1))
    assert other.datastore_depth == 3  # a setting per object, not per class


def test_a_small_corpus_warns_that_retrieval_will_rarely_match(tmp_path, tok, monkeypatch):
    recs = [{"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": f"Hello there, this is answer number {i}."}]}
            for i in range(2)]
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    with pytest.warns(UserWarning, match=r"two.jsonl: the datastore holds only \d+ tokens .*rarely match.*larger "
                                         r"corpus"):
        store = build_datastore(path, tok, heldout_fraction=0.0)
    assert 0 < len(store) < datastore_module.SMALL_DATASTORE_TOKENS
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_datastore(path, tok, heldout_fraction=0.0, max_tokens=10)  # the cap made it small: as asked
        monkeypatch.setattr(datastore_module, "SMALL_DATASTORE_TOKENS", len(store))
        build_datastore(path, tok, heldout_fraction=0.0)  # at the threshold: no warning
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(datastore_module, "SMALL_DATASTORE_TOKENS", len(store) + 1)
    for _ in ("built", "cached"):  # every time a small store is handed out
        with pytest.warns(UserWarning, match=f"holds only {len(store)} tokens"):
            cached_datastore(path, tok, heldout_fraction=0.0)


def test_unknown_spec_suffixes_name_the_valid_ones(tmp_path):
    target = tiny_llama(0)
    for bad, hint in (("draft:1+foo", "unknown suffix"), ("draft:1+", "unknown suffix"),
                      ("draft:1+rest@0.1", "--draft-threshold")):
        with pytest.raises(ValueError, match=hint):
            build_drafter(bad, target, lambda: _store_from([[1, 2, 3]]))
