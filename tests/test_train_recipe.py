"""Recipe validation: every shipped YAML validates, misspelt keys fail naming them, overrides work."""

from pathlib import Path

import pytest
import yaml

from train.recipe import RecipeError, apply_overrides, load_recipe, recipe_from_dict

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.y*ml"))


def test_recipes_folder_is_not_empty():
    names = {p.relative_to(ROOT / "recipes").as_posix() for p in RECIPES}
    assert {"smoke.yaml", "draft_lm.yaml", "accelerate/single_cpu.yaml", "accelerate/single_gpu.yaml",
            "accelerate/multi_gpu.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.relative_to(ROOT / "recipes").as_posix())
def test_every_yaml_under_recipes_validates(path):
    if "accelerate" in path.parts:
        from accelerate.commands.config.config_args import load_config_from_file

        cfg = load_config_from_file(str(path))
        assert cfg.num_processes >= 1
    else:
        recipe = load_recipe(path)
        assert recipe.output_dir and recipe.drafter.kind


def test_misspelt_key_names_key_path_and_valid_keys():
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({"output_dir": "x", "optim": {"lrr": 1e-3}})
    msg = str(err.value)
    assert "optim.lrr" in msg and "'lrr'" in msg and "'lr'" in msg and "'warmup_steps'" in msg


def test_misspelt_top_level_section_and_strategy_option():
    with pytest.raises(RecipeError, match=r"(?s)trian.*valid keys.*'train'"):
        recipe_from_dict({"output_dir": "x", "trian": {}})
    with pytest.raises(RecipeError, match=r"(?m)^drafter\.options\.num_layrs: unknown key.*'num_layers'"):
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": "draft_lm", "options": {"num_layrs": 2}}})
    with pytest.raises(RecipeError, match=r"unknown drafter kind|no training strategy.*draft_lm"):
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": "nope"}})


@pytest.mark.parametrize("override,field", [
    ("optim.lr=0", "optim.lr"), ("optim.warmup_steps=-1", "optim.warmup_steps"),
    ("train.batch_size=0", "train.batch_size"), ("loss.name=kl", "loss.name"),
    ("data.heldout_fraction=1.5", "data.heldout_fraction"), ("optim.betas=[0.9,1.2]", "optim.betas"),
    ("loss.weights={fkl: 1, foo: 2}", "loss.weights"), ("data.source=jsonl", "data"),
])
def test_range_checks_name_the_field(override, field):
    with pytest.raises(RecipeError, match=field.replace(".", r"\.")):
        recipe_from_dict({"output_dir": "x"}, [override])


def test_overrides_parse_yaml_values_and_create_sections():
    data = apply_overrides({"optim": {"lr": 1.0}}, ["optim.lr=2e-3", "logging.trackers=[tensorboard, wandb]",
                                                     "train.max_minutes=null", "output_dir=runs/a"])
    assert data["optim"]["lr"] == 2e-3 and data["logging"]["trackers"] == ["tensorboard", "wandb"]
    assert data["train"]["max_minutes"] is None and data["output_dir"] == "runs/a"
    r = load_recipe(ROOT / "recipes" / "smoke.yaml", ["optim.lr=1e-3", "drafter.options.num_layers=3"])
    assert r.optim.lr == 1e-3 and r.drafter.parsed_options().num_layers == 3
    with pytest.raises(RecipeError, match="key.sub=value"):
        apply_overrides({}, ["optim.lr"])


def test_paths_derive_from_output_dir_and_resolved_recipe_round_trips(tmp_path):
    r = recipe_from_dict({"output_dir": str(tmp_path / "run")})
    p = r.paths
    assert p.last == tmp_path / "run" / "checkpoints" / "last" and p.best.name == "best"
    assert p.step(7).name == "step-7" and p.logs.parent == p.eval.parent == p.root
    saved = r.save(tmp_path / "run")
    again = recipe_from_dict(yaml.safe_load(saved.read_text()))
    assert again == r and again.drafter.options["num_layers"] == 4  # defaults resolved into the file


def test_resume_is_never_auto_or_an_existing_checkpoint(tmp_path):
    with pytest.raises(RecipeError, match=r"(?s)train\.resume: 'maybe' is neither 'auto', 'never'.*existing"):
        recipe_from_dict({"output_dir": "x"}, ["train.resume=maybe"])
    (tmp_path / "best" / "drafter").mkdir(parents=True)
    with pytest.raises(RecipeError, match=r"train\.resume: .*not a checkpoint with a training state"):
        recipe_from_dict({"output_dir": "x"}, [f"train.resume={tmp_path / 'best'}"])
    ck = tmp_path / "last"
    (ck / "state").mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    assert recipe_from_dict({"output_dir": "x"}, [f"train.resume={ck}"]).train.resume == str(ck)
    for resume in (str(ck), "auto"):  # overwrite only starts fresh: never deletes a run it would continue
        with pytest.raises(RecipeError, match=r"train\.overwrite=true .*needs train\.resume=never"):
            recipe_from_dict({"output_dir": "x"}, [f"train.resume={resume}", "train.overwrite=true"])
    r = recipe_from_dict({"output_dir": "x"}, ["train.overwrite=true", "train.resume=never"])
    assert r.train.overwrite and not recipe_from_dict({"output_dir": "x"}).train.overwrite


def test_a_file_given_as_data_source_names_data_path():
    with pytest.raises(RecipeError, match=r"data\.source=jsonl data\.path=chats/my\.jsonl"):
        recipe_from_dict({"output_dir": "x"}, ["data.source=chats/my.jsonl"])
    with pytest.raises(RecipeError, match=r"'sharegpt' or 'jsonl'"):  # a plain typo keeps pydantic's message
        recipe_from_dict({"output_dir": "x"}, ["data.source=sharegtp"])
