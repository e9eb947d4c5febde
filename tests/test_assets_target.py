"""The real default target loads frozen and continues a chat prompt into sensible text."""

import pytest
import torch

from drafterkit.assets.device import resolve_device, resolve_dtype


def test_dtype_and_device_strings():
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype(None) is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("fp12")
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; use auto, cpu, cuda, cuda:N or mps"):
        resolve_device("tpu")  # torch's own RuntimeError named no fix
    with pytest.raises(ValueError, match="unknown device"):
        resolve_dtype("auto", "tpu")



@pytest.mark.slow
def test_real_target_is_frozen_and_answers(real_target):
    model, tok = real_target
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text


def test_every_cut_of_a_safetensors_file_is_caught_and_the_whole_file_passes(tmp_path):
    from safetensors.torch import save_file

    from drafterkit.assets.target import safetensors_problem

    whole = tmp_path / "whole.safetensors"
    save_file({"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(5, dtype=torch.int64)}, str(whole))
    data = whole.read_bytes()
    assert safetensors_problem(whole) is None
    cut = tmp_path / "cut.safetensors"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        assert safetensors_problem(cut).startswith("is torn"), n


def test_a_broken_local_target_folder_names_what_is_wrong(tmp_path):
    import json

    from conftest import tiny_llama

    from drafterkit.assets.target import TargetLoadError, load_target, target_folder_problem

    model = tiny_llama(0)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / "sharded" / first).unlink()
    assert target_folder_problem(tmp_path / "sharded").startswith(f"lacks {first}, one of the weight files")
    (tmp_path / "file").write_text("x")
    assert target_folder_problem(tmp_path / "file") == "is a file, not a model folder"
    (tmp_path / "empty").mkdir()
    assert target_folder_problem(tmp_path / "empty").startswith("holds no config.json")
    with pytest.raises(TargetLoadError, match=r"empty holds no config.json.*'smollm2-135m'"):
        load_target(str(tmp_path / "empty"))
    with pytest.raises(OSError, match="does not exist"):  # TargetLoadError is an OSError, as before
        load_target(str(tmp_path / "nowhere"))


def test_a_hub_id_with_the_hub_unreachable_fails_fast_naming_the_cause(monkeypatch):
    """Offline, a Hub id is looked up in the local cache only (no minute of network retries)."""
    from drafterkit.assets import target as tg

    monkeypatch.setattr(tg, "hub_reachable", lambda: False)
    with pytest.raises(tg.TargetLoadError, match=r"'someorg/some-model'.*Hub is not reachable.*local Hugging Face "
                                                r"cache does not hold it.*'smollm2-135m'"):
        tg.load_target("someorg/some-model")  # local_files_only: answered by the cache, no network retries


def test_auto_dtype_is_bf16_only_where_the_cpu_has_bf16_units(monkeypatch):
    """``auto`` reads the CPU's flags: bf16 with avx512_bf16 or amx_bf16, fp32 on an AVX2-only CPU."""
    from drafterkit.assets import device

    for flags, want in ((frozenset({"avx2", "avx512f"}), torch.float32), (frozenset({"avx512_bf16"}), torch.bfloat16),
                        (frozenset({"amx_bf16", "avx2"}), torch.bfloat16)):
        monkeypatch.setattr(device, "_cpu_flags", lambda f=flags: f)
        assert device.resolve_dtype("auto", "cpu") is want and device.native_bf16("cpu") == (want is torch.bfloat16)
    assert device.resolve_dtype("bf16", "cpu") is torch.bfloat16  # an explicit bf16 is kept, native or not


def test_recipe_auto_precision_resolves_at_validation(monkeypatch, recwarn):
    import drafterkit.assets.device as D
    import drafterkit.train.recipe as R

    data = {"output_dir": "x", "target": {"dtype": "Auto"}, "train": {"mixed_precision": "AUTO"}}  # any case
    monkeypatch.setattr(D, "native_bf16", lambda device=None: True)
    r = R.recipe_from_dict(data)
    assert (r.target.dtype, r.train.mixed_precision) == ("bfloat16", "bf16") and not recwarn.list
    monkeypatch.setattr(D, "native_bf16", lambda device=None: False)
    with pytest.warns(UserWarning, match=r"target.dtype and train.mixed_precision: auto -> float32 here"):
        r = R.recipe_from_dict(data)
    assert (r.target.dtype, r.train.mixed_precision) == ("float32", "no")
    assert "dtype: float32" in r.to_yaml() and "mixed_precision: 'no'" in r.to_yaml()  # the saved recipe says what ran
