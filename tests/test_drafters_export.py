"""`drafterkit export`: vLLM/SGLang EAGLE-3 layout, vLLM Medusa layout, HF assistant folder, push-to-hub offline."""

from __future__ import annotations

import json
import time

import pytest
import torch
from conftest import tiny_llama
from safetensors.torch import load_file

from drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafters.export import ExportError, export, push_to_hub
from drafters.medusa import MedusaConfig, MedusaDrafter
from train.cli import main as cli


def _eagle3_ckpt(tmp_path):
    target = tiny_llama(0, layers=4)
    d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=40), target=target)
    d.set_draft_vocab(torch.arange(40) * 3, target=target)
    return d, d.save_pretrained(tmp_path / "e3")


@pytest.mark.parametrize("fmt", ["vllm-eagle3", "sglang-eagle3"])
def test_eagle3_export_uses_the_engine_layout(tmp_path, fmt):
    d, ckpt = _eagle3_ckpt(tmp_path)
    assert cli(["export", str(ckpt), "--format", fmt, "--output", str(tmp_path / "out"), "--dtype", "bf16"]) == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 40 and cfg["vocab_size"] == 128 and cfg["num_hidden_layers"] == 1
    assert cfg["target_hidden_size"] == 32 and cfg["torch_dtype"] == "bfloat16"
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(d.feature_layers)
    w = load_file(str(tmp_path / "out" / "model.safetensors"))
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                "midlayer.post_attention_layernorm.weight"}
    expected |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    expected |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert set(w) == expected
    assert w["fc.weight"].shape == (32, 96) and w["midlayer.self_attn.q_proj.weight"].shape[1] == 64
    assert w["lm_head.weight"].shape == (40, 32) and w["lm_head.weight"].dtype == torch.bfloat16
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert torch.equal(torch.arange(40) + w["d2t"], torch.arange(40) * 3)
    assert int(w["t2d"].sum()) == 40


def test_medusa_export_shared_head_needs_the_target(tmp_path):
    target = tiny_llama(0)
    d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)
    ckpt = d.save_pretrained(tmp_path / "m")
    with pytest.raises(ExportError, match="--target"):
        export(ckpt, "medusa", tmp_path / "out")
    target_dir = tmp_path / "target"  # a local folder path as the target
    target.save_pretrained(target_dir)
    assert cli(["export", str(ckpt), "--format", "medusa", "--output", str(tmp_path / "out"),
                "--target", str(target_dir)]) == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["MedusaModel"] and cfg["num_heads"] == 3 and cfg["original_lm_head"]
    w = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(w) == {f"blocks.{k}.layers.0.{p}" for k in range(3) for p in ("weight", "bias")} | {"lm_heads.0.weight"}
    assert torch.equal(w["lm_heads.0.weight"], target.lm_head.weight)


def test_medusa_export_own_heads(tmp_path):
    target = tiny_llama(0)
    d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False), target=target)
    w = load_file(str(export(d.save_pretrained(tmp_path / "m"), "medusa", tmp_path / "o") / "model.safetensors"))
    assert {"lm_heads.0.weight", "lm_heads.1.weight", "blocks.1.layers.0.bias"} <= set(w)


def test_hf_assistant_export_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from drafters.draft_lm import DraftLM

    target = tiny_llama(0)
    d = DraftLM.from_target(target, 1)
    out = export(d.save_pretrained(tmp_path / "dl"), "hf-assistant", tmp_path / "hf")
    lm = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(lm(ids).logits, d.lm(ids).logits, atol=1e-5)


def _open_mode(tmp_path) -> int:
    """The mode a plain open() gives a new file under this process's umask."""
    probe = tmp_path / "probe.txt"
    probe.write_text("x")
    return probe.stat().st_mode & 0o777


def test_weight_files_get_the_umask_mode_not_owner_only(tmp_path):
    from drafters.draft_lm import DraftLM

    mode = _open_mode(tmp_path)
    _, e3 = _eagle3_ckpt(tmp_path)
    target = tiny_llama(0)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False), target=target)
    draft = DraftLM.from_target(target, 1)
    outs = [e3]
    for fmt, ckpt in (("vllm-eagle3", e3), ("sglang-eagle3", e3),
                      ("medusa", medusa.save_pretrained(tmp_path / "m")),
                      ("hf-assistant", draft.save_pretrained(tmp_path / "dl"))):
        outs += [tmp_path / "m", tmp_path / "dl", tmp_path / fmt]
        assert cli(["export", str(ckpt), "--format", fmt, "--output", str(tmp_path / fmt)]) == 0
    files = {f: oct(f.stat().st_mode & 0o777) for out in outs for f in out.iterdir()}
    assert sum(f.suffix == ".safetensors" for f in files) >= 7
    assert set(files.values()) == {oct(mode)}, files


@pytest.mark.parametrize("fmt", ["vllm-eagle3", "sglang-eagle3", "medusa"])
def test_an_export_loaded_back_is_a_clear_error_naming_its_format(tmp_path, fmt, capsys):
    from drafters import DrafterLoadError, load_drafter

    target = tiny_llama(0, layers=4)
    if fmt == "medusa":
        ckpt = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False),
                             target=target).save_pretrained(tmp_path / "m")
    else:
        ckpt = _eagle3_ckpt(tmp_path)[1]
    out = export(ckpt, fmt, tmp_path / "out")
    with pytest.raises(DrafterLoadError, match=f"is a {fmt} export .*drafterkit eval --drafter RUN/checkpoints/last"):
        load_drafter(out, target)
    assert cli(["export", str(out), "--format", fmt, "--output", str(tmp_path / "again")]) == 2
    assert f"is a {fmt} export" in capsys.readouterr().err and not (tmp_path / "again").exists()


def test_wrong_kind_for_format_is_a_clear_error(tmp_path):
    _, ckpt = _eagle3_ckpt(tmp_path)
    with pytest.raises(ExportError, match="formats for 'eagle3'"):
        export(ckpt, "medusa", tmp_path / "x")
    assert cli(["export", str(tmp_path / "nowhere"), "--format", "medusa", "--output", str(tmp_path / "y")]) == 2


def test_push_to_hub_fails_fast_offline(tmp_path, monkeypatch, capsys):
    _, ckpt = _eagle3_ckpt(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    rc = cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / "o"),
              "--push-to-hub", "someone/my-eagle3"])
    assert rc == 2 and time.perf_counter() - start < 30
    err = capsys.readouterr().err
    assert "not reachable" in err and (tmp_path / "o" / "config.json").exists()
    with pytest.raises(ExportError, match="owner/name"):
        push_to_hub(tmp_path / "o", str(tmp_path))  # a local folder is not a Hub repo id


def _run_dir(tmp_path, *, best: bool):
    """A fake training run: OUTPUT_DIR/checkpoints/{last,best}/drafter (+ the training state beside it)."""
    from drafters.draft_lm import DraftLM

    target = tiny_llama(0)
    run = tmp_path / "run"
    d_last = DraftLM.from_target(target, 1)
    d_last.save_pretrained(run / "checkpoints" / "last" / "drafter")
    (run / "checkpoints" / "last" / "state").mkdir()
    d_best = DraftLM.from_target(target, 2) if best else None
    if best:
        d_best.save_pretrained(run / "checkpoints" / "best" / "drafter")
    return run, d_last, d_best


def test_one_resolver_for_drafter_folders_training_checkpoints_and_run_dirs(tmp_path):
    from drafters import DrafterLoadError, load_drafter, resolve_checkpoint

    run, _, _ = _run_dir(tmp_path, best=False)
    last = run / "checkpoints" / "last"
    assert resolve_checkpoint(last) == (last / "drafter", "draft_lm")
    assert resolve_checkpoint(last / "drafter") == (last / "drafter", "draft_lm")
    assert resolve_checkpoint(run) == (last / "drafter", "draft_lm")  # no best yet: last
    (run / "checkpoints" / "best" / "drafter").mkdir(parents=True)  # an incomplete best is skipped
    assert resolve_checkpoint(run)[0] == last / "drafter"
    run2, _, _ = _run_dir(tmp_path / "two", best=True)
    assert resolve_checkpoint(run2)[0] == run2 / "checkpoints" / "best" / "drafter"
    assert load_drafter(run2).config.num_layers == 2 and load_drafter(last).config.num_layers == 1
    with pytest.raises(DrafterLoadError, match=r"nowhere is not a drafter checkpoint: found nothing"):
        resolve_checkpoint(tmp_path / "nowhere")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "notes.txt").write_text("x")
    with pytest.raises(DrafterLoadError, match=r"found \['notes.txt'\].*training checkpoint holding drafter/"):
        resolve_checkpoint(tmp_path / "odd")


def test_export_takes_a_training_checkpoint_or_run_dir(tmp_path):
    from transformers import AutoModelForCausalLM

    run, d_last, _ = _run_dir(tmp_path, best=False)
    for src, out in ((run / "checkpoints" / "last", "e1"), (run, "e2")):
        assert cli(["export", str(src), "--format", "hf-assistant", "--output", str(tmp_path / out)]) == 0
        lm = AutoModelForCausalLM.from_pretrained(tmp_path / out)
        ids = torch.tensor([[3, 4, 5]])
        with torch.no_grad():
            assert torch.allclose(lm(ids).logits, d_last.lm(ids).logits, atol=1e-5)


def test_export_error_names_what_was_found(tmp_path, capsys):
    (tmp_path / "ck" / "state").mkdir(parents=True)
    assert cli(["export", str(tmp_path / "ck"), "--format", "medusa", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "found ['state/']" in err and "checkpoints/last" in err and not (tmp_path / "o").exists()


def test_push_to_hub_checks_the_hub_before_writing(tmp_path, monkeypatch, capsys):
    import drafters.export as ex

    _, ckpt = _eagle3_ckpt(tmp_path)
    order = []
    real_export = ex.export
    monkeypatch.setattr(ex, "hub_reachable", lambda timeout=3.0: order.append("hub") or False)
    monkeypatch.setattr(ex, "export", lambda *a, **kw: order.append("export") or real_export(*a, **kw))
    rc = cli(["export", str(ckpt), "--format", "vllm-eagle3", "--push-to-hub", "someone/x"])
    assert rc == 2 and order == ["hub"]  # no --output: nothing written at all
    assert "not reachable" in capsys.readouterr().err
    order.clear()
    rc = cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / "o"),
              "--push-to-hub", "someone/x"])
    assert rc == 2 and order == ["hub", "export"] and (tmp_path / "o" / "config.json").exists()
    err = capsys.readouterr().err
    assert err.index("not reachable") < err.index("not pushed") and "export is complete" in err
    order.clear()
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / "p"),
                "--push-to-hub", "not-a-repo"]) == 2
    assert order == [] and not (tmp_path / "p").exists()
