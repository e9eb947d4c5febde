"""Training recipes: one YAML file, validated by pydantic v2, unknown keys are errors.

A recipe has the sections ``target``, ``drafter``, ``data``, ``loss``, ``optim``, ``train``, ``eval``,
``logging`` and one ``output_dir`` from which every path is derived (see :class:`RecipePaths`):

    output_dir/
        recipe.yaml                       the resolved recipe (every default filled in)
        checkpoints/step-N/ last/ best/   each holds drafter/ (save_pretrained), state/ (resume), recipe.yaml
        logs/                             tracker output (TensorBoard event files, wandb offline runs)
        eval/                             per-evaluation JSON (measured tau, acceptance, tokens/s)

Reruns into the same ``output_dir``: ``train.resume: auto`` continues from the newest complete
checkpoint there; ``train.resume: never`` refuses to start when ``checkpoints/`` already holds any
(so two runs never mix), unless ``train.overwrite: true`` (which needs ``resume: never``) deletes the
earlier run's ``checkpoints/``, ``eval/``, ``logs/`` and ``recipe.yaml`` first.

``drafter.options`` is validated by its kind's own pydantic model (``train.options.KINDS``), and
replaced by its resolved form (defaults filled in); the kind's recipe check (``train.options``) refuses,
before any model loads, what it cannot train. Command-line overrides are ``key.sub=value``
strings whose value is parsed as YAML (``optim.lr=1e-3``, ``logging.trackers=[wandb]``).

YAML 1.1 booleans. Recipe files and override values are read by :func:`load_yaml`, a safe loader that keeps
``yes`` / ``no`` / ``on`` / ``off`` / ``true`` / ``false`` as the words written; the schema then types
them: a boolean field reads them as booleans (pydantic's lax bool, any case), a field that takes strings
gets the word itself (``train.mixed_precision=no`` is ``'no'``, ``logging.run_name=off`` is ``'off'``),
where plain ``yaml.safe_load`` would hand it a bool and the field would refuse it.

Errors: :class:`RecipeError` (a ``ValueError``) whose message names each bad key by its dotted path
and, for an unknown key, lists the valid keys at that level.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from drafterkit.speceval.eval_args import MAX_DRAFT_TOKENS
from drafterkit.train.checkpoint import is_resumable
from drafterkit.train.recipe_loss import LOSS_NAMES, SECTION_CONFIG, LossSection  # noqa: F401
from drafterkit.train.data_engines import DataEngines
from drafterkit.train.draft_lengths import fit_draft_lengths
from drafterkit.train.options import feature_kinds, kind_recipe


YAML_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}  # YAML 1.1, any case


class RecipeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without the YAML 1.1 boolean resolver: ``no``, ``off``, ``yes``, ``on``, ``true``
    and ``false`` load as the strings written, for the recipe's schema to type (see the module docstring)."""


RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def load_yaml(text: str) -> Any:
    """Parse recipe YAML (a file's text or an override's value) with :class:`RecipeLoader`.

    Raises:
        yaml.YAMLError: the text is not valid YAML.
    """
    return yaml.load(text, Loader=RecipeLoader)  # a SafeLoader subclass: no arbitrary objects


class RecipeError(ValueError):
    """A recipe (file, dict or override) is invalid; the message names the key and the fix."""


class Section(BaseModel):
    model_config = SECTION_CONFIG


class TargetSection(Section):
    name_or_path: str = "smollm2-135m"
    # auto: bfloat16 where the device computes bf16 natively, else float32 (resolved by Recipe, after the schema)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"

    @field_validator("dtype", mode="before")
    @classmethod
    def _auto_any_case(cls, v: Any) -> Any:
        return "auto" if isinstance(v, str) and v.strip().lower() == "auto" else v


class DrafterSection(Section):
    kind: str = "draft_lm"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _validate_options(self) -> "DrafterSection":
        options_model = kind_recipe(self.kind).options_model  # ValueError for an unknown kind
        if "feature_cache" in self.options and "feature_cache" not in options_model.model_fields:
            raise ValueError("drafter.options.feature_cache: the feature cache is data.feature_cache now (auto, off "
                             "or a folder; built once by `drafterkit features RECIPE`)")
        try:
            parsed = options_model.model_validate(self.options)
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, options_model, "drafter.options")) from None
        object.__setattr__(self, "options", parsed.model_dump(mode="json"))
        return self

    def parsed_options(self) -> BaseModel:
        """The options as the kind's pydantic model (already validated)."""
        return kind_recipe(self.kind).options_model.model_validate(self.options)


class DataSection(Section, DataEngines):  # + the engines that make the data (train.data_engines)
    source: Literal["sharegpt", "jsonl"] = "sharegpt"
    # The file to train on (and draw held-out eval prompts from). source sharegpt: a ShareGPT JSON array
    # or JSONL ({"conversations": [{"from", "value"}]}), default the pinned ShareGPT V3 asset; source
    # jsonl: chat JSONL ({"messages": [{"role", "content"}]}), required. A missing file fails before the
    # target loads.
    path: str | None = None
    max_length: int = Field(512, ge=8)
    num_examples: int | None = Field(None, ge=1)
    heldout_fraction: float = Field(0.02, ge=0.0, lt=1.0)
    # refuse the data when more than this share of its conversations give no training example (the target's
    # chat template refuses them, special tokens as text, ...; those lost only to max_length are not counted);
    # the counts per reason are printed either way (train/data.py)
    max_skipped_fraction: float = Field(0.05, ge=0.0, le=1.0)
    regenerate: bool = False  # responses regenerated by the target (decode.generate), cached on disk
    regenerate_max_new_tokens: int = Field(256, ge=1)
    regenerate_batch_size: int = Field(32, ge=1)  # prompts per batched generate call
    on_policy_fraction: float = Field(0.0, ge=0.0, le=1.0)  # DistillSpec: batches sampled from the drafter
    on_policy_max_new_tokens: int = Field(64, ge=1)
    on_policy_temperature: float = Field(1.0, ge=0.0)
    # Target features of the head kinds (medusa, eagle, eagle3): "off" computes them with one target forward
    # per batch; "auto" reads the offline cache under $DRAFTERKIT_HOME/features, a folder reads the cache
    # under that folder. A missing, incomplete or torn cache is built first (see train/feature_cache.py;
    # `drafterkit features RECIPE` builds it ahead). on / yes / true mean auto, no / false mean off.
    feature_cache: str = "off"

    @field_validator("feature_cache", mode="before")
    @classmethod
    def _feature_cache(cls, v):
        if isinstance(v, bool):  # true / false from a recipe built in Python
            return "auto" if v else "off"
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"use auto, off or a folder, got {v!r}")
        word = v.strip().lower()
        if word == "auto" or word in YAML_BOOLS:  # on / yes / true mean auto, off / no / false off
            return "auto" if word == "auto" or YAML_BOOLS[word] else "off"
        # a folder must read as one (a path separator, or an existing folder): a typo such as 'atuo' would
        # otherwise build a cache of hundreds of MB under ./atuo
        if "/" not in v and "\\" not in v and not Path(v).is_dir():
            raise ValueError(f"{v!r} is neither auto, off nor a folder; use auto ($DRAFTERKIT_HOME/features), off, "
                             f"or a folder path such as ./{v}/ or /data/features")
        return v

    @field_validator("source", mode="before")
    @classmethod
    def _file_given_as_source(cls, v):
        if isinstance(v, str) and v not in ("sharegpt", "jsonl") and (v.endswith((".json", ".jsonl", ".gz"))
                                                                   or "/" in v):
            raise ValueError(f"the data's format ('sharegpt' or 'jsonl') goes here, not a file: use "
                             f"data.source=jsonl data.path={v} (or data.source=sharegpt data.path={v} for ShareGPT "
                             "conversations)")
        return v

    @model_validator(mode="after")
    def _path_for_jsonl(self) -> "DataSection":
        if self.source == "jsonl" and not self.path:
            raise ValueError("data.source is 'jsonl' but data.path is not set; give the chat JSONL file")
        return self


class OptimSection(Section):
    lr: float = Field(3e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"optim.betas must both be in [0, 1), got {list(v)}")
        return v


class TrainSection(Section):
    max_steps: int = Field(100, ge=1)  # optimizer steps
    max_minutes: float | None = Field(None, gt=0.0)  # wall-clock budget; stops cleanly, saves last/
    batch_size: int = Field(4, ge=1)  # per process, per micro-batch
    grad_accum: int = Field(1, ge=1)
    mixed_precision: Literal["no", "bf16", "fp16", "auto"] = "no"  # auto: bf16 where native, else no (Recipe resolves)
    seed: int = 0
    log_every: int = Field(10, ge=1)
    save_every: int = Field(0, ge=0)  # 0: no step-N checkpoints (last/ and best/ are always kept)
    # keep only the newest N step-N checkpoints (older ones are deleted after each save; None: keep all),
    # as transformers' TrainingArguments.save_total_limit; last/ and best/ are never deleted
    save_total_limit: int | None = Field(None, ge=1)
    # auto: continue from the newest complete checkpoint (last/ or step-N/, by global step) in output_dir,
    # or start at step 0 if there is none | never: start at step 0 (refused if output_dir already holds
    # checkpoints, unless overwrite) | a checkpoint folder with state/ (e.g. runs/x/checkpoints/step-200)
    resume: str = "auto"
    # true (with resume: never): delete output_dir's checkpoints/, eval/, logs/, recipe.yaml, start at step 0
    overwrite: bool = False
    cpu: bool = False  # force CPU even where an accelerator is present
    # none (data parallelism) | FSDP2 (train.sharding): drafter (parameters, gradients, optimizer state) | target
    # (decoder layers) | drafter+target | DeepSpeed (train.zero): zero2 (optimizer state, gradients) | zero3 (+params)
    shard: Literal["none", "drafter", "target", "drafter+target",
                   "zero2", "zero3", "zero2+target", "zero3+target"] = "none"

    @field_validator("resume")
    @classmethod
    def _resume(cls, v: str) -> str:
        if v in ("auto", "never"):
            return v
        if not Path(v).is_dir():
            raise ValueError(f"{v!r} is neither 'auto', 'never' nor an existing checkpoint folder; use auto "
                             "(continue from the newest checkpoint in output_dir), never (start at step 0) or "
                             "a folder such as runs/x/checkpoints/last")
        if not is_resumable(v):
            raise ValueError(f"{v!r} is not a checkpoint with a training state (needs state/ and "
                             "trainer_state.json: last/ or step-N/, not best/ or drafter/); use auto or never")
        return v

    @model_validator(mode="after")
    def _overwrite_starts_fresh(self) -> "TrainSection":
        # Not with auto: rerunning an interrupted overwrite command with resume=auto must not delete the run.
        if self.overwrite and self.resume != "never":
            raise ValueError(f"train.overwrite=true deletes the earlier run and starts at step 0, so it needs "
                             f"train.resume=never (got {self.resume!r}); to continue a run, drop train.overwrite")
        return self

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _mixed_precision_word(cls, v: Any) -> Any:
        """false / off (or False) mean no; auto is resolved after the schema (Recipe._resolve_auto_precision)."""
        word = str(v).strip().lower() if isinstance(v, (str, bool)) else None
        if word in ("no", "false", "off", "bf16", "fp16", "auto"):
            return word if word in ("bf16", "fp16", "auto") else "no"
        raise ValueError(f"use auto (bf16 where the device computes it natively, else no), no (also false / off), "
                         f"bf16 or fp16; got {v!r}")


class EvalSection(Section):
    every: int = Field(0, ge=0)  # optimizer steps between evaluations; 0: only at the end
    at_end: bool = True
    prompts: Literal["sharegpt_heldout", "mt_bench"] = "sharegpt_heldout"
    num_prompts: int = Field(8, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    k: int = Field(5, ge=1, le=MAX_DRAFT_TOKENS)  # draft tokens per verification (speceval.eval_args' bound)
    temperature: float = Field(0.0, ge=0.0)
    batch_size: int = Field(1, ge=1)


class LoggingSection(Section):
    trackers: list[Literal["tensorboard", "wandb"]] = Field(default_factory=lambda: ["tensorboard"])
    project: str = "drafterkit"
    run_name: str | None = None


class RecipePaths:
    """Every output path, derived from ``output_dir``."""

    def __init__(self, output_dir: str | Path):
        self.root = Path(output_dir)
        self.recipe = self.root / "recipe.yaml"
        self.checkpoints = self.root / "checkpoints"
        self.last = self.checkpoints / "last"
        self.best = self.checkpoints / "best"
        self.logs = self.root / "logs"
        self.eval = self.root / "eval"

    def step(self, n: int) -> Path:
        return self.checkpoints / f"step-{n}"


class Recipe(Section):
    """A whole training run. Build with :func:`load_recipe` / :func:`recipe_from_dict`."""

    output_dir: str
    license: str | None = None  # the export's model card license (e.g. mit) where the target states none
    target: TargetSection = Field(default_factory=TargetSection)
    drafter: DrafterSection = Field(default_factory=DrafterSection)
    data: DataSection = Field(default_factory=DataSection)
    loss: LossSection = Field(default_factory=LossSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)

    @model_validator(mode="after")
    def _feature_cache_for_feature_kinds(self) -> Recipe:
        if self.data.feature_cache != "off" and not kind_recipe(self.drafter.kind).reads_features:
            kinds = feature_kinds()
            raise ValueError(f"data.feature_cache: drafter kind {self.drafter.kind!r} reads no target features (it "
                             f"needs the target's logits on every batch); set data.feature_cache: off (feature "
                             f"caches serve {kinds})")
        return self

    @model_validator(mode="after")
    def _shard_fits(self) -> Recipe:
        shard = self.train.shard
        if "target" in shard and (self.eval.every or self.eval.at_end):
            raise ValueError(f"train.shard={shard}: the in-training evaluation decodes with the whole target on the "
                             "main process alone, which a sharded target is not; set eval.every=0 eval.at_end=false "
                             "and measure the saved drafter afterwards with drafterkit eval")
        if shard not in ("none", "target") and self.data.on_policy_fraction > 0:
            raise ValueError(f"train.shard={shard}: on-policy batches sample from the drafter on each process outside "
                             "its forward, which a sharded drafter cannot; set data.on_policy_fraction=0 or "
                             "train.shard=none")
        if shard.startswith("zero") and self.train.mixed_precision == "fp16":
            raise ValueError(f"train.shard={shard}: DeepSpeed's engine steps fp32 weights without accelerate's fp16 "
                             "loss scaler, so fp16 gradients could underflow; set train.mixed_precision=bf16 or no")
        return self

    @model_validator(mode="after")
    def _kind_can_train_this(self) -> Recipe:
        # a loss term, data setting or option value the drafter kind cannot train on is refused here, with the
        # key, the kind and the fix (the kind's recipe check, see train.options)
        if why := importlib.import_module("drafterkit.train.target_decoding").decoding_refusal(self):
            raise ValueError(why)  # what decodes with a target the decoder cannot verify with (train.target_decoding)
        check = kind_recipe(self.drafter.kind).check
        if check is not None:
            check(self)
        return self

    @model_validator(mode="after")
    def _draft_lengths_fit_the_drafter(self) -> Recipe:
        fit_draft_lengths(self)  # eval.k / loss.draft_steps vs the drafter's bound; after the kind's own checks
        return self

    @model_validator(mode="after")
    def _resolve_auto_precision(self) -> Recipe:
        """``target.dtype: auto`` and ``train.mixed_precision: auto`` become bfloat16 / bf16 where the run's
        device computes bf16 natively (``assets.device.native_bf16``) and float32 / no elsewhere, with a
        warning saying why; the validated (and saved) recipe holds what runs. The last check (pydantic runs
        after-validators in the order defined; none before reads these two fields as more than "fp16" or not),
        so a recipe refused by its schema or by a check that needs no target never imports torch, which finding
        the device takes."""
        auto_dtype, auto_mixed = self.target.dtype == "auto", self.train.mixed_precision == "auto"
        if not (auto_dtype or auto_mixed):
            return self
        device = importlib.import_module("drafterkit.assets.device")
        native = device.native_bf16("cpu" if self.train.cpu else None)
        if auto_dtype:
            self.target.dtype = "bfloat16" if native else "float32"
        if auto_mixed:
            self.train.mixed_precision = "bf16" if native else "no"
        if not native:
            keys = " and ".join(k for k, on in (("target.dtype", auto_dtype), ("train.mixed_precision", auto_mixed))
                                if on)
            warnings.warn(f"{keys}: auto -> float32 here: this device has no native bf16 units (on a CPU: "
                          "avx512_bf16 / amx_bf16), where bf16 runs several times slower than float32; set "
                          "target.dtype=bfloat16 / train.mixed_precision=bf16 to force bf16", UserWarning, stacklevel=1)
        return self

    @property
    def paths(self) -> RecipePaths:
        return RecipePaths(self.output_dir)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def save(self, path: str | Path) -> Path:
        """Write the resolved recipe as YAML to ``path`` (a file, or a folder -> ``recipe.yaml``)."""
        path = Path(path)
        if path.suffix not in (".yaml", ".yml"):
            path = path / "recipe.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml())
        return path


# --- errors ----------------------------------------------------------------------------------------

def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at ``loc[:-1]`` (None if not a model)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if isinstance(part, str) else None
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def format_validation_error(err: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """One line per problem: ``path: message``; unknown keys list the valid keys at their level."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join([prefix] * bool(prefix) + [str(p) for p in loc]) or "(top level)"
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            holder = _model_at(model, loc)
            valid = sorted(holder.model_fields) if holder else []
            msg = f"unknown key {loc[-1]!r}; valid keys here: {valid}"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] in ("model_type", "model_attributes_type", "dict_type") and (
                section := _model_at(model, (*loc, ""))) is not None:
            keys = sorted(section.model_fields)
            example = "kind" if "kind" in keys else keys[0]
            value = e.get("input") if isinstance(e.get("input"), (str, int, float)) else "..."
            msg = (f"is a section with keys {keys}, not a value ({e.get('input')!r}): set a key of it, e.g. "
                   f"{path}.{example}={value}")
        # a nested validator's message already names its full path (drafter.options.<key>: ...), and so
        # does a check across sections of the whole recipe (data.feature_cache: ...)
        named = msg.startswith(f"{path}.") or (not loc and re.match(r"[a-z_]+\.[a-z_.]+: ", msg))
        lines.append(msg if named else f"{path}: {msg}")
    return "\n".join(lines)


# --- loading ---------------------------------------------------------------------------------------

def apply_overrides(data: dict, overrides: list[str] | None) -> dict:
    """Apply ``key.sub=value`` strings to a nested dict (values parsed with :func:`load_yaml`: ``no`` / ``off`` /
    ``yes`` / ``on`` / ``true`` / ``false`` stay words, for the schema to type).

    Raises:
        RecipeError: an override without ``=`` or with an empty key, one whose value is not valid YAML, or
            one that descends into a non-mapping value.
    """
    data = dict(data)
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"override {item!r} is not of the form key.sub=value (e.g. optim.lr=1e-3)")
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise RecipeError(f"override {item!r}: {'.'.join(parts[:i + 1])} is not a section")
            node[part] = child = dict(child)
            node = child
        try:
            node[parts[-1]] = _parse_value(raw)
        except yaml.YAMLError as exc:
            first = str(exc).strip().splitlines()[0]
            raise RecipeError(f"override {item!r}: its value is not valid YAML ({first}); quote it, or close the "
                              "bracket (e.g. logging.trackers=[tensorboard])") from None
    return data


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)$")


def _parse_value(raw: str) -> Any:
    """:func:`load_yaml`, plus ``1e-3``-style floats (YAML 1.1 reads those as strings)."""
    if not raw.strip():
        return None
    value = load_yaml(raw)
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        return float(value)
    return value


def recipe_from_dict(data: dict, overrides: list[str] | None = None) -> Recipe:
    """Validate a recipe dict (after ``overrides``). Raises :class:`RecipeError`."""
    if not isinstance(data, dict):
        raise RecipeError(f"a recipe must be a YAML mapping of sections, got {type(data).__name__}")
    data = apply_overrides(data, overrides)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError("invalid recipe:\n" + format_validation_error(exc, Recipe)) from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read and validate a YAML recipe. Raises :class:`RecipeError` (or ``FileNotFoundError``)."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.y*ml"))[:5]
        hint = f"; YAML files in it: {', '.join(inside)}" if inside else ""
        raise FileNotFoundError(f"recipe {path} is a folder, not a YAML file: pass the recipe file, e.g. "
                                f"recipes/smoke.yaml{hint}")
    if not path.is_file():
        raise FileNotFoundError(f"recipe {path} not found; see recipes/ for examples (recipes/smoke.yaml)")
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        raise RecipeError(f"{path} is empty: a recipe is a YAML mapping that sets at least output_dir (the target, "
                          "drafter and data sections have defaults); copy one from recipes/ (recipes/smoke.yaml is "
                          "the smallest)")
    try:
        return recipe_from_dict(data, overrides)
    except RecipeError as exc:
        raise RecipeError(f"{path}: {exc}") from None
