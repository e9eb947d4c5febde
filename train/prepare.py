"""Everything a training run does before its first step: checks that need no model (:func:`preflight`),
the accelerator (:func:`make_accelerator`), the frozen target, the drafter, the data (the offline feature
cache when the recipe reads one), the optimizer and the schedule, all prepared by accelerate, and the
eval prompts (:func:`setup_run`).

User errors (a bad drafter option for this target, a missing data file, an output_dir holding another
run) raise :class:`train.recipe.RecipeError` as early as possible, before the heavy work.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil

import torch

from drafterkit.assets import target as assets_target  # load_target looked up at call time: one place to replace it
from drafterkit.assets.records import a_or_an, unwritable_folder
from drafterkit.assets.target import same_target
from drafterkit.drafters.target.layers import fresh_init_note as layers_fresh_init_note
from drafterkit.drafters.target.record import trained_target
from drafterkit.train.checkpoint import find_resume, saved_kind
from drafterkit.train.data import DataError
from drafterkit.train.distributed import (
    check_distributed_request,
    check_distributed_result,
    check_shard_world,
    engine_line,
    fsdp_ignore_borrowed,
    make_engine,
)
from drafterkit.train.evaluate import EvalPrompts, eval_prompt_ids
from drafterkit.train.feature_cache import (
    FeatureCacheError,
    open_recipe_cache,
    recipe_cache_state,
    target_fingerprint,
)
from drafterkit.train.recipe import Recipe, RecipeError
from drafterkit.train.recipe_data import load_data, recipe_data_file
from drafterkit.train.regenerate import responses_fingerprint
from drafterkit.train.sharding import (
    ENGINE_NAMES,
    ShardedDrafter,
    device_mesh,
    drafter_engine,
    saved_engine,
    shard_target,
    shards,
    zero_stage,
)
from drafterkit.train.step import BudgetSchedule, RunContext
from drafterkit.train.strategies import get_strategy
from drafterkit.train.target_shards import gathered_layers, layers_read_at_build, load_run_target
from drafterkit.train.zero import ZeroDrafter, check_zero_request, check_zero_resume


def assert_frozen(target: torch.nn.Module) -> None:
    """Raise ``RuntimeError`` if any target parameter requires grad (the target must stay frozen)."""
    bad = [n for n, p in target.named_parameters() if p.requires_grad]
    if bad:
        raise RuntimeError(f"target parameters {bad[:4]} require grad; the target must stay frozen "
                           "(load it with assets.target.load_target)")


def fresh_init_note(recipe: Recipe, target: torch.nn.Module) -> str | None:
    """The one line saying the drafter's layers start fresh although ``init_from_target_layer`` asked to start
    them from the target's (none of its layers maps: DeepSeek's latent attention), or None."""
    if not getattr(recipe.drafter.parsed_options(), "init_from_target_layer", False):
        return None
    return layers_fresh_init_note(target, recipe.drafter.kind)


def make_accelerator(recipe: Recipe):
    """An ``Accelerator`` for the recipe; checks the trackers are importable.

    Raises:
        RuntimeError: ``wandb`` selected but not installed (``pip install drafterkit[wandb]``).
    """
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    trackers = list(recipe.logging.trackers)
    if "wandb" in trackers and importlib.util.find_spec("wandb") is None:
        raise RuntimeError("logging.trackers includes 'wandb' but wandb is not installed: "
                           "pip install drafterkit[wandb] (or drop wandb from logging.trackers)")
    requested = check_distributed_request(recipe)
    paths = recipe.paths
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and (recipe.train.cpu or not torch.cuda.is_available()):
        # torchrun / accelerate launch with several processes on CPU: without this accelerate treats every
        # process as a separate single-process run (DistributedType.NO) instead of MULTI_CPU over gloo.
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    acc = Accelerator(mixed_precision=recipe.train.mixed_precision, cpu=recipe.train.cpu,
                      log_with=trackers or None,  # no gradient accumulation here: train.step normalises the step
                      project_config=ProjectConfiguration(project_dir=str(paths.root), logging_dir=str(paths.logs)))
    check_distributed_result(acc, requested)
    return acc


def preflight(recipe: Recipe) -> None:
    """Checks that need no model: run before anything heavy loads.

    Raises:
        RecipeError: ``data.path`` is not a file; ``output_dir`` cannot be written
            (:func:`assets.records.unwritable_folder`); ``output_dir`` already holds checkpoints of another
            run and this one would start at step 0 (``train.resume: never``, or ``auto`` with nothing
            resumable) without ``train.overwrite``; a sharded engine the launcher asked for cannot run here
            (:func:`check_distributed_request`); ``train.shard`` in a single process
            (:func:`check_shard_world`); ``train.shard: zero2 | zero3`` where DeepSpeed cannot run
            (:func:`train.zero.check_zero_request`); a resume from a checkpoint whose drafter another engine
            trained (:func:`train.sharding.saved_engine`) or whose drafter is another kind
            (:func:`train.checkpoint.saved_kind`), or from a ZeRO checkpoint on another number of
            processes (:func:`train.zero.check_zero_resume`), or from a checkpoint whose recipe.yaml records
            another target (:func:`assets.target.same_target`, the rule of the target mismatch checks).
    """
    check_distributed_request(recipe)
    recipe_data_file(recipe.data)
    if why := unwritable_folder(recipe.paths.root):
        raise RecipeError(f"output_dir {recipe.output_dir}: {why}; give a folder you can write (output_dir=DIR)")
    cfg, ckpts = recipe.train, recipe.paths.checkpoints
    resume = None if cfg.overwrite else find_resume(recipe)
    kind = saved_kind(resume) if resume is not None else None
    if kind not in (None, recipe.drafter.kind):
        raise RecipeError(f"cannot resume {resume}: it is {a_or_an(kind)} checkpoint and this recipe trains "
                          f"drafter.kind={recipe.drafter.kind}; train into another output_dir (output_dir=DIR), or "
                          f"continue that run with drafter.kind={kind} and its options (its recipe.yaml), or start "
                          "over with train.resume=never train.overwrite=true")
    if resume is not None and saved_engine(resume / "state") != drafter_engine(recipe):
        saved = ENGINE_NAMES[saved_engine(resume / "state")]
        raise RecipeError(f"cannot resume {resume} with train.shard={cfg.shard}: its drafter was {saved} when it was "
                          "saved; resume with the train.shard of that run (its recipe.yaml), or train into a new "
                          "output_dir")
    if resume is not None:
        check_zero_resume(resume / "state", recipe)
        if (recorded := trained_target(resume / "drafter")) and not same_target(recorded, recipe.target.name_or_path):
            raise RecipeError(f"cannot resume {resume}: it was trained for target {recorded} (its recipe.yaml), not "
                              f"this recipe's {recipe.target.name_or_path}, whose features and distribution the "
                              f"drafter was not fitted to; continue it with target.name_or_path={recorded}, or "
                              f"train for {recipe.target.name_or_path} from step 0 (train.resume=never, in another "
                              "output_dir)")
    check_shard_world(recipe)
    check_zero_request(recipe)
    if cfg.overwrite or not ckpts.is_dir() or resume is not None:
        return
    held = sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".tmp-"))
    if held:
        why = "train.resume is never" if cfg.resume == "never" else "none of them can be resumed"
        raise RecipeError(f"{ckpts} already holds checkpoints of an earlier run ({', '.join(held)}) and {why}; "
                          "a new run there would mix with them. Either continue that run with train.resume=auto, "
                          f"or train into a new output_dir (or delete {recipe.paths.root}); "
                          "train.overwrite=true (with train.resume=never) deletes the earlier run's checkpoints, "
                          "eval and logs first")


def _clear_output_dir(recipe: Recipe, acc) -> None:
    """``train.overwrite``: delete what an earlier run wrote under ``output_dir`` (main process only)."""
    if recipe.train.overwrite and acc.is_main_process:
        paths = recipe.paths
        for folder in (paths.checkpoints, paths.eval, paths.logs):
            shutil.rmtree(folder, ignore_errors=True)
        paths.recipe.unlink(missing_ok=True)
    acc.wait_for_everyone()


def setup_run(recipe: Recipe, target=None, tokenizer=None) -> RunContext:
    """Accelerator, frozen target, drafter, data, optimizer and schedule, all prepared.

    The drafter is built right after the target loads (before data), so a drafter option that does
    not fit the target fails fast. Raises :class:`RecipeError` for drafter, data and eval-prompt errors.
    """
    from accelerate.utils import set_seed

    acc = make_accelerator(recipe)
    acc.print(engine_line(recipe, acc))
    _clear_output_dir(recipe, acc)
    set_seed(recipe.train.seed)
    target, tokenizer, target_sharded = _load_target(recipe, acc, target, tokenizer)
    if target_sharded:  # the data caches' keys read each tensor whole: gathered now, by every process together
        for key, used in ((responses_fingerprint, recipe.data.regenerate),
                          (target_fingerprint, recipe.data.feature_cache != "off")):
            if used:
                key(target)
    assert_frozen(target)
    target.eval()
    strategy = get_strategy(recipe.drafter.kind)
    # A target loaded sharded: the layers the drafter's build copies are gathered whole meanwhile (every process)
    whole = gathered_layers(target, layers_read_at_build(recipe, target)) if target_sharded \
        else contextlib.nullcontext()
    # The main process builds (and caches) the data first: dataset building and regeneration write shared
    # cache folders; the other processes then read them.
    with whole, acc.main_process_first():
        try:
            drafter = strategy.build(recipe, target, tokenizer)
        except DataError as exc:  # a kind that counts the data's tokens as it builds (EAGLE-3's draft vocabulary)
            raise RecipeError(f"data: {exc}") from None
        except ValueError as exc:
            raise RecipeError(f"drafter ({recipe.drafter.kind}, target {recipe.target.name_or_path}): {exc}") from None
        if note := fresh_init_note(recipe, target):
            acc.print(note)
        params = [p for p in drafter.parameters() if p.requires_grad]
        if not params:
            raise RecipeError(f"the {recipe.drafter.kind} drafter has no trainable parameters; check drafter.options")
        try:
            ds = load_data(recipe, target, tokenizer)
        except (ValueError, FileNotFoundError) as exc:
            raise RecipeError(f"data: {exc}") from None
        if recipe.data.feature_cache != "off" and (why := _cache_skipped(recipe, target, ds)):
            acc.print(why)
            recipe.data.feature_cache = "off"  # online features; the saved recipe.yaml says what ran
        if recipe.data.feature_cache != "off":  # batches carry the cached features: no target forward
            try:
                ds = open_recipe_cache(recipe, target, ds, write=acc.is_main_process)
            except FeatureCacheError as exc:
                raise RecipeError(f"data.feature_cache: {exc}") from None
    drafter, sharded = _shard(recipe, acc, target, drafter, target_sharded)
    params = [p for p in drafter.parameters() if p.requires_grad]  # sharded ones (DTensors) under FSDP2
    o = recipe.optim
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    if zero_stage(recipe):  # DeepSpeed's engine takes the drafter and this AdamW (over its ZeRO partitions)
        sharded = ZeroDrafter(drafter, strategy, recipe, optimizer, acc.num_processes, acc.is_main_process)
    # a scheduler prepared by accelerate steps once per process per optimizer step; drafterkit's own, once
    world = 1 if zero_stage(recipe) else acc.num_processes
    schedule = BudgetSchedule(o.schedule, o.warmup_steps, recipe.train.max_steps, world, recipe.train.max_minutes)
    # a plain function: LambdaLR saves no state for it, so a resumed run takes the schedule from its recipe
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda count: schedule(count))
    if sharded is None:
        fsdp_ignore_borrowed(acc, drafter)
        drafter, optimizer, scheduler = acc.prepare(drafter, optimizer, scheduler)
        params = [p for p in drafter.parameters() if p.requires_grad]  # accelerate's FSDP2 replaces them
    elif not zero_stage(recipe):  # drafterkit's own FSDP2: accelerate must not wrap the drafter in DDP
        optimizer, scheduler = acc.prepare(optimizer, scheduler)
    # under DeepSpeed nothing goes through accelerate: the engine steps the drafter and its optimizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        prompts = _eval_prompts(recipe, tokenizer)
    except ValueError as exc:
        raise RecipeError(f"eval prompts: {exc}") from None
    return RunContext(recipe=recipe, accelerator=acc, target=target, tokenizer=tokenizer, data=ds, strategy=strategy,
                      drafter=drafter, params=params, optimizer=optimizer, scheduler=scheduler, schedule=schedule,
                      pad_id=pad, prompts=prompts, sharded=sharded,
                      engine=make_engine(recipe, acc, drafter, sharded, optimizer, params))


def feature_cache_pays(recipe: Recipe, examples: int, *, budget_counts_build: bool = False) -> str | None:
    """The one rule for building a missing offline feature cache (``data.feature_cache``): None where the build
    pays back within the run, else why not (a clause for a message).

    A build costs one target pass per example, about what an online step pays for that example, so a cache gives
    time back only where training reads each example more than once: where ``train.max_steps`` x examples per
    optimizer step (``batch_size`` x ``grad_accum`` x processes) exceeds the ``examples`` it holds (docs/training.md,
    "Features in the quickstart": a 20-step run of recipes/eagle3.yaml built a 1.38 GB cache in 151 s to read 20 of
    its 1,200 examples). Where a time budget counts the build (``budget_counts_build``: the quickstart's
    ``--minutes`` counts data preparation), it never pays within the run: measured on a 2-core CPU in fp32, the
    budget covered less than one pass over the data. ``drafterkit features`` builds it outside any run."""
    if budget_counts_build:
        return ("the --minutes budget counts data preparation, and a build costs a target pass per example, about "
                "what an online step pays for it: within the budget it gives back less than it costs")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    t = recipe.train
    read = t.max_steps * t.batch_size * t.grad_accum * world
    if read > examples:
        return None
    return (f"this run reads at most {read:,} examples (train.max_steps {t.max_steps} x batch_size {t.batch_size} x "
            f"grad_accum {t.grad_accum} x {world} process{'es' if world > 1 else ''}) of the {examples:,} a cache "
            "would hold, and a build costs a target pass per example, about what an online step pays for it: it "
            "pays only where training reads each example more than once")


def _cache_skipped(recipe: Recipe, target, ds) -> str | None:
    """Where the recipe reads the offline feature cache but it is missing or incomplete and building it does not
    pay (:func:`feature_cache_pays`): the line saying this run computes features online, why, and how to build the
    cache for later runs; else None (a complete cache is read, or one is built first)."""
    spec, complete = recipe_cache_state(recipe, target, ds)
    why = None if complete else feature_cache_pays(recipe, len(spec.lengths))
    if why is None:
        return None
    return (f"features: online, one target forward per step; no complete feature cache for this data in "
            f"{spec.path.parent}, and none is built: {why}. `drafterkit features RECIPE` builds it outside any run "
            f"({spec.tokens:,} tokens, {spec.tokens * spec.bytes_per_token / 1e9:.2f} GB), and later runs read it")


def _load_target(recipe: Recipe, acc, target, tokenizer):
    """``(target, tokenizer, sharded)``: the target given, else the recipe's, loaded shard by shard when
    ``train.shard`` names it (``train.target_shards.load_run_target``; ``sharded`` tells it is so already)."""
    if target is not None:
        return target, tokenizer, False
    if shards(recipe)[1]:
        return load_run_target(recipe, acc.device, device_mesh(acc.device), is_main=acc.is_main_process)
    target, tokenizer = assets_target.load_target(recipe.target.name_or_path, dtype=recipe.target.dtype,
                                                  device=acc.device, chat=True)
    return target, tokenizer, False


def _shard(recipe: Recipe, acc, target, drafter, target_sharded: bool = False):
    """Apply ``train.shard`` (``train.sharding``) after the data is ready (building it may run the whole
    target on the main process); a target loaded sharded (``target_sharded``) is left as it is.
    Returns ``(drafter, ShardedDrafter or None)``."""
    shard_drafter, shard_target_too = shards(recipe)
    if not (shard_drafter or shard_target_too):
        return drafter, None
    mesh = device_mesh(acc.device)
    if shard_target_too and not target_sharded:
        try:
            shard_target(target, mesh)
        except ValueError as exc:
            raise RecipeError(f"train.shard={recipe.train.shard}: {exc}; use train.shard=drafter or none") from None
    if not shard_drafter:
        return drafter, None
    sharded = ShardedDrafter(drafter, mesh, acc.is_main_process)
    return sharded.module, sharded


def _eval_prompts(recipe: Recipe, tokenizer) -> EvalPrompts | list[list[int]]:
    if recipe.eval.every == 0 and not recipe.eval.at_end:
        return []
    return eval_prompt_ids(recipe, tokenizer)
