"""Shared fixtures: tiny seeded random Llama models built from config dicts, the real target, and a training
world (a tiny target folder with the real tokenizer, a chat JSONL, a private DRAFTERKIT_HOME)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import torch

TINY_VOCAB = 128


def tiny_llama(seed: int = 0, *, vocab_size: int = TINY_VOCAB, hidden_size: int = 32, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, intermediate: int = 64, tie: bool = False):
    """A seeded random LlamaForCausalLM, fp32, eval mode, frozen. Same seed -> same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                      intermediate_size=intermediate, max_position_embeddings=512,
                      tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    # Random init gives near-uniform logits; sharpen them so greedy/sampling behave like an LM.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.requires_grad_(False)
    return model


@pytest.fixture
def tiny_target():
    return tiny_llama(0)


@pytest.fixture
def tiny_draft():
    return tiny_llama(1, layers=1)


@pytest.fixture(scope="session")
def real_target():
    """The real default target (SmolLM2-135M-Instruct, fp32, CPU), fetched once into DRAFTERKIT_HOME."""
    from drafterkit.assets.target import load_target

    return load_target("smollm2-135m", dtype="float32", device="cpu")


@pytest.fixture(autouse=True)
def _drafterkit_env_is_left_as_found():
    """A test (or a script it calls) that sets a ``DRAFTERKIT_*`` variable and leaves it set would point every
    later test at its folders (a leaked DRAFTERKIT_HOME hid the vLLM venv from the serving tests): such a
    leak fails the test that made it, and the variables are put back so later tests run as they would alone."""
    before = {k: v for k, v in os.environ.items() if k.startswith("DRAFTERKIT_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("DRAFTERKIT_")}
    if after != before:
        for k in after.keys() - before.keys():
            del os.environ[k]
        os.environ.update(before)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        pytest.fail(f"the test left {changed} changed in os.environ: set them with monkeypatch.setenv or restore "
                    "them in a finally block", pytrace=False)


def require_vllm_python() -> str:
    """vLLM's venv python (``scripts/vllm-venv.sh``) for the tests that run real vLLM: they skip without it, except
    where ``DRAFTERKIT_REQUIRE_VLLM=1`` (CI) makes its absence a failure, so a green CI means they ran."""
    from drafterkit.speceval import serve_parity

    try:
        return serve_parity.vllm_python()
    except serve_parity.ServeCheckError as exc:
        if os.environ.get("DRAFTERKIT_REQUIRE_VLLM") == "1":
            pytest.fail(f"DRAFTERKIT_REQUIRE_VLLM=1 but {exc}")
        pytest.skip(str(exc))


#: intra-op threads for the real target's tests (``slow``); every other test runs on one
REAL_MODEL_THREADS = max(1, min(4, os.cpu_count() or 1))


def pytest_configure(config):
    torch.set_num_threads(1)


# --- test tiers: `pytest -q` runs the fast tier, `pytest -q --all` every test (what .ci/run runs) ---

#: markers of the tests the fast tier leaves out (pyproject.toml registers them)
FULL_SUITE_ONLY = ("slow", "serving", "matrix", "multiprocess")
_LEFT_OUT = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", dest="all_tiers",
                     help=f"run every test, the {' / '.join(FULL_SUITE_ONLY)} ones too (what .ci/run runs)")


def _fast_tier(config) -> bool:
    """The fast tier applies unless ``--all`` or ``-m EXPR`` is given, or every argument names a test file or a
    test (``pytest tests/test_x.py`` runs all of that file's tests); a folder, or none, gets the fast tier."""
    if config.getoption("all_tiers") or config.option.markexpr:
        return False
    args = [a.split("::")[0] for a in config.args]
    return not args or any(Path(config.invocation_params.dir, a).is_dir() for a in args)


def pytest_collection_modifyitems(config, items):
    if not _fast_tier(config):
        return
    keep, left = [], []
    for item in items:
        (left if any(item.get_closest_marker(m) for m in FULL_SUITE_ONLY) else keep).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep
        config.stash[_LEFT_OUT] = len(left)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left = config.stash.get(_LEFT_OUT, 0)
    if left:
        terminalreporter.write_line(f"fast tier: {left} {' / '.join(FULL_SUITE_ONLY)} tests left out; "
                                    "`pytest -q --all` runs every test (README, \"Tests\")")


@pytest.fixture(autouse=True)
def _threads(request):
    """One intra-op thread, except for ``slow`` tests (the real target): the tiny models' ops are too small to gain
    from a second thread, and on a loaded 2-core machine the threads of each op wait for each other (a tiny
    decoding test took 5-15x its one-thread time with two)."""
    if request.node.get_closest_marker("slow") is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(REAL_MODEL_THREADS)
    yield
    torch.set_num_threads(before)


def greedy_continuation_batch(target, n_prompts: int = 24, prompt_len: int = 4, new_tokens: int = 20, seed: int = 0):
    """A training batch of the target's own greedy continuations of random prompts (loss on the
    continuation only), plus the generator for drawing more prompts: ``(batch, generator)``."""
    from drafterkit.decode import engine

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 128, (prompt_len,), generator=g).tolist() for _ in range(n_prompts)]
    res = engine.generate(target, prompts, max_new_tokens=new_tokens, eos_token_id=[])
    ids = torch.tensor([p + s for p, s in zip(prompts, res.sequences)])
    lm = torch.zeros_like(ids)
    lm[:, prompt_len:] = 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": lm}, g


def acceptance_before_after(kind: str, drafter, target, batch, recipe, prompts, *, k: int, lr: float,
                            steps: int = 40) -> tuple[float, float]:
    """Measured acceptance rate (decode.generate on ``prompts``, 16 new tokens, K=``k``) of ``drafter``
    before and after ``steps`` Adam steps of ``kind``'s training loss on ``batch``."""
    from drafterkit.decode import engine
    from drafterkit.train.strategies import get_strategy

    def rate():
        drafter.eval()
        return engine.generate(target, prompts, drafter=drafter, max_new_tokens=16,
                               num_draft_tokens=k).stats.acceptance_rate

    before = rate()
    drafter.train()
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        loss, _ = get_strategy(kind).loss(drafter, target, batch, recipe)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, rate()


# --- a training world: a tiny target with the real tokenizer, a chat JSONL, a private DRAFTERKIT_HOME ---

SMOLLM2_VOCAB = 49152


def save_tiny_target(folder: Path, *, layers: int = 2, **shape):
    """A tiny seeded random Llama (hidden 32; ``shape``: other :func:`tiny_llama` sizes) with SmolLM2's vocabulary
    and real tokenizer (its EOS too), saved to ``folder`` as a target folder (weights, config, tokenizer):
    ``(model, tokenizer)``."""
    from transformers import AutoTokenizer

    from drafterkit.assets.pinned import default_target_dir

    tok = AutoTokenizer.from_pretrained(default_target_dir())
    model = tiny_llama(0, vocab_size=SMOLLM2_VOCAB, **{"hidden_size": 32, **shape}, layers=layers)
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


CHAT_WORDS = "the cat sat on a mat and then ran to the big red house where a dog slept all day".split()


def private_home(root: Path, chats: list[tuple[str, str]]):
    """A fixture body: ``DRAFTERKIT_HOME`` set to ``root / "home"`` and ``root / "chat.jsonl"`` written from
    ``chats`` ((user, assistant) pairs) while the fixture lives; yields ``root``, then restores the variable."""
    old = os.environ.get("DRAFTERKIT_HOME")
    os.environ["DRAFTERKIT_HOME"] = str(root / "home")
    write_chats(root / "chat.jsonl", chats)
    yield root
    if old is None:
        os.environ.pop("DRAFTERKIT_HOME", None)
    else:
        os.environ["DRAFTERKIT_HOME"] = old


def random_chats(answer_words: list[int], prompt_words: int, seed: int = 0) -> list[tuple[str, str]]:
    """Synthetic (prompt, answer) pairs of :data:`CHAT_WORDS` drawn with ``random.Random(seed)``: one pair per
    entry of ``answer_words`` (that answer's word count), each prompt ``prompt_words`` words."""
    import random

    rnd = random.Random(seed)
    return [(" ".join(rnd.choices(CHAT_WORDS, k=prompt_words)), " ".join(rnd.choices(CHAT_WORDS, k=n)))
            for n in answer_words]


def write_chats(path: Path, chats: list[tuple[str, str]]) -> Path:
    """A chat JSONL (``{"id": "c<i>", "messages": [user, assistant]}`` per line) of ``(user, assistant)`` pairs."""
    with open(path, "w") as f:
        for i, (user, assistant) in enumerate(chats):
            msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}) + "\n")
    return path


@contextlib.contextmanager
def training_world(root: Path, chats: list[tuple[str, str]], *, layers: int = 2, **shape):
    """``root/target`` (:func:`save_tiny_target`, ``shape`` its sizes) and ``root/chat.jsonl`` (:func:`write_chats`);
    inside, ``DRAFTERKIT_HOME`` is ``root/home`` (dataset and feature caches stay in tmp), restored on exit.
    Yields ``(target, tokenizer)``."""
    model, tok = save_tiny_target(root / "target", layers=layers, **shape)
    write_chats(root / "chat.jsonl", chats)
    old = os.environ.get("DRAFTERKIT_HOME")
    os.environ["DRAFTERKIT_HOME"] = str(root / "home")
    try:
        yield model, tok
    finally:
        if old is None:
            os.environ.pop("DRAFTERKIT_HOME", None)
        else:
            os.environ["DRAFTERKIT_HOME"] = old


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    """A prompts JSONL (``drafterkit eval --benchmark FILE``): one ``prompt`` line, one ``messages`` line."""
    path = tmp_path_factory.mktemp("prompts") / "mine.jsonl"
    lines = [{"prompt": "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):"},
             {"messages": [{"role": "user", "content": "List the days of the week, then list them again."}]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path
