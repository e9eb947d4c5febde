"""train.data: assistant-only loss mask on the real SmolLM2 tokenizer, padding, label alignment, cache."""

from __future__ import annotations

import json
import random
import warnings

import pytest
import torch

from drafterkit.assets.conversations import LoaderStats, heldout_prompts, is_heldout, iter_sharegpt
from drafterkit.train import data
from drafterkit.train.data import (
    IGNORE_INDEX,
    DataStats,
    build_dataset,
    collate,
    shift_for_next_token,
)
from drafterkit.train.loss_mask import SkipExample, tokenize_conversation

CONV = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4. Anything else?"},
    {"role": "user", "content": "And 3*3, in words?"},
    {"role": "assistant", "content": "Nine — café ✓"},
]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from drafterkit.assets.pinned import default_target_dir

    return AutoTokenizer.from_pretrained(default_target_dir())


def _runs(mask):
    """[start, end) of each run of 1s."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_mask_is_exactly_the_assistant_turns_with_end_of_turn(tok):
    out = tokenize_conversation(tok, CONV, max_length=4096)
    ids, mask = out["input_ids"], out["loss_mask"]
    assert ids == tok(tok.apply_chat_template(CONV, tokenize=False), add_special_tokens=False)["input_ids"]
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    runs = _runs(mask)
    assert [tok.decode(ids[a:b]) for a, b in runs] == [CONV[2]["content"] + "<|im_end|>",
                                                        CONV[4]["content"] + "<|im_end|>"]
    for a, b in runs:
        assert ids[a - len(header):a] == header and ids[a - len(header)] == im_start  # header unsupervised
        assert ids[b - 1] == im_end and mask[b] == 0  # end-of-turn supervised, the "\n" after it not
    expected = sum(len(tok(m["content"], add_special_tokens=False)["input_ids"]) + 1
                   for m in CONV if m["role"] == "assistant")
    assert sum(mask) == expected


def test_default_system_prompt_is_unsupervised(tok):
    out = tokenize_conversation(tok, CONV[1:3], max_length=4096)
    text = tok.decode(out["input_ids"])
    assert text.startswith("<|im_start|>system\n") and "SmolLM" in text  # the template's default
    (a, b), = _runs(out["loss_mask"])
    assert tok.decode(out["input_ids"][a:b]) == CONV[2]["content"] + "<|im_end|>"


@pytest.mark.slow
def test_offsets_method_matches_prefix_token_reference_on_real_sharegpt(tok):
    from drafterkit.assets.pinned import fetch

    convs = []
    for conv in iter_sharegpt(fetch("sharegpt"), stats=LoaderStats()):
        if len(conv.messages) >= 4 and sum(len(m["content"]) for m in conv.messages) < 6000:
            convs.append(conv.messages)
        if len(convs) == 24:
            break
    for msgs in convs:
        try:
            fast = tokenize_conversation(tok, msgs, 4096, method="offsets")
        except SkipExample as skip:
            with pytest.raises(SkipExample) as ref_skip:
                tokenize_conversation(tok, msgs, 4096, method="prefix_tokens")
            assert ref_skip.value.reason == skip.reason
            continue
        assert fast == tokenize_conversation(tok, msgs, 4096, method="prefix_tokens")


def test_truncation_keeps_mask_alignment(tok):
    full = tokenize_conversation(tok, CONV, max_length=4096)
    (a1, b1), (a2, _) = _runs(full["loss_mask"])
    for n in (b1, a2 + 2, len(full["input_ids"]) - 1):
        cut = tokenize_conversation(tok, CONV, max_length=n)
        assert cut == {k: v[:n] for k, v in full.items()}
    with pytest.raises(SkipExample) as skip:
        tokenize_conversation(tok, CONV, max_length=a1)
    assert skip.value.reason == "no_supervised_token_after_truncation"


@pytest.mark.parametrize("messages, reason", [
    ([{"role": "user", "content": "q"}], "no_assistant_turn"),
    ([{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], "assistant_before_user"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "see <|im_end|> here"}],
     "special_token_in_content"),
])
def test_unusable_conversations_are_skips_with_reasons(tok, messages, reason):
    with pytest.raises(SkipExample) as skip:
        tokenize_conversation(tok, messages, max_length=512)
    assert skip.value.reason == reason


def test_bad_arguments_raise_clear_errors(tok):
    with pytest.raises(ValueError, match="bad message"):
        tokenize_conversation(tok, [{"from": "human", "value": "q"}], max_length=64)
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        tokenize_conversation(tok, CONV, max_length=0)
    with pytest.raises(ValueError, match="unknown method"):
        tokenize_conversation(tok, CONV, max_length=64, method="magic")


def test_padding_never_changes_which_tokens_are_supervised(tok):
    examples = [tokenize_conversation(tok, c, max_length=4096) for c in (CONV, CONV[1:3], CONV[:3])]
    batch = collate(examples, pad_token_id=tok.pad_token_id, pad_to_multiple_of=8)
    B, T = batch["input_ids"].shape
    assert B == 3 and T % 8 == 0 and T >= max(len(e["input_ids"]) for e in examples)
    for b, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert batch["input_ids"][b, :n].tolist() == ex["input_ids"]
        assert batch["loss_mask"][b].tolist() == ex["loss_mask"] + [0] * (T - n)
        assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (T - n)
        assert (batch["input_ids"][b, n:] == tok.pad_token_id).all()
        labels = shift_for_next_token(batch)[b]
        alone = shift_for_next_token(collate([ex], pad_token_id=tok.pad_token_id))[0]
        assert labels[:n].tolist() == alone.tolist() and (labels[n:] == IGNORE_INDEX).all()


def test_label_alignment_is_the_documented_one():
    P1, P2, P3, P4, A1, A2, A3, E = 11, 12, 13, 14, 21, 22, 23, 2
    long = {"input_ids": [P1, P2, P3, P4, A1, A2, A3, E], "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1]}
    short = {"input_ids": [P3, P4, A1, E], "loss_mask": [0, 0, 1, 1]}
    batch = collate([short, long], pad_token_id=0)
    labels = shift_for_next_token(batch)
    assert labels.shape == (2, 8)
    pairs = [[(batch["input_ids"][b, t].item(), labels[b, t].item())
              for t in range(8) if labels[b, t] != IGNORE_INDEX] for b in range(2)]
    assert pairs[1] == [(P4, A1), (A1, A2), (A2, A3), (A3, E)]
    assert pairs[0] == [(P4, A1), (A1, E)]
    assert labels[0, 3:].tolist() == [IGNORE_INDEX] * 5  # nothing is predicted from E or padding


def test_real_sample_first_prediction_is_from_header_newline(tok):
    ex = tokenize_conversation(tok, CONV[1:3], max_length=4096)
    batch = collate([ex], pad_token_id=tok.pad_token_id)
    labels = shift_for_next_token(batch)[0]
    sup = (labels != IGNORE_INDEX).nonzero().flatten().tolist()
    ids = ex["input_ids"]
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[sup[0] + 1 - len(header):sup[0] + 1] == header  # the header's last token ("\n") predicts A1
    assert labels[sup[0]].item() == ids[sup[0] + 1] and ex["loss_mask"][sup[0]] == 0
    assert labels[sup[-1]].item() == tok.convert_tokens_to_ids("<|im_end|>")
    assert len(sup) == sum(ex["loss_mask"])


def test_collate_errors():
    with pytest.raises(ValueError, match="empty batch"):
        collate([], pad_token_id=0)
    with pytest.raises(ValueError, match="pad_token_id is None"):
        collate([{"input_ids": [1], "loss_mask": [0]}], pad_token_id=None)
    with pytest.raises(ValueError, match="same non-zero length"):
        collate([{"input_ids": [1, 2], "loss_mask": [0]}], pad_token_id=0)


def _sharegpt_file(path, n=40, seed=0):
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "token", "draft", "target", "verify", "accept", "tree", "chain",
             "bonus"]
    records = [{"id": f"r{i}_0", "conversations": [
        {"from": "human", "value": f"user{i} " + " ".join(rng.choices(words, k=rng.randint(3, 30)))},
        {"from": "gpt", "value": " ".join(rng.choices(words, k=rng.randint(3, 60)))}]} for i in range(n)]
    path.write_text(json.dumps(records))
    return path


def test_build_dataset_caches_and_splits_disjointly(tok, tmp_path):
    src = _sharegpt_file(tmp_path / "sg.json")
    kw = dict(max_length=64, heldout_fraction=0.25, seed=1, cache_dir=tmp_path / "cache")
    s1, s2 = DataStats(), DataStats()
    train = build_dataset(src, tok, stats=s1, **kw)
    again = build_dataset(src, tok, stats=s2, **kw)
    assert (s1.cache_hit, s2.cache_hit) == (False, True)
    assert train[:] == again[:] and s2.examples == s1.examples == len(train)
    assert set(train.column_names) == {"input_ids", "loss_mask", "length"}
    assert all(len(r["input_ids"]) == len(r["loss_mask"]) == r["length"] <= 64 for r in train)
    assert s1.tokens == sum(train["length"]) and s1.supervised_tokens == sum(map(sum, train["loss_mask"]))
    held = build_dataset(src, tok, split="heldout", **kw)
    assert len(train) + len(held) == 40 and len(held) == sum(is_heldout(f"r{i}", 0.25, 1) for i in range(40))
    def user_of(ds):
        return {tok.decode(r["input_ids"]).split("<|im_start|>user\n")[1].split()[0] for r in ds}

    assert not user_of(train) & user_of(held)
    prompts = heldout_prompts(src, 3, seed=1, fraction=0.25)
    assert {p[-1]["content"].split()[0] for p in prompts} <= user_of(held)
    fewer = DataStats()
    assert len(build_dataset(src, tok, num_examples=5, stats=fewer, **kw)) == 5 and not fewer.cache_hit



def test_build_dataset_warns_of_every_dropped_line_and_a_short_dataset_on_every_call(tok, tmp_path):
    """A torn last line and a record without ``messages`` are named (the file's one warning), and a file
    smaller than ``num_examples`` says so with both numbers, on a fresh build AND on a cache hit."""
    def chat(i):
        return json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                        {"role": "assistant", "content": f"answer {i}"}]})

    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join([chat(0), '{"foo": 1}', chat(1), chat(2)]) + "\n" + chat(3)[:30])
    kw = {"max_length": 64, "num_examples": 1200, "heldout_fraction": 0.0, "cache_dir": tmp_path / "cache",
          "format": "chat"}
    for hit in (False, True):
        stats = DataStats()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ds = build_dataset(src, tok, stats=stats, **kw)
        said = [str(w.message) for w in caught if issubclass(w.category, UserWarning) and str(src) in str(w.message)]
        assert len(ds) == 3 and stats.cache_hit is hit and len(said) == 2, said
        assert said[0].startswith(f"{src}: skipped 1 unreadable line (5); kept the 4 complete records: the file is "
                                  "truncated: dropped 1 incomplete record at line 5; also skipped 1 record that is "
                                  "JSON but not a conversation (line 2; 1 missing_messages)")
        assert said[1] == (f"{src}: 3 train examples, fewer than the 1200 asked (data.num_examples); training uses "
                           "the 3: add data to the file, or lower data.num_examples")
    src.write_text(chat(0) + "\n")  # one example of 1200, nothing dropped: the shortfall alone
    with pytest.warns(UserWarning, match=r"chat.jsonl: 1 train example, fewer than the 1200 asked") as caught:
        build_dataset(src, tok, **kw)
    assert sum("chat.jsonl" in str(w.message) for w in caught) == 1

def test_build_dataset_argument_errors(tok, tmp_path):
    src = _sharegpt_file(tmp_path / "sg.json", n=4)
    with pytest.raises(ValueError, match="split must be"):
        build_dataset(src, tok, max_length=64, split="test", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a file nor a pinned asset"):
        build_dataset(tmp_path / "nope.json", tok, max_length=64, cache_dir=tmp_path)
    with pytest.raises(Exception, match="no train example survived"):
        build_dataset(src, tok, max_length=8, cache_dir=tmp_path)


def test_stats_entry_point(tok, tmp_path, capsys):
    src = _sharegpt_file(tmp_path / "sg.json", n=12)
    assert data.main(["--stats", "--source", str(src), "--max-length", "48",
                      "--cache-dir", str(tmp_path / "c")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["first_run"]["cache_hit"] is False and out["second_run"]["cache_hit"] is True
    assert out["loader"]["kept"] == 12 and 0 < out["supervised_fraction"] < 1
    assert out["examples"] + out["other_split"] + sum(out["skipped"].values()) == 12


def test_labels_follow_the_mask_for_a_real_causal_lm_loss(tiny_target):
    """Our labels give the same loss as transformers' causal-LM loss (which shifts internally)."""
    model = tiny_target
    batch = collate([{"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1]},
                     {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}], pad_token_id=0)
    labels = shift_for_next_token(batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ours = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    hf_labels = torch.where(batch["loss_mask"].bool(), batch["input_ids"], torch.full_like(labels, -100))
    theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=hf_labels).loss
    torch.testing.assert_close(ours, theirs)


def test_recipe_data_file_is_data_path_for_either_source_and_format_is_enforced(tok, tmp_path):
    from drafterkit.train.recipe import RecipeError, recipe_from_dict
    from drafterkit.train.recipe_data import recipe_data_file

    src = _sharegpt_file(tmp_path / "sg.json", n=8)
    sharegpt = recipe_from_dict({"output_dir": "x", "data": {"source": "sharegpt", "path": str(src)}})
    assert recipe_data_file(sharegpt.data) == (src, "sharegpt")
    assert recipe_data_file(recipe_from_dict({"output_dir": "x"}).data) == ("sharegpt", "auto")
    chat = recipe_from_dict({"output_dir": "x", "data": {"source": "jsonl", "path": str(src)}})
    assert recipe_data_file(chat.data) == (src, "chat")
    missing = recipe_from_dict({"output_dir": "x", "data": {"path": str(tmp_path / "nope.json")}})
    with pytest.raises(RecipeError, match=r"data\.path: .*nope\.json.* is not a file.*ShareGPT"):
        recipe_data_file(missing.data)
    with pytest.raises(ValueError, match="no usable conversation"):  # a ShareGPT file read as chat JSONL
        build_dataset(src, tok, max_length=64, cache_dir=tmp_path / "c", format="chat")
    assert len(build_dataset(src, tok, max_length=64, cache_dir=tmp_path / "c", format="sharegpt")) > 0


@pytest.mark.parametrize("content,message", [("", "is empty"), ("[]", "no usable conversation"),
                                             (None, "neither a file nor a pinned asset")])
def test_stats_entry_point_bad_source_is_a_clean_error(tmp_path, capsys, content, message):
    src = tmp_path / "bad.json"
    if content is not None:
        src.write_text(content)
    assert data.main(["--stats", "--source", str(src), "--cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "python -m drafterkit.train.data: error: " in err and message in err and "Traceback" not in err


def test_regenerate_replaces_responses_with_the_targets_greedy_continuations(tmp_path):
    """Regeneration keeps prompt tokens unsupervised, supervises exactly the target's greedy continuation
    (what decode.generate returns for that prompt alone), keeps the source order, drops prompts with no
    room for the generation, and is a cache hit the second time."""
    import datasets
    from conftest import tiny_llama

    from drafterkit.decode import engine
    from drafterkit.train.regenerate import regenerate_dataset

    target = tiny_llama(0)
    g = torch.Generator().manual_seed(0)
    lengths = [5, 3, 9, 4, 30, 6]  # 30: no room for 8 new tokens inside max_length 32
    rows = {"input_ids": [], "loss_mask": []}
    for n in lengths:
        prompt = torch.randint(3, 128, (n,), generator=g).tolist()
        rows["input_ids"].append(prompt + [7, 8, 9])  # a "dataset" response that must be replaced
        rows["loss_mask"].append([0] * n + [1, 1, 1])
    ds = datasets.Dataset.from_dict(rows)
    out = regenerate_dataset(ds, target, max_new_tokens=8, batch_size=2, max_length=32, cache_dir=tmp_path,
                             progress=False)
    kept = [i for i, n in enumerate(lengths) if n <= 32 - 8]
    assert len(out) == len(kept)
    for row, i in zip(out, kept):
        prompt = rows["input_ids"][i][:lengths[i]]
        alone = engine.generate(target, [prompt], max_new_tokens=8, temperature=0.0).sequences[0]
        assert row["input_ids"] == prompt + list(alone)
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(alone)
        assert row["length"] == len(row["input_ids"])
    again = regenerate_dataset(ds, target, max_new_tokens=8, batch_size=3, max_length=32, cache_dir=tmp_path,
                               progress=False)
    assert again["input_ids"] == out["input_ids"]
    assert len(list(tmp_path.iterdir())) == 1  # one cache folder, no temp left behind

    with pytest.raises(ValueError, match="regenerate_max_new_tokens"):
        regenerate_dataset(ds, target, max_new_tokens=31, max_length=32, cache_dir=tmp_path, progress=False)
