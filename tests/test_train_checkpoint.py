"""train.checkpoint: which checkpoint resume=auto picks, and quiet saves of tied weights that still resume."""

import json
import logging
from types import SimpleNamespace

import torch

from conftest import tiny_llama
from drafterkit.train.checkpoint import (
    TrainerState,
    find_resume,
    load_checkpoint,
    resumable_checkpoints,
    save_checkpoint,
)
from drafterkit.train.recipe import recipe_from_dict


def _fake_ckpt(folder, step, state=True):
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if state:
        (folder / "state").mkdir()


def test_resume_auto_picks_newest_complete_checkpoint_never_a_temp_folder(tmp_path):
    recipe = recipe_from_dict({"output_dir": str(tmp_path), "train": {"resume": "auto"}})
    ck = recipe.paths.checkpoints
    assert find_resume(recipe) is None  # no checkpoints/ at all
    _fake_ckpt(ck / "step-1", 1)
    _fake_ckpt(ck / "step-3", 3)  # kill -9 after step-3: no last/
    _fake_ckpt(ck / "step-5", 5, state=False)  # incomplete: no state/
    _fake_ckpt(ck / ".tmp-last", 9)  # half-written
    _fake_ckpt(ck / "best", 7, state=False)
    (ck / "step-6").mkdir()  # no trainer_state.json
    assert find_resume(recipe) == ck / "step-3"
    _fake_ckpt(ck / ".old-last", 4)  # crash between the two renames of last/
    assert find_resume(recipe) == ck / ".old-last"
    _fake_ckpt(ck / "last", 4)
    assert find_resume(recipe) == ck / "last"  # same step: the finished last/ wins
    assert [s for s, _ in resumable_checkpoints(ck)] == [1, 3, 4, 4]
    never = recipe_from_dict({"output_dir": str(tmp_path), "train": {"resume": "never"}})
    assert find_resume(never) is None
    explicit = recipe_from_dict({"output_dir": str(tmp_path), "train": {"resume": str(ck / "step-1")}})
    assert find_resume(explicit) == ck / "step-1"


def test_tied_weights_save_without_shared_tensor_notice_and_resume(tmp_path, caplog, capfd):
    from accelerate import Accelerator

    model = tiny_llama(0, layers=1, tie=True).train().requires_grad_(True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    acc = Accelerator(cpu=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    strategy = SimpleNamespace(save=lambda drafter, path: path.mkdir())
    recipe = recipe_from_dict({"output_dir": str(tmp_path)})
    with caplog.at_level(logging.INFO):
        save_checkpoint(tmp_path / "ck", accelerator=acc, strategy=strategy, drafter=model,
                        state=TrainerState(global_step=3), recipe=recipe)
    out, err = capfd.readouterr()
    assert "Removed shared tensor" not in caplog.text + out + err
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert load_checkpoint(tmp_path / "ck", acc).global_step == 3
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # the filter is scoped to saving: accelerate's logger passes the same record outside it
    logging.getLogger("accelerate.utils.other").warning("Removed shared tensor {'x'} while saving")
    assert "Removed shared tensor" in caplog.text


def test_checkpoint_files_get_the_umask_mode_not_owner_only(tmp_path):
    from accelerate import Accelerator

    from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter

    probe = tmp_path / "probe.txt"
    probe.write_text("x")
    target = tiny_llama(0, layers=1)
    drafter = MedusaDrafter(MedusaConfig.from_target(target, num_heads=1), target=target)
    acc = Accelerator(cpu=True)
    model = acc.prepare(drafter)
    strategy = SimpleNamespace(save=lambda d, path: d.save_pretrained(path))
    save_checkpoint(tmp_path / "ck", accelerator=acc, strategy=strategy, drafter=model,
                    state=TrainerState(global_step=1), recipe=recipe_from_dict({"output_dir": str(tmp_path)}))
    files = {str(f.relative_to(tmp_path)): oct(f.stat().st_mode & 0o777) for f in (tmp_path / "ck").rglob("*")
             if f.is_file()}
    assert "ck/drafter/model.safetensors" in files and any(f.startswith("ck/state/") for f in files), files
    assert set(files.values()) == {oct(probe.stat().st_mode & 0o777)}, files
