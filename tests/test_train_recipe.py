"""Recipe validation: every shipped YAML validates, misspelt keys fail naming them, overrides work."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drafterkit.train.recipe import RecipeError, apply_overrides, load_recipe, recipe_from_dict

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


def test_a_value_given_to_a_section_names_its_keys_and_the_override_meant():
    """``drafter=eagle3`` used to answer with pydantic's words for an internal class; it names the section's keys
    and the override that sets the kind."""
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({"output_dir": "x"}, ["drafter=eagle3"])
    msg = str(err.value)
    assert "drafter: is a section with keys ['kind', 'options']" in msg and "drafter.kind=eagle3" in msg
    assert "Spec" not in msg and "instance" not in msg


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
    with pytest.raises(RecipeError, match=r"override 'optim.lr=\[1': its value is not valid YAML"):
        apply_overrides({}, ["optim.lr=[1"])  # yaml's ParserError traceback before


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


@pytest.mark.parametrize("kind,options,loss,names", [
    ("eagle", {}, {"name": "accept_len"},
     ["loss.name", "accept_len", "'eagle'", "drafter.options.ttt_steps: 1", "set drafter.options.ttt_steps: 4"]),
    ("medusa", {"num_heads": 1}, {"weights": {"accept_len": 1.0, "fkl": 1.0}, "draft_steps": 3},
     ["loss.weights.accept_len", "'medusa'", "set drafter.options.num_heads: 3"]),
    ("eagle3", {"ttt_steps": 3}, {"name": "accept_len"},
     ["loss.name", "accept_len", "'eagle3'", "ttt_tokens: data", "set drafter.options.ttt_tokens: draft"]),
    ("dflash", {"block_size": 2}, {"name": "accept_len", "draft_steps": 3},
     ["loss.name", "accept_len", "'dflash'", "block_size: 2", "set drafter.options.block_size: 4"]),
])
def test_a_loss_term_the_kind_cannot_apply_is_refused_naming_both(kind, options, loss, names):
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind, "options": options}, "loss": loss})
    assert all(n in str(err.value) for n in names), str(err.value)


def test_a_layer_stack_is_refused_for_eagle1_and_taken_by_eagle3_and_peagle():
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": "eagle", "options": {"num_layers": 2}}})
    assert all(n in str(err.value) for n in ("drafter.options.num_layers", "kind eagle is EAGLE-1's one-layer head",
                                            "kind eagle3")), str(err.value)
    recipe_from_dict({"output_dir": "x", "drafter": {"kind": "eagle", "options": {"num_layers": 1}}})
    for kind in ("eagle3", "peagle"):
        r = recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind}}, ["drafter.options.num_layers=3"])
        assert r.drafter.parsed_options().num_layers == 3
        with pytest.raises(RecipeError, match="drafter.options.num_layers"):
            recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind, "options": {"num_layers": 0}}})


@pytest.mark.parametrize("kind,options,loss", [
    ("eagle", {"ttt_steps": 4}, {"name": "accept_len"}),
    ("eagle", {}, {"name": "accept_len", "draft_steps": 1}),
    ("medusa", {"num_heads": 2}, {"name": "accept_len"}),
    ("eagle3", {"ttt_tokens": "draft"}, {"weights": {"accept_len": 1.0, "fkl": 0.5}}),
    ("draft_lm", {}, {"name": "accept_len"}),
    ("dflash", {"block_size": 8}, {"weights": {"accept_len": 1.0, "fkl": 0.5}, "draft_steps": 7}),
])
def test_accept_len_on_a_chain_of_several_own_drafts_validates(kind, options, loss):
    recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind, "options": options}, "loss": loss})


#: kind, its options, the most draft tokens one round proposes, the option that sets it
BOUNDED = [("medusa", {"num_heads": 2}, 2, "num_heads"), ("dflash", {"block_size": 4}, 3, "block_size"),
           ("dspark", {"block_size": 4}, 4, "block_size")]


@pytest.mark.parametrize("kind,options,most,option", BOUNDED)
def test_a_draft_length_above_the_drafters_bound_is_refused_naming_it(kind, options, most, option):
    """``eval.k`` (and ``loss.draft_steps`` with accept_len) above what one round of a Medusa / DFlash / DSpark
    drafter drafts is refused when the recipe is validated (no longer cut silently at decoding), one line naming
    the bound and both fixes; ``draft_steps`` without accept_len is not read, so it is not refused."""
    base = {"output_dir": "x", "drafter": {"kind": kind, "options": options}}
    for extra, key in (({"eval": {"k": most + 1}}, "eval.k"),
                       ({"loss": {"name": "accept_len", "draft_steps": most + 2}}, "loss.draft_steps")):
        with pytest.raises(RecipeError) as err:
            recipe_from_dict({**base, **extra})
        line = str(err.value).splitlines()[-1]
        assert line.startswith(f"{key}: ") and f"'{kind}'" in line and f"set {key} to at most {most}" in line, line
        assert f"drafter.options.{option}: {options[option]}" in line and f"drafter.options.{option} to at " \
            "least" in line, line
    r = recipe_from_dict({**base, "eval": {"k": most}, "loss": {"name": "fkl", "draft_steps": most + 2}})
    assert r.eval.k == most and r.loss.draft_steps == most + 2


@pytest.mark.parametrize("kind,options,most,option", BOUNDED)
def test_default_draft_lengths_follow_the_drafters_bound_in_the_saved_recipe(kind, options, most, option, tmp_path):
    """Left out, ``eval.k`` (5) and ``loss.draft_steps`` (4, with accept_len) become the bound where it is
    smaller; the saved recipe holds what runs and validates again as it is. A larger bound keeps the defaults."""
    r = recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind, "options": options},
                          "loss": {"name": "accept_len"}})
    assert (r.eval.k, r.loss.draft_steps) == (min(5, most), min(4, most))
    assert load_recipe(r.save(tmp_path)).eval.k == min(5, most)
    wide = recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind, "options": {option: 8}}})
    assert wide.eval.k == 5


@pytest.mark.parametrize("kind,options,most,option", BOUNDED)
def test_the_recipes_draft_bound_is_the_drafters(kind, options, most, option):
    """``train.draft_lengths.draft_bound`` (what the recipe checks, without torch) equals ``drafters.kinds.
    max_draft_tokens`` of a drafter config with the same values (what eval and export read); the trainable kinds
    without a fixed bound have none on either side."""
    from drafterkit.drafters.kinds import max_draft_tokens
    from drafterkit.train.draft_lengths import draft_bound
    from drafterkit.train.options import KINDS

    for size in (2, 5, 9):
        parsed = KINDS[kind].options_model.model_validate({option: size}).model_dump()
        assert draft_bound(kind, parsed) == (max_draft_tokens(kind, parsed), option)
    assert draft_bound(kind, {**options}) == (most, option)
    for other in set(KINDS) - {"medusa", "dflash", "dspark"}:
        assert draft_bound(other, {}) is None and max_draft_tokens(other, {}) is None, other


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "dflash"])
def test_on_policy_data_for_a_head_kind_is_refused_at_validation(kind):
    with pytest.raises(RecipeError, match=rf"data\.on_policy_fraction: drafter kind '{kind}'.*'draft_lm'.*"
                                          r"set data\.on_policy_fraction: 0"):
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": kind}, "data": {"on_policy_fraction": 0.5}})
    recipe_from_dict({"output_dir": "x", "drafter": {"kind": "draft_lm"}, "data": {"on_policy_fraction": 0.5}})


def test_an_eagle3_feature_layer_id_equal_to_the_layer_count_is_refused(tmp_path, capsys):
    """Id L (after the final norm) cannot be served: refused when the recipe is validated, through the CLI
    with exit 2 before any model loads, when the target's config is local; else when the head is built."""
    from conftest import tiny_llama

    from drafterkit.drafters.eagle3 import Eagle3Config
    from drafterkit.cli import main

    target = tiny_llama(0, layers=4)
    target.config.save_pretrained(tmp_path / "target")  # the config alone: no weights are read
    data = {"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "target")},
            "drafter": {"kind": "eagle3", "options": {"feature_layers": [1, 2, 4]}}}
    pattern = r"drafter\.options\.feature_layers: EAGLE-3 feature layers \[1, 2, 4\].*id 4 is the last layer's output"
    with pytest.raises(RecipeError, match=pattern):
        recipe_from_dict(data)
    recipe_from_dict(data, ["drafter.options.feature_layers=[0, 2, 3]"])
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    assert main(["train", str(tmp_path / "r.yaml")]) == 2
    assert "id 4 is the last layer's output after the final norm" in capsys.readouterr().err
    # a target whose config is not local (a Hub id, offline) is checked when the head is built, same message
    recipe_from_dict({**data, "target": {"name_or_path": "nobody/not-cached-here"}})
    with pytest.raises(ValueError, match=r"id 4 is the last layer's output after the final norm"):
        Eagle3Config.from_target(target, feature_layers=[1, 2, 4])


@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
def test_feature_layers_that_are_not_three_ids_are_refused_in_a_self_contained_line(kind):
    # the line states the default rule itself, rather than pointing at code the user does not see
    data = {"output_dir": "runs/x", "drafter": {"kind": kind, "options": {"feature_layers": [1, 2]}}}
    with pytest.raises(RecipeError) as exc:
        recipe_from_dict(data)
    msg = str(exc.value)
    assert "drafter.options.feature_layers" in msg and "got [1, 2]" in msg, msg
    assert "(2, L//2, L-3) from 7 layers, (1, L//2, L-1) for 4 to 6, (0, 1, 2) for 3" in msg, msg
    assert "below" not in msg.replace("below 3 layers", "") and "default_feature_layers" not in msg, msg


def test_a_dflash_feature_layer_vllm_cannot_capture_is_refused(tmp_path):
    """DFlash ids must be increasing in [1, L-1] (vLLM's target_layer_ids = id - 1 >= 0, id < L): refused when
    the recipe is validated against a local target config."""
    from conftest import tiny_llama

    tiny_llama(0, layers=4).config.save_pretrained(tmp_path / "target")
    data = {"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "target")},
            "drafter": {"kind": "dflash", "options": {"feature_layers": [1, 2, 4]}}}
    with pytest.raises(RecipeError, match=r"drafter\.options\.feature_layers: dflash feature_layers .*\[1, 3\]"):
        recipe_from_dict(data)
    with pytest.raises(RecipeError, match=r"distinct increasing"):
        recipe_from_dict(data, ["drafter.options.feature_layers=[2, 1]"])
    recipe_from_dict(data, ["drafter.options.feature_layers=[1, 3]"])


@pytest.mark.parametrize("kind", ["eagle3", "peagle", "dflash", "dspark"])
def test_a_draft_vocab_larger_than_the_targets_vocabulary_is_refused(tmp_path, capsys, kind):
    """An explicit draft_vocab_size above the target's vocabulary (128 here) was clamped while recipe.yaml kept it:
    refused when the recipe is validated (the CLI exits 2 before any model loads), or when the head is built for a
    target whose config is not local; the default (8192) still fits itself to a small target."""
    from conftest import TINY_VOCAB, tiny_llama

    from drafterkit.cli import main
    from drafterkit.train.strategies import get_strategy

    target = tiny_llama(0, layers=4)
    target.config.save_pretrained(tmp_path / "target")  # the config alone: no weights are read
    data = {"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "target")},
            "drafter": {"kind": kind, "options": {"draft_vocab_size": 100000}}}
    pattern = (rf"drafter\.options\.draft_vocab_size: 100000 exceeds the target's vocabulary \({TINY_VOCAB} tokens"
               rf".*at most {TINY_VOCAB}")
    with pytest.raises(RecipeError, match=pattern):
        recipe_from_dict(data)
    recipe_from_dict(data, [f"drafter.options.draft_vocab_size={TINY_VOCAB}"])
    recipe_from_dict({**data, "drafter": {"kind": kind}})  # the default fits itself to the target
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    assert main(["train", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"exceeds the target's vocabulary ({TINY_VOCAB} tokens" in err and "Traceback" not in err, err
    elsewhere = recipe_from_dict({**data, "target": {"name_or_path": "nobody/not-cached-here"}})
    with pytest.raises(ValueError, match=pattern):
        get_strategy(kind).build(elsewhere, target, None)


def test_feature_cache_typo_is_refused_instead_of_becoming_a_folder(tmp_path):
    """A misspelt data.feature_cache must not silently build a cache of hundreds of MB under ./<typo>."""
    base = {"output_dir": str(tmp_path / "run"), "drafter": {"kind": "medusa"}}
    with pytest.raises(RecipeError, match=r"data.feature_cache: 'atuo' is neither auto, off nor a folder"):
        recipe_from_dict(base, ["data.feature_cache=atuo"])
    assert recipe_from_dict(base, ["data.feature_cache=Auto"]).data.feature_cache == "auto"
    assert recipe_from_dict(base, [f"data.feature_cache={tmp_path}/cache"]).data.feature_cache == f"{tmp_path}/cache"
    (tmp_path / "here").mkdir()
    import os

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert recipe_from_dict(base, ["data.feature_cache=here"]).data.feature_cache == "here"
    finally:
        os.chdir(cwd)


def test_the_training_table_lists_the_registrys_trainable_kinds():
    """train.options.KINDS (training's one line per kind) lists exactly the kinds drafters.kinds.KINDS marks
    trainable; each names a strategy class that exists in train/strategies/<kind>.py, is for that kind, uses
    the options model named beside it, and has feature_layers exactly when the kind reads target features."""
    from drafterkit.drafters.kinds import trainable_kinds
    from drafterkit.train.options import KINDS
    from drafterkit.train.strategies import get_strategy

    assert sorted(KINDS) == trainable_kinds()
    for kind, spec in KINDS.items():
        strategy = get_strategy(kind)
        assert type(strategy).__name__ == spec.strategy and type(strategy).__module__.endswith(f"strategies.{kind}")
        assert strategy.kind == kind and strategy.options_model is spec.options_model
        assert hasattr(strategy, "feature_layers") == spec.reads_features
        assert get_strategy(kind) is strategy  # one instance per kind


def test_an_unknown_kind_lists_the_trainable_kinds():
    with pytest.raises(RecipeError, match=r"drafter: no training strategy for drafter kind 'nope'; trainable kinds: "
                                          r"\['dflash', 'draft_lm', 'dspark', 'eagle', 'eagle3', 'medusa', 'peagle'\]"):
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": "nope"}})


@pytest.mark.parametrize("typo, meant", [("eagel3", "eagle3"), ("DSpark", "dspark"), ("dflsh", "dflash")])
def test_a_misspelt_kind_gets_a_did_you_mean(typo, meant):
    """As ``drafterkit eval --drafter ngramm`` does (``assets.records.did_you_mean``, one helper for both)."""
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": typo}})
    assert f"drafter kind {typo!r} (did you mean {meant}?); trainable kinds: [" in str(err.value), str(err.value)


@pytest.mark.parametrize("override, key, value", [
    ("train.mixed_precision=no", "train.mixed_precision", "no"),  # a Literal of strings: the word itself
    ("logging.run_name=off", "logging.run_name", "off"),  # a free string field keeps the word as written
    ("logging.project=true", "logging.project", "true"),
    ("logging.project=Yes", "logging.project", "Yes"),
    ("data.feature_cache=on", "data.feature_cache", "off"),  # the recipe's drafter reads no features: refused
    ("train.cpu=yes", "train.cpu", True), ("train.cpu=off", "train.cpu", False),  # boolean fields: booleans
    ("train.cpu=TRUE", "train.cpu", True), ("eval.at_end=no", "eval.at_end", False),
    ("data.regenerate=On", "data.regenerate", True),
])
def test_yaml_1_1_booleans_are_read_as_the_field_takes_them(override, key, value):
    if key == "data.feature_cache":
        with pytest.raises(RecipeError, match="data.feature_cache: drafter kind 'draft_lm' reads no target features"):
            recipe_from_dict({"output_dir": "x"}, [override])  # 'on' read as auto (an error before: a bool)
        r = recipe_from_dict({"output_dir": "x", "drafter": {"kind": "medusa"}}, [override])
        assert r.data.feature_cache == "auto"
        assert recipe_from_dict({"output_dir": "x", "drafter": {"kind": "medusa"}},
                                ["data.feature_cache=no"]).data.feature_cache == "off"
        return
    section, field = key.split(".")
    got = getattr(getattr(recipe_from_dict({"output_dir": "x"}, [override]), section), field)
    assert got == value and type(got) is type(value)


def test_yaml_1_1_booleans_in_a_recipe_file_and_a_word_no_field_takes(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("output_dir: x\ntrain:\n  mixed_precision: no\n  cpu: yes\n  overwrite: off\n"
                    "logging:\n  run_name: on\n")
    r = load_recipe(path)
    assert (r.train.mixed_precision, r.train.cpu, r.train.overwrite, r.logging.run_name) == ("no", True, False, "on")
    assert yaml.safe_load(r.to_yaml())["train"]["cpu"] is True  # the resolved recipe holds real booleans
    accepted = r"train\.mixed_precision: use auto .*, no \(also false / off\), bf16 or fp16; got 'yes'"
    with pytest.raises(RecipeError, match=accepted):
        recipe_from_dict({"output_dir": "x"}, ["train.mixed_precision=yes"])  # a word the field does not take
    with pytest.raises(RecipeError, match=r"loss\.name: Input should be 'ce'"):
        recipe_from_dict({"output_dir": "x"}, ["loss.name=off"])


@pytest.mark.parametrize("shard", ["drafter", "target", "drafter+target"])
def test_train_shard_in_a_single_process_is_refused_before_the_target_loads(tmp_path, monkeypatch, capsys, shard):
    """FSDP2 over one process shards nothing yet would mark the checkpoint sharded: refused in one line naming
    the fix. The target folder does not exist, so reaching the target load would print another error."""
    from drafterkit.cli import main as cli
    from drafterkit.train.distributed import check_shard_world

    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "none")},
        "drafter": {"kind": "eagle3"}, "data": {"source": "jsonl", "path": str(data)},
        "eval": {"every": 0, "at_end": False}, "logging": {"trackers": []}}))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli(["train", str(recipe), f"train.shard={shard}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"train.shard={shard} shards over processes, and this run has 1" in line
    assert "sharding needs at least 2 processes" in line and "torchrun --nproc_per_node N" in line
    assert "train.shard=none" in line and not (tmp_path / "run" / "checkpoints").exists()
    monkeypatch.setenv("WORLD_SIZE", "2")  # launched over 2 processes: accepted
    check_shard_world(recipe_from_dict(yaml.safe_load(recipe.read_text()), [f"train.shard={shard}"]))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RecipeError, match="this run has 1"):
        check_shard_world(recipe_from_dict(yaml.safe_load(recipe.read_text()), [f"train.shard={shard}"]))


def test_mixed_precision_reads_false_and_off_as_no_and_its_error_lists_every_accepted_value(tmp_path):
    base = {"output_dir": str(tmp_path / "run"), "drafter": {"kind": "draft_lm"}}
    for word in ("false", "off", "no", "False", "OFF"):  # override words, read by load_yaml
        assert recipe_from_dict(base, [f"train.mixed_precision={word}"]).train.mixed_precision == "no"
    assert recipe_from_dict({**base, "train": {"mixed_precision": False}}).train.mixed_precision == "no"
    assert recipe_from_dict(base, ["train.mixed_precision=fp16"]).train.mixed_precision == "fp16"
    assert recipe_from_dict(base, ["train.mixed_precision=auto"]).train.mixed_precision in ("bf16", "no")
    for bad in ("true", "fp8"):
        with pytest.raises(RecipeError) as err:
            recipe_from_dict(base, [f"train.mixed_precision={bad}"])
        msg = str(err.value)
        assert "train.mixed_precision" in msg and all(w in msg for w in ("auto", "no", "false", "off", "bf16", "fp16"))
        assert "Input should be" not in msg and f"got '{bad}'" in msg, msg


#: what a refused recipe must not have imported: the model and training libraries (seconds to import, tens of
#: seconds on a loaded machine), the training loop and the feature cache builder
HEAVY = ("torch", "transformers", "datasets", "accelerate", "numpy", "drafterkit.train.loop",
         "drafterkit.train.feature_cache")
REFUSE = """import json, sys
entry, argv = sys.argv[1], sys.argv[2:]
if entry in ("cli", "features"):
    from drafterkit.cli import main
    rc = main(["train" if entry == "cli" else "features", *argv])
else:
    from drafterkit.train.run import main
    rc = main(argv)
print(json.dumps({"rc": rc, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


@pytest.mark.parametrize("entry", ["cli", "module", "features"])
@pytest.mark.parametrize("overrides, error", [
    (["bogus_key=1"], "bogus_key: unknown key 'bogus_key'"),
    (["optim.lr=abc"], "optim.lr: Input should be a valid number"),
    (["drafter.options.ttt_stpes=2"], "drafter.options.ttt_stpes: unknown key"),
    (["drafter.kind=eagel3"], "drafter kind 'eagel3' (did you mean eagle3?)"),
    (["train.shard=zero3", "train.mixed_precision=fp16"], "train.shard=zero3: DeepSpeed's engine steps fp32"),
])
def test_a_bad_recipe_is_refused_before_torch_or_the_training_loop_loads(entry, overrides, error):
    """``drafterkit train``, ``python -m drafterkit.train`` and ``drafterkit features`` validate the recipe before
    the heavy imports: the shipped EAGLE-3 recipe (``target.dtype: auto``, resolved only after the schema passes)
    with a typo, a wrong type, an unknown option or an option that cannot apply is refused in one error line, exit
    2, with none of :data:`HEAVY` imported (they are imported only for a recipe that will run)."""
    out = subprocess.run([sys.executable, "-c", REFUSE, entry, str(ROOT / "recipes" / "eagle3.yaml"), *overrides],
                         capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"rc": 2, "loaded": []}, out.stderr
    assert error in out.stderr and "Traceback" not in out.stderr


def test_a_folder_or_an_empty_file_as_the_recipe_is_named_as_such(tmp_path):
    (tmp_path / "mine.yaml").write_text("output_dir: runs/x\n")
    with pytest.raises(FileNotFoundError, match=r"is a folder, not a YAML file.*YAML files in it: mine\.yaml"):
        load_recipe(tmp_path)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(RecipeError, match=r"empty\.yaml is empty: .*output_dir"):
        load_recipe(empty)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")
