"""`drafterkit export`: vLLM/SGLang EAGLE-3 layout, vLLM Medusa layout, HF assistant folder, push-to-hub offline."""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch
from conftest import tiny_llama
from safetensors.torch import load_file

from drafterkit.cli import main as cli
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.export.eagle3_layout import layer_ids_refusal
from drafterkit.drafters.export.writers import ExportError, export, push_to_hub
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter


def _eagle3_ckpt(tmp_path, n=40, layers=(1, 2, 3), num_layers=4, seed=0, head_layers=1):
    """An EAGLE-3 checkpoint for a tiny target of ``num_layers`` layers: draft vocabulary ``n`` (every third
    target id when reduced), feature layer ids ``layers``, ``head_layers`` decoder layers, weights perturbed so
    nothing is trivially equal."""
    target = tiny_llama(0, layers=num_layers)
    torch.manual_seed(seed)
    d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=n, feature_layers=list(layers),
                                               num_layers=head_layers), target=target)
    d.set_draft_vocab(torch.arange(n) * 3 if n < 128 else torch.arange(n), target=target)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith(d.borrowed_prefixes):
                p.add_(torch.randn(p.shape) * 0.1)
    return d, d.save_pretrained(tmp_path / f"e3-{n}-{'-'.join(map(str, layers))}-{head_layers}")


@pytest.mark.parametrize("fmt", ["vllm-eagle3", "sglang-eagle3"])
def test_eagle3_export_uses_the_engine_layout(tmp_path, fmt):
    d, ckpt = _eagle3_ckpt(tmp_path)
    assert cli(["export", str(ckpt), "--format", fmt, "--output", str(tmp_path / "out"), "--dtype", "bf16"]) == 0
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 40 and cfg["vocab_size"] == 128 and cfg["num_hidden_layers"] == 1
    assert cfg["target_hidden_size"] == 32 and cfg["torch_dtype"] == "bfloat16"
    # drafterkit ids (1, 2, 3) = the inputs of layers 1..3: vLLM reads the same ids, SGLang captures id+1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ([1, 2, 3] if fmt == "vllm-eagle3" else [0, 1, 2])
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


def test_a_multi_layer_eagle3_export_writes_the_layers_vllm_loads_and_sglang_is_refused(tmp_path):
    """num_layers 3: config.json's num_hidden_layers is 3; layer 0 is ``layers.0.*`` (2H-wide q/k/v, hidden_norm),
    layers 1-2 ``layers.{i}.*`` plain Llama layers (vLLM's llama_eagle3 names, no midlayer); it loads back into
    the same head. SGLang stacks later layers with another residual: refused, naming the fix."""
    from drafterkit.drafters.export.writers import load_eagle3_export

    d, ckpt = _eagle3_ckpt(tmp_path, head_layers=3)
    out = export(ckpt, "vllm-eagle3", tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    w = load_file(str(out / "model.safetensors"))
    assert not any(k.startswith("midlayer.") for k in w)
    assert w["layers.0.self_attn.q_proj.weight"].shape[1] == 64 and "layers.0.hidden_norm.weight" in w
    for i in (1, 2):
        assert w[f"layers.{i}.self_attn.q_proj.weight"].shape[1] == 32 and f"layers.{i}.hidden_norm.weight" not in w
        assert {f"layers.{i}.input_layernorm.weight", f"layers.{i}.mlp.down_proj.weight"} <= set(w)
    target = tiny_llama(0, layers=4)
    back = load_eagle3_export(out, target)
    assert back.config.num_layers == 3
    assert all(torch.equal(v, back.own_state_dict()[k]) for k, v in d.own_state_dict().items())
    with pytest.raises(ExportError, match=r"3-layer EAGLE-3 head.*SGLang.*Fix: export with --format vllm-eagle3"):
        export(ckpt, "sglang-eagle3", tmp_path / "s")


def _draft_logits(d, target, tokens):
    """The head's TTT logits on ``tokens`` with the target's features at its own feature layers."""
    with torch.no_grad():
        hs = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in d.feature_layers], -1)
        return [lg for lg in d(torch.tensor([tokens]), feats, steps=2)]


@pytest.mark.parametrize("fmt", ["vllm-eagle3", "sglang-eagle3"])
@pytest.mark.parametrize("n, layers", [(40, (1, 2, 3)), (128, (1, 2, 3)), (128, (3, 1, 2))])
def test_eagle3_export_reloads_for_reduced_and_full_vocabularies(tmp_path, fmt, n, layers):
    """export -> load_eagle3_export gives the same head: the same tensors (fc's input blocks in layer order),
    the same draft ids, the same logits on the target's features; a full vocabulary carries no d2t / t2d
    (vLLM creates draft_id_to_target_id only for draft_vocab_size < vocab_size and loads strictly)."""
    from drafterkit.drafters.export.writers import load_eagle3_export

    d, ckpt = _eagle3_ckpt(tmp_path, n=n, layers=layers)
    target = tiny_llama(0, layers=4)
    out = export(ckpt, fmt, tmp_path / "out")
    w = load_file(str(out / "model.safetensors"))
    assert {"d2t", "t2d"} <= set(w) if n < 128 else not {"d2t", "t2d"} & set(w)
    back = load_eagle3_export(out, target)
    assert back.feature_layers == tuple(sorted(layers)) and back.config.draft_vocab_size == n
    assert torch.equal(back.draft_ids(), d.draft_ids()) and torch.equal(back.t2d, d.t2d)
    mine, theirs = d.own_state_dict(), back.own_state_dict()
    for k in mine:
        if k != "fc.weight" or list(layers) == sorted(layers):
            assert torch.equal(mine[k], theirs[k]), k
    tokens = [5, 17, 33, 2, 90, 41]
    for a, b in zip(_draft_logits(d, target, tokens), _draft_logits(back, target, tokens)):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_full_vocabulary_checkpoint_loads_with_or_without_d2t(tmp_path):
    """drafterkit's own loader takes a full-vocabulary head with or without d2t / t2d (identity); a reduced
    vocabulary still needs both."""
    from safetensors.torch import save_file

    from drafterkit.drafters import DrafterLoadError, load_drafter

    target = tiny_llama(0, layers=4)
    for n in (128, 40):
        d, ckpt = _eagle3_ckpt(tmp_path, n=n)
        assert torch.equal(load_drafter(ckpt, target).draft_ids(), d.draft_ids())
        state = load_file(str(ckpt / "model.safetensors"))
        del state["d2t"], state["t2d"]
        save_file(state, str(ckpt / "model.safetensors"))
        if n == 128:
            back = load_drafter(ckpt, target)
            assert torch.equal(back.draft_ids(), torch.arange(128)) and bool(back.t2d.all())
        else:
            with pytest.raises(DrafterLoadError, match=r"missing tensors \['d2t', 't2d'\]"):
                load_drafter(ckpt, target)


def _with_layers(ckpt, layers):
    """The checkpoint's config.json with other feature layer ids (as an older checkpoint could hold)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["config"]["feature_layers"] = list(layers)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


def test_a_layer_id_the_engine_cannot_express_is_refused_at_export(tmp_path, capsys):
    _, ckpt = _eagle3_ckpt(tmp_path, layers=(0, 2, 3))  # id 0: the embedding output
    assert export(ckpt, "vllm-eagle3", tmp_path / "v").exists()  # vLLM reads hidden_states[0] as id 0
    with pytest.raises(ExportError, match=r"id 0 .*embedding output.* cannot be expressed in SGLang.*"
                                          r"--format vllm-eagle3.*drafter.options.feature_layers"):
        export(ckpt, "sglang-eagle3", tmp_path / "s")
    assert cli(["export", str(ckpt), "--format", "sglang-eagle3", "--output", str(tmp_path / "s")]) == 2
    assert "id 0" in capsys.readouterr().err and not (tmp_path / "s").exists()
    _with_layers(ckpt, (1, 2, 4))  # id L = 4: after the final norm, saved before ids were checked
    for fmt, engine in (("vllm-eagle3", "vLLM"), ("sglang-eagle3", "SGLang")):
        with pytest.raises(ExportError, match=rf"id 4 .*after the final norm.* cannot be expressed in {engine}.*"
                                              r"retrain with drafter.options.feature_layers"):
            export(ckpt, fmt, tmp_path / "x")
    _with_layers(ckpt, (2, 2, 1))  # each engine captures a layer once: 2 features for a 3-feature head
    with pytest.raises(ExportError, match=r"^EAGLE-3 feature layer ids 2, 2, 1 repeat layer 2: vLLM captures each "
                                          r"layer once, so the head needs 3 distinct ids\. Fix: retrain with"):
        export(ckpt, "vllm-eagle3", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    # a 2-layer target's clamped default: said plainly (it read "SGLang reads ids in [1, 1], fewer than 3 layers")
    two = {"feature_layers": [1, 1, 1], "target_num_layers": 2}
    assert layer_ids_refusal("sglang-eagle3", two) == (
        "EAGLE-3 feature layer ids 1, 1, 1 repeat layer 1: SGLang captures each layer once, so the head needs 3 "
        "distinct ids. Fix: train the head for a target of at least 4 layers (SGLang reads only id 1 of a 2-layer "
        "target)")
    assert "(vLLM reads only ids 0, 1 of a 2-layer target)" in layer_ids_refusal("vllm-eagle3", two)
    assert layer_ids_refusal("vllm-eagle3", {"feature_layers": [1, 2, 3], "target_num_layers": 4}) is None


@pytest.mark.parametrize("edit, message", [
    ({"foo": 1}, "unexpected keyword argument 'foo'"),
    ({"feature_layers": "1,2,3"}, "feature_layers"),
    ({"feature_layers": None, "target_num_layers": None}, "config.json"),
])
def test_export_refuses_a_config_eval_would_refuse_in_one_line(tmp_path, capsys, edit, message):
    """export reads the config as every loader does (it used to copy an unknown key through, or stop on a
    KeyError / ValueError traceback for a malformed feature_layers)."""
    _, ckpt = _eagle3_ckpt(tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["config"].update({k: v for k, v in edit.items() if v is not None})
    for k in [k for k, v in edit.items() if v is None]:
        del cfg["config"][k]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    for fmt in ("vllm-eagle3", "sglang-eagle3"):
        assert cli(["export", str(ckpt), "--format", fmt, "--output", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("drafterkit export: error:") and message in err and "Traceback" not in err
        assert not (tmp_path / "out").exists()


# drafterkit ids, L -> what the sglang-eagle3 export's eagle_config holds. SGLang (python/sglang/srt/models/
# llama.py, LlamaForCausalLM.set_eagle3_layers_to_capture and LlamaModel.forward) captures the input of layer j
# for j in layers_to_capture; explicit ids give layers_to_capture = [id + 1 ...], no ids [2, L//2, L-3].
# model_executor/model_runner.py reads the ids from the draft config's eagle_config.eagle_aux_hidden_state_layer_ids.
SGLANG_TABLE = [
    ((2, 15, 27), 30, None),  # the EAGLE-3 default = SGLang's default capture: no ids
    ((1, 15, 27), 30, [0, 14, 26]),
    ((3, 16, 28), 30, [2, 15, 27]),
    ((27, 2, 15), 30, None),  # captured in layer order either way (fc's blocks follow)
    ((1, 2, 29), 30, [0, 1, 28]),
    ((2, 4, 5), 8, None),
    ((1, 4, 5), 8, [0, 3, 4]),
    ((1, 2, 3), 4, [0, 1, 2]),
    ((0, 15, 27), 30, "refused"),
]


@pytest.mark.parametrize("layers, num_layers, held", SGLANG_TABLE)
def test_sglang_export_writes_sglang_layer_ids(tmp_path, layers, num_layers, held):
    _, ckpt = _eagle3_ckpt(tmp_path, layers=layers, num_layers=num_layers)
    if held == "refused":
        with pytest.raises(ExportError, match="id 0"):
            export(ckpt, "sglang-eagle3", tmp_path / "s")
        return
    eagle = json.loads((export(ckpt, "sglang-eagle3", tmp_path / "s") / "config.json").read_text())["eagle_config"]
    assert eagle == ({"use_aux_hidden_state": True} if held is None else
                     {"eagle_aux_hidden_state_layer_ids": held, "use_aux_hidden_state": True})
    # what SGLang then captures: the inputs of layers [id + 1 ...], or of [2, L//2, L-3] without ids
    captured = [i + 1 for i in held] if held is not None else [2, num_layers // 2, num_layers - 3]
    assert captured == sorted(layers)
    vllm = json.loads((export(ckpt, "vllm-eagle3", tmp_path / "v") / "config.json").read_text())["eagle_config"]
    assert vllm["eagle_aux_hidden_state_layer_ids"] == sorted(layers)


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


def _in_a_training_checkpoint(drafter, run, target: str):
    """Save ``drafter`` as training leaves it: ``run/checkpoints/last/drafter`` beside a ``recipe.yaml`` whose
    ``target.name_or_path`` is ``target``. Returns the checkpoint folder."""
    import yaml

    ckpt = run / "checkpoints" / "last"
    drafter.save_pretrained(ckpt / "drafter")
    (ckpt / "recipe.yaml").write_text(yaml.safe_dump({"target": {"name_or_path": target}}))
    return ckpt


def test_medusa_export_reads_the_recorded_target_and_target_still_overrides_it(tmp_path, capsys):
    # as every format: without --target, the target the training recipe records; --target, where given, wins
    target, other = tiny_llama(0), tiny_llama(7)
    target.save_pretrained(tmp_path / "target")
    other.save_pretrained(tmp_path / "other")
    d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target)
    ckpt = _in_a_training_checkpoint(d, tmp_path / "run", str(tmp_path / "target"))
    assert cli(["export", str(ckpt), "--format", "medusa", "--output", str(tmp_path / "out")]) == 0, \
        capsys.readouterr().err
    assert torch.equal(load_file(str(tmp_path / "out" / "model.safetensors"))["lm_heads.0.weight"],
                       target.lm_head.weight)
    assert cli(["export", str(ckpt), "--format", "medusa", "--output", str(tmp_path / "out2"),
                "--target", str(tmp_path / "other")]) == 0
    assert torch.equal(load_file(str(tmp_path / "out2" / "model.safetensors"))["lm_heads.0.weight"],
                       other.lm_head.weight)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("other", [{"hidden_size": 64}, {"vocab_size": 160}], ids=["hidden", "padded-vocab"])
def test_medusa_export_refuses_a_target_of_other_shapes_as_eval_does(tmp_path, capsys, share, other):
    # heads for a hidden-32 / vocab-128 target exported for another hidden size or a padded vocabulary: refused
    # with the line eval gives (the drafter loaded next to the target), nothing written
    target = tiny_llama(0)
    tiny_llama(0, **other).save_pretrained(tmp_path / "other")
    d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=share), target=target)
    ckpt = d.save_pretrained(tmp_path / "m")
    capsys.readouterr()  # transformers' save progress
    assert cli(["export", str(ckpt), "--format", "medusa", "--output", str(tmp_path / "out"),
                "--target", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "Medusa config expects an LM head [128, 32] but the target's is" in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("drafterkit")]  # not transformers' load progress
    assert len(lines) == 1 and lines[0].startswith("drafterkit export: error: --target ") and \
        not (tmp_path / "out").exists()


def test_medusa_export_own_heads(tmp_path):
    target = tiny_llama(0)
    d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False), target=target)
    w = load_file(str(export(d.save_pretrained(tmp_path / "m"), "medusa", tmp_path / "o") / "model.safetensors"))
    assert {"lm_heads.0.weight", "lm_heads.1.weight", "blocks.1.layers.0.bias"} <= set(w)


def test_hf_assistant_export_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from drafterkit.drafters.draft_lm import DraftLM

    target = tiny_llama(0)
    d = DraftLM.from_target(target, 1)
    out = export(d.save_pretrained(tmp_path / "dl"), "hf-assistant", tmp_path / "hf")
    lm = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(lm(ids).logits, d.lm(ids).logits, atol=1e-5)


def test_hf_assistant_export_saves_the_recorded_targets_tokenizer(tmp_path, capsys):
    """The export line training prints for a draft LM has no --target: the export reads the target the checkpoint's
    recipe.yaml records for the tokenizer, as Medusa reads it for the LM head; a recorded target gone from this
    machine is one warning line and an export without a tokenizer."""
    import shutil

    from families import save_family
    from transformers import AutoTokenizer

    from drafterkit.drafters.draft_lm import DraftLM

    model, tok = save_family("llama3", tmp_path / "target")
    ckpt = _in_a_training_checkpoint(DraftLM.from_target(model, 1), tmp_path / "run", str(tmp_path / "target"))
    assert cli(["export", str(ckpt), "--format", "hf-assistant", "--output", str(tmp_path / "hf")]) == 0
    saved = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert saved.get_vocab() == tok.get_vocab()
    shutil.rmtree(tmp_path / "target")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli(["export", str(ckpt), "--format", "hf-assistant", "--output", str(tmp_path / "hf2")]) == 0
    said = [str(w.message) for w in caught if "tokenizer" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and said[0].startswith(
        f"the tokenizer of target {tmp_path / 'target'} (the one the training recipe records) cannot be loaded") \
        and said[0].endswith("pass --target NAME_OR_PATH to save one"), said
    assert (tmp_path / "hf2" / "config.json").is_file() and not (tmp_path / "hf2" / "tokenizer.json").exists()


def _open_mode(tmp_path) -> int:
    """The mode a plain open() gives a new file under this process's umask."""
    probe = tmp_path / "probe.txt"
    probe.write_text("x")
    return probe.stat().st_mode & 0o777


def test_weight_files_get_the_umask_mode_not_owner_only(tmp_path):
    from drafterkit.drafters.draft_lm import DraftLM

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
    from drafterkit.drafters import DrafterLoadError, load_drafter

    target = tiny_llama(0, layers=4)
    if fmt == "medusa":
        ckpt = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False),
                             target=target).save_pretrained(tmp_path / "m")
    else:
        ckpt = _eagle3_ckpt(tmp_path)[1]
    out = export(ckpt, fmt, tmp_path / "out")
    with pytest.raises(DrafterLoadError, match=f"is a {fmt} export ") as err:
        load_drafter(out, target)
    assert f"It was exported from {ckpt.resolve()} (same weights)" in str(err.value)
    assert f"drafterkit eval --drafter {ckpt.resolve()}`" in str(err.value)
    assert cli(["export", str(out), "--format", fmt, "--output", str(tmp_path / "again")]) == 2
    assert f"is a {fmt} export" in capsys.readouterr().err and not (tmp_path / "again").exists()
    ckpt.rename(tmp_path / "moved")  # the source is gone: the generic advice, with the reason
    with pytest.raises(DrafterLoadError, match=f"is a {fmt} export .*drafterkit eval --drafter RUN/checkpoints/last"
                       ".*which is gone"):
        load_drafter(out, target)


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
    from drafterkit.drafters.draft_lm import DraftLM

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
    from drafterkit.drafters import DrafterLoadError, load_drafter, resolve_checkpoint

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
    import drafterkit.drafters.export.writers as ex

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


@pytest.mark.parametrize("kind", ["dflash", "dflash_reduced"])
def test_dflash_export_is_the_checkpoint_under_vllms_config_and_loads_back(tmp_path, kind):
    """vllm-dflash: the same tensors under the same names (rename-free), a DFlashDraftModel Qwen3 config with
    block_size and dflash_config (target_layer_ids = ids - 1), lm_head / d2t only for a reduced vocabulary;
    load_dflash_export gives back a drafter proposing the same blocks."""
    from conftest import tiny_llama
    from test_drafters_conformance import build

    from drafterkit.decode.protocol import DecodeState, SamplingParams
    from drafterkit.drafters.export.writers import load_dflash_export

    target = tiny_llama(0, layers=4)
    d = build(kind, target)
    ckpt = d.save_pretrained(tmp_path / "ckpt")
    out = export(ckpt, "vllm-dflash", tmp_path / "v")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 4 and cfg["num_hidden_layers"] == d.config.num_layers
    assert cfg["dflash_config"] == {"mask_token_id": 0, "target_layer_ids": [i - 1 for i in d.feature_layers]}
    assert ("draft_vocab_size" in cfg) == (kind == "dflash_reduced")
    saved, exported = load_file(str(ckpt / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert saved.keys() == exported.keys() and all(torch.equal(saved[k], exported[k]) for k in saved)
    assert ("lm_head.weight" in exported) == ("d2t" in exported) == (kind == "dflash_reduced")
    assert not any(k.startswith("embed_tokens") for k in exported)
    back = load_dflash_export(out, target)
    ids = [5, 9, 17, 33, 2, 70]
    hs = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i][0, :-1] for i in d.feature_layers], -1)
    props = []
    for dr in (d, back):
        dr.reset(1)
        st = DecodeState(tokens=[ids], num_stable=[0], features=[feats], active=[True], vocab_size=128)
        props.append(dr.propose(st, 3, SamplingParams(), None).tokens)
    assert torch.equal(props[0], props[1])
    with pytest.raises(ExportError, match="formats for 'dflash': \\['vllm-dflash'\\]"):
        export(ckpt, "vllm-eagle3", tmp_path / "x")


def test_eval_names_the_checkpoint_an_export_came_from(tmp_path, capsys):
    from drafterkit.speceval.recorded import say_export_source

    _, e3 = _eagle3_ckpt(tmp_path)
    out = export(e3, "vllm-eagle3", tmp_path / "v")
    say_export_source(str(out))
    assert f"--drafter {out}: a drafterkit export of {e3.resolve()} (the same weights)" in capsys.readouterr().out
    (e3 / "model.safetensors").write_bytes((e3 / "model.safetensors").read_bytes() + b" ")  # retrained since
    say_export_source(str(out))
    assert "has changed since" in capsys.readouterr().out
    say_export_source(str(e3))  # a training checkpoint records no source: nothing said
    assert capsys.readouterr().out == ""


def test_an_output_holding_files_is_refused_and_overwrite_replaces_it_whole(tmp_path, capsys):
    """A second export into a used folder must not mix its files with the first's silently; --overwrite
    replaces the folder whole (no stale file left), and an --overwrite that fails loses nothing."""
    _, ckpt = _eagle3_ckpt(tmp_path)
    out = tmp_path / "o"
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(out)]) == 0
    (out / "stale.safetensors").write_bytes(b"from an earlier export")
    before = sorted(p.name for p in out.iterdir())
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit export: error: --output ") and "holds an earlier export" in err
    assert "--overwrite" in err and sorted(p.name for p in out.iterdir()) == before
    (tmp_path / "broken").mkdir()
    assert cli(["export", str(tmp_path / "broken"), "--format", "vllm-eagle3", "--output", str(out),
                "--overwrite"]) == 2
    assert "drafterkit export: error: " in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before  # the failed export put the old folder back
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(out), "--overwrite"]) == 0
    assert not (out / "stale.safetensors").exists() and (out / "config.json").exists()
    assert not list(tmp_path.glob(".o.replaced*"))
    (tmp_path / "f").write_text("a file")
    for inside in ("f", "f/sub"):  # a file, or a folder under a file (a NotADirectoryError traceback before)
        assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / inside)]) == 2
        assert f"{tmp_path / 'f'} is a file, not a folder; give a folder you can write" in capsys.readouterr().err
    for holder in (ckpt, ckpt.parent):  # the checkpoint's own folder, or one holding it: refused, nothing moved
        assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(holder), "--overwrite"]) == 2
        assert "holds the checkpoint being exported" in capsys.readouterr().err
        assert (ckpt / "model.safetensors").is_file()


def test_overwrite_replaces_only_an_earlier_export(tmp_path, capsys, monkeypatch):
    """--overwrite never deletes a folder of other files (a repository, a user's work) nor the working folder or
    one above it: refused in one line that does not suggest --overwrite, every file kept."""
    _, ckpt = _eagle3_ckpt(tmp_path)
    work = tmp_path / "work"
    (work / ".git").mkdir(parents=True)
    (work / "src").mkdir()
    (work / "src" / "a.py").write_text("x = 1")
    for overwrite in ([], ["--overwrite"]):
        assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(work), *overwrite]) == 2
        err = capsys.readouterr().err
        assert "not an earlier drafterkit export" in err and "give --overwrite" not in err
        assert sorted(p.name for p in work.iterdir()) == [".git", "src"] and (work / "src" / "a.py").exists()
    monkeypatch.chdir(work / "src")
    for output in (".", "..", str(work)):
        assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", output, "--overwrite"]) == 2
        assert "is the working folder or holds it" in capsys.readouterr().err
    assert (work / "src" / "a.py").exists() and (work / ".git").is_dir()


def test_a_damaged_weights_file_is_a_one_line_error_naming_it(tmp_path, capsys):
    """A model.safetensors cut short (an interrupted copy) is named with the fix, never a safetensors traceback."""
    _, ckpt = _eagle3_ckpt(tmp_path)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit export: error: ") and f"{weights} cannot be read" in err
    assert "save or copy the checkpoint again" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("fmt", ["medusa", "hf-assistant"])
def test_a_target_export_cannot_load_is_one_line_naming_it(tmp_path, capsys, fmt):
    """--target is read for Medusa's shared LM head and the assistant's tokenizer: a missing folder is named as
    such (transformers' own error called the path a malformed Hub repo id), and nothing is written."""
    from drafterkit.drafters.draft_lm import DraftLM

    target = tiny_llama(0)
    d = (MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target) if fmt == "medusa"
         else DraftLM.from_target(target, 1))
    ckpt = d.save_pretrained(tmp_path / "ck")
    missing = tmp_path / "nope"
    assert cli(["export", str(ckpt), "--format", fmt, "--output", str(tmp_path / "o"), "--target", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit export: error: target ") and f"{missing} does not exist" in err
    assert "repo" not in err.lower() and "Traceback" not in err and not (tmp_path / "o").exists()


def test_a_checkpoint_holding_nan_is_refused_at_export(tmp_path, capsys):
    """Weights a diverged run saved (NaN or inf) are refused, naming the tensors, instead of exported for an engine
    to draft garbage with."""
    from safetensors.torch import save_file

    _, ckpt = _eagle3_ckpt(tmp_path)
    w = load_file(str(ckpt / "model.safetensors"))
    w["fc.weight"][0, 0] = float("nan")
    w["lm_head.weight"][1, 1] = float("inf")
    save_file(w, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit export: error: ") and "NaN or inf values in fc.weight, lm_head.weight" in err
    assert "diverged" in err and not (tmp_path / "o").exists()


def test_an_export_output_that_cannot_be_written_and_an_edited_kind_are_one_line(tmp_path, capsys):
    _, ckpt = _eagle3_ckpt(tmp_path)
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", "/proc/e3"]) == 2
    assert "--output /proc/e3: /proc does not take new files" in (err := capsys.readouterr().err)
    assert "Traceback" not in err
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(dict(cfg, kind="medusa")))  # the kind edited by hand
    assert cli(["export", str(ckpt), "--format", "medusa", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "config.json does not describe a drafter of kind 'medusa', though its \"kind\" says so (got an unexpected " \
           "keyword argument" in err and "copy the checkpoint folder again" in err and "MedusaConfig" not in err


def test_an_eagle3_export_for_a_target_vllm_cannot_serve_warns_and_its_card_says_so(tmp_path, capsys):
    """vLLM 0.32's EAGLE-3 needs the target class to implement SupportsEagle3; Gemma-3 does not, Llama does."""
    from families import save_family

    _, ckpt = _eagle3_ckpt(tmp_path)
    for family, servable in (("gemma3", False), ("llama3", True)):
        save_family(family, target := tmp_path / family)
        out = tmp_path / f"out-{family}"
        argv = ["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(out), "--target", str(target)]
        assert cli(argv) == 0
        err, card = capsys.readouterr().err, (out / "README.md").read_text()
        if servable:
            assert "warning" not in err and "cannot serve" not in card and "vllm serve" in card
            continue
        (line,) = [x for x in err.splitlines() if "warning" in x]
        assert "vLLM 0.32.0 cannot serve an EAGLE-3 head for a Gemma3ForCausalLM target" in line
        assert "SupportsEagle3" in line and "Traceback" not in err
        assert "**vLLM cannot serve this export yet.** vLLM 0.32.0 cannot serve" in card and "SupportsEagle3" in card


def test_the_vllm_warning_judges_and_names_the_target_passed_not_the_recorded_one(tmp_path, capsys):
    # --target is the target the export is for (as for Medusa's LM head); without it, the recorded one
    from families import save_family

    d, _ = _eagle3_ckpt(tmp_path)
    for family in ("gemma3", "llama3"):
        save_family(family, tmp_path / family)
    for recorded, passed, warned in (("llama3", "gemma3", "gemma3"), ("gemma3", "llama3", None),
                                     ("gemma3", None, "gemma3")):
        ckpt = _in_a_training_checkpoint(d, tmp_path / f"run-{recorded}", str(tmp_path / recorded))
        out = tmp_path / f"out-{recorded}-{passed}"
        argv = ["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(out)]
        assert cli(argv + (["--target", str(tmp_path / passed)] if passed else [])) == 0
        lines = [x for x in capsys.readouterr().err.splitlines() if "cannot serve" in x]
        if warned is None:
            assert not lines, lines
            continue
        assert len(lines) == 1 and lines[0].startswith(f"drafterkit export: warning: target {tmp_path / warned}: ")
        assert "Gemma3ForCausalLM target" in lines[0]


def test_a_dflash_export_for_a_target_vllm_cannot_serve_warns(tmp_path, capsys):
    """vLLM's DFlash proposer reads the target's auxiliary hidden states as EAGLE-3 does (SupportsEagle3)."""
    from families import save_family

    from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter

    target, _ = save_family("gemma3", tmp_path / "gemma3")
    ckpt = DFlashDrafter(DFlashConfig.from_target(target, block_size=4), target=target).save_pretrained(tmp_path / "d")
    argv = ["export", str(ckpt), "--format", "vllm-dflash", "--output", str(tmp_path / "out"),
            "--target", str(tmp_path / "gemma3")]
    assert cli(argv) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert "cannot serve a DFlash block drafter for a Gemma3ForCausalLM target" in line, line
    assert "SupportsEagle3" in line, line


def test_the_readme_names_every_export_format_and_the_kind_without_one():
    """The registry's formats and kinds, each named in the README (as code), whatever the wording around them."""
    from pathlib import Path

    from drafterkit.drafters.kinds import KINDS, export_formats

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert [fmt for fmt in sorted(export_formats()) if f"`{fmt}`" not in readme] == []
    assert [k for k, entry in KINDS.items() if not entry.exports and entry.trainable] == ["eagle"]
    assert "`eagle`" in readme and "(docs/support-matrix.md" in readme
