"""``drafterkit export CKPT --format FMT --output DIR [--push-to-hub REPO]``: checkpoints for serving engines.

Formats:

* ``vllm-eagle3`` / ``sglang-eagle3`` (an ``eagle3`` checkpoint): the layout both engines load for
  ``LlamaForCausalLMEagle3`` (vLLM ``model_executor/models/llama_eagle3.py``, SGLang ``srt/models/llama_eagle3.py``):
  ``config.json`` (``architectures``, ``draft_vocab_size``, ``target_hidden_size``, ``num_hidden_layers`` (the head's
  layers), ``eagle_config.eagle_aux_hidden_state_layer_ids``) and ``model.safetensors`` with ``fc.weight``,
  ``midlayer.{self_attn,mlp,input_layernorm,hidden_norm,post_attention_layernorm}.*`` (a multi-layer head:
  ``layers.{i}.*``, vLLM only), ``norm.weight``, ``lm_head.weight [N, H]`` and, for a reduced draft vocabulary only
  (``N < V``), ``d2t [N]`` (int64 offsets) and ``t2d [V]`` (bool): vLLM has a parameter for ``d2t`` only then and loads
  strictly. The embedding is not written: both engines share the target's when ``embed_tokens`` is absent. The two
  formats differ in the feature layer ids (:func:`engine_layer_ids`): ``vllm-eagle3`` writes drafterkit's ids (the input
  of decoder layer i); ``sglang-eagle3`` writes ``i - 1`` (SGLang captures the input of layer id+1), or no ids when they
  are SGLang's default capture ``[2, L//2, L-3]``. Ids an engine cannot express are refused (SGLang: id 0; both: id L,
  repeated ids); ids out of layer order are sorted, with fc's input blocks permuted to match (both engines capture in
  layer order). :func:`load_eagle3_export` loads either export back.
* ``vllm-peagle`` (a ``peagle`` checkpoint): the ``vllm-eagle3`` layout plus ``mask_hidden`` and ``mask_token_id``
  (``pard_token``), what vLLM's parallel drafting loads (:mod:`drafters.export.eagle3_layout`, where the EAGLE-3 layout
  is written); served with ``{"method": "eagle3", "parallel_drafting": true}``.
* ``vllm-dflash`` (a ``dflash`` checkpoint): vLLM's ``DFlashDraftModel`` (``models/qwen3_dflash.py``): the
  tensors as saved (drafterkit uses the loader's names), a Qwen3 ``config.json`` with ``block_size`` and
  ``dflash_config`` (``mask_token_id``, ``target_layer_ids`` = drafterkit ids - 1); :func:`load_dflash_export`.
* ``vllm-dspark`` (a ``dspark`` checkpoint): vLLM's ``Qwen3DSparkModel`` (``models/qwen3_dspark.py``): the
  ``vllm-dflash`` layout plus ``markov_head.*`` / ``confidence_head.*`` and the config fields ``markov_rank``,
  ``enable_confidence_head``, ``confidence_head_with_markov``, ``draft_vocab_size``, ``dspark_noise_token_id``,
  ``sample_from_anchor: true``; :func:`export_dspark`, :func:`load_dspark_export`. vLLM 0.32 serves it with Model
  Runner V2 only.
* ``medusa`` (a ``medusa`` checkpoint): vLLM's ``MedusaModel`` layout: ``blocks.{k}.layers.{j}.weight`` / ``.bias``
  (``medusa_fc_bias: true``), ``lm_heads.{k}.weight``; a head shared with the target is written once as
  ``lm_heads.0.weight`` with ``original_lm_head: true`` (from ``--target``, else the target the training recipe
  records); ``config.json`` also carries the
  FasterDecoding/Medusa keys ``medusa_num_heads`` / ``medusa_num_layers``.
* ``hf-assistant`` (a ``draft_lm`` checkpoint): a plain transformers folder, usable as ``model.generate(...,
  assistant_model=AutoModelForCausalLM.from_pretrained(DIR))``, with the tokenizer of the target (``--target``,
  else the one the training recipe records).

``CKPT`` is anything ``drafters.resolve_checkpoint`` accepts: a drafter folder, a training checkpoint holding
``drafter/`` (``OUTPUT_DIR/checkpoints/last``) or a run's ``OUTPUT_DIR`` (``checkpoints/best``, else ``last``).

Every export but ``hf-assistant`` records the drafter folder it was written from under the ``drafterkit`` block of
``config.json`` (engines ignore it): ``"source": {"drafter": PATH RELATIVE TO THE EXPORT, "model_sha256": ...}``
(``drafter`` is null where that relative path would climb to the root or through the home folder), which
:func:`recorded_source` reads back for ``drafterkit serve-check``. No file of an export names an absolute path
(:mod:`drafters.export.portable`): exports are uploaded as they are.

Every export also holds ``README.md``, a model card (Hub metadata, serve commands, training record,
measured numbers or the command that measures them; see :mod:`drafters.export.model_card`).

``--push-to-hub REPO`` uploads the export (card included) with ``huggingface_hub``; the repo id and the Hub's
reachability are checked first, in seconds: offline, it exits 2 at once (the export is still written when
``--output`` was given; without ``--output``, which ``--push-to-hub`` allows, nothing is written).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from drafterkit.assets.device import resolve_dtype
from drafterkit.assets.file_modes import apply_umask
from drafterkit.assets.records import unwritable_folder
from drafterkit.assets.target import (TargetLoadError, hub_reachable, load_target_model, load_target_tokenizer,
                                     read_config_dict)
from drafterkit.drafters import get_kind, load_drafter, resolve_checkpoint
from drafterkit.drafters.base import (DrafterLoadError, ExportError, left_out, nonfinite_tensors, read_config,
                                      read_weights, save_tensors, weights_sha256)
from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter
from drafterkit.drafters.export.eagle3_layout import (  # noqa: F401 (the EAGLE-3 layout's names, also read from here)
    cast_tensors,
    drafterkit_layer_ids,
    engine_layer_ids,
    export_eagle3,
    export_peagle,
    layer_ids_refusal,
    load_eagle3_export,
    load_peagle_export,
    sglang_default_layers,
)
from drafterkit.drafters.export.model_card import vllm_serve_problem, write_model_card
from drafterkit.drafters.export.portable import source_link
from drafterkit.drafters.export.vllm_support import draft_layer_types_problem
from drafterkit.drafters.kinds import FormatView, export_format
from drafterkit.drafters.target.record import trained_target
from drafterkit.drafters.target.trained_for import trained_for_problem

FORMATS = FormatView()  # --format -> the kind it exports, read from each kind's formats in drafters.kinds.KINDS


def record_source(out: Path, ckpt: Path) -> None:
    """Add ``"source": {"drafter", "model_sha256"}`` (the drafter folder ``ckpt`` relative to ``out``, or None where
    that path would name the machine's folders (:func:`drafters.export.portable.source_link`), and the sha256 of its
    ``model.safetensors``) to the ``drafterkit`` block of ``out/config.json``: an export names no absolute path."""
    config = json.loads((out / "config.json").read_text())
    config["drafterkit"]["source"] = {"drafter": source_link(ckpt, out), "model_sha256": weights_sha256(ckpt)}
    (out / "config.json").write_text(json.dumps(config, indent=2))


def export_dflash(ckpt: Path, out: Path, dtype: torch.dtype | None = None) -> Path:
    """Write vLLM's DFlash layout (``DFlashDraftModel``, ``model_executor/models/qwen3_dflash.py``) of the
    ``dflash`` checkpoint ``ckpt`` into ``out``: its tensors as saved (the checkpoint already uses the loader's
    names; no ``embed_tokens`` and, for a full vocabulary, no ``lm_head``: vLLM shares the target's), and a
    Qwen3 ``config.json`` with ``block_size``, ``num_hidden_layers`` (draft layers) and ``dflash_config``
    (``mask_token_id``, ``target_layer_ids`` = drafterkit ids - 1: vLLM captures the input of layer id + 1).

    Raises:
        ExportError: not a dflash checkpoint.
    """
    _, cfg = read_config(ckpt)
    state = read_weights(ckpt)
    if not {"fc.weight", "hidden_norm.weight", "norm.weight"} <= state.keys():
        raise ExportError(f"{ckpt} lacks fc / hidden_norm / norm; is it a dflash checkpoint?")
    reduced = cfg["draft_vocab_size"] < cfg["vocab_size"]
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": cfg["hidden_size"], "target_hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"], "num_hidden_layers": cfg["num_layers"],
        "num_attention_heads": cfg["num_attention_heads"], "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"], "hidden_act": "silu", "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"], "max_position_embeddings": 8192, "attention_bias": False,
        "tie_word_embeddings": False, "vocab_size": cfg["vocab_size"],
        **({"draft_vocab_size": cfg["draft_vocab_size"]} if reduced else {}),
        "block_size": cfg["block_size"], "num_target_layers": cfg["target_num_layers"],
        "dflash_config": {"mask_token_id": cfg["mask_token_id"],
                          "target_layer_ids": [int(i) - 1 for i in cfg["feature_layers"]]},
        "torch_dtype": str(dtype or state["fc.weight"].dtype).removeprefix("torch."),
        "drafterkit": {"kind": "dflash", "engine": "vllm", "target_num_layers": cfg["target_num_layers"]},
    }
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(cast_tensors(state, dtype), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def export_dspark(ckpt: Path, out: Path, dtype: torch.dtype | None = None) -> Path:
    """Write vLLM's DSpark layout (``Qwen3DSparkModel``, ``model_executor/models/qwen3_dspark.py``) of the ``dspark``
    checkpoint ``ckpt`` into ``out``: :func:`export_dflash`'s layout and tensors (``markov_head.markov_w1.weight
    [V, r]``, ``markov_head.markov_w2.weight [N, r]``, ``confidence_head.proj.{weight [1, H + r], bias [1]}``
    among them, names as saved) and a ``config.json`` naming the architecture and DSpark's fields (the block is
    vLLM's ``sample_from_anchor`` one: the bonus token drafts the first token).

    Raises:
        ExportError: not a dspark checkpoint.
    """
    _, cfg = read_config(ckpt)
    if "markov_head.markov_w1.weight" not in read_weights(ckpt):
        raise ExportError(f"{ckpt} lacks markov_head tensors; is it a dspark checkpoint?")
    export_dflash(ckpt, out, dtype)
    config = json.loads((out / "config.json").read_text())
    config.update({
        "architectures": ["Qwen3DSparkModel"], "draft_vocab_size": cfg["draft_vocab_size"],
        "markov_rank": cfg["markov_rank"], "enable_confidence_head": bool(cfg["confidence_head"]),
        "confidence_head_with_markov": bool(cfg["confidence_with_markov"]),
        "dspark_noise_token_id": cfg["mask_token_id"], "sample_from_anchor": True,
    })
    config["drafterkit"]["kind"] = "dspark"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def load_dflash_export(path: str | Path, target: torch.nn.Module, kind: str = "dflash") -> DFlashDrafter:
    """Load a ``vllm-dflash`` export back into a :class:`DFlashDrafter` for ``target`` (strict); ``kind="dspark"``:
    a ``vllm-dspark`` export into a :class:`DSparkDrafter` (:func:`load_dspark_export`).

    Raises:
        DrafterLoadError: not an export of ``kind``, a config this version refuses, or a tensor mismatch.
    """
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        if config["drafterkit"].get("kind") != kind:
            raise KeyError("kind")
        fields = {k: config[k] for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                         "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "block_size")}
        if kind == "dspark":
            fields.update(markov_rank=int(config["markov_rank"]), confidence_head=config["enable_confidence_head"],
                          confidence_with_markov=config["confidence_head_with_markov"])
        dcfg = config["dflash_config"]
        cfg = (DSparkConfig if kind == "dspark" else DFlashConfig)(
            **fields, target_num_layers=int(config["num_target_layers"]), num_layers=int(config["num_hidden_layers"]),
            draft_vocab_size=int(config.get("draft_vocab_size", config["vocab_size"])),
            mask_token_id=int(dcfg["mask_token_id"]), feature_layers=[int(i) + 1 for i in dcfg["target_layer_ids"]])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DrafterLoadError(f"{path} is not a drafterkit vllm-{kind} export ({exc})") from None
    drafter = (DSparkDrafter if kind == "dspark" else DFlashDrafter)(cfg, target=target)
    drafter.load_own_state_dict(read_weights(path), source=str(path))
    return drafter.eval()


def load_dspark_export(path: str | Path, target: torch.nn.Module) -> DSparkDrafter:
    """Load a ``vllm-dspark`` export back into a :class:`DSparkDrafter` for ``target`` (strict; the confidence head
    as exported, :attr:`DSparkDrafter.verify_cost` unset). Raises ``DrafterLoadError`` as :func:`load_dflash_export`."""
    return load_dflash_export(path, target, "dspark")


def export_medusa(ckpt: Path, out: Path, target: str | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write vLLM's Medusa layout of the ``medusa`` checkpoint ``ckpt`` into ``out``.

    Raises:
        ExportError: the heads share the target's LM head and ``target`` was not given (:func:`export` gives
            ``--target``, else the target the training recipe records), or the heads do not fit ``target``
            (:func:`medusa_target_check`, eval's check).
    """
    _, cfg = read_config(ckpt)
    state = read_weights(ckpt)
    tensors: dict[str, torch.Tensor] = {}
    for k, v in state.items():  # blocks.{k}.{j}.linear.{weight,bias} -> blocks.{k}.layers.{j}.{weight,bias}
        parts = k.split(".")
        if parts[0] == "blocks":
            tensors[f"blocks.{parts[1]}.layers.{parts[2]}.{parts[-1]}"] = v
        elif parts[0] == "lm_heads":
            tensors[k] = v
    if cfg["share_lm_head"] and target is None:
        raise ExportError("these Medusa heads share the target's LM head, which the checkpoint does not hold, "
                          "and no training recipe beside it records the target; pass --target NAME_OR_PATH so "
                          "it can be written as lm_heads.0.weight")
    if target is not None:  # the heads must fit the target they are exported for, checked as eval checks them
        model = load_target_model(target)
        medusa_target_check(ckpt, model, target)
        if cfg["share_lm_head"]:
            tensors["lm_heads.0.weight"] = model.get_output_embeddings().weight.detach().clone()
    config = {
        "architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"], "truncated_vocab_size": cfg["vocab_size"],
        "num_heads": cfg["num_heads"], "num_hidden_layers": cfg["num_layers"], "medusa_fc_bias": True,
        "original_lm_head": bool(cfg["share_lm_head"]),
        "medusa_num_heads": cfg["num_heads"], "medusa_num_layers": cfg["num_layers"],
        "drafterkit": {"kind": "medusa", "offset": "head k at position t predicts token t+k+2",
                       "target_num_layers": cfg["target_num_layers"]},
    }
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(cast_tensors(tensors, dtype), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def medusa_target_check(ckpt: Path, model: torch.nn.Module, target: str) -> None:
    """Refuse exporting the Medusa heads of ``ckpt`` for the loaded ``model`` (named ``target``) when they do not
    fit it, with the check ``drafterkit eval`` runs: the drafter loaded next to the target (its LM head
    ``[vocab_size, hidden_size]``) and ``check_compatible`` (hidden size, layer count).

    Raises:
        ExportError: one line: eval's refusal, the target named.
    """
    try:
        drafter = load_drafter(ckpt, target=model, trained_for=False)
        drafter.check_compatible(model, model.get_output_embeddings().weight.shape[0])
    except ValueError as exc:
        raise ExportError(f"--target {target}: {exc}") from None


def export_hf_assistant(ckpt: Path, out: Path, target: str | None = None, dtype: torch.dtype | None = None, *,
                        recorded: str | None = None) -> Path:
    """Write the ``draft_lm`` checkpoint's transformers model as a plain folder (``assistant_model``), with the
    tokenizer of ``target`` (``--target``), else of ``recorded`` (the target the training recipe records), so
    that the folder loads with ``AutoTokenizer`` as well.

    Raises:
        TargetLoadError: ``target``'s tokenizer cannot be loaded (before anything is written). A ``recorded``
            target whose tokenizer cannot be loaded here (a Hub id offline, a folder gone) is a one-line warning
            instead, and the folder is written without a tokenizer.
    """
    tok = load_target_tokenizer(target) if target is not None else None  # a bad --target before anything is written
    if tok is None and recorded is not None:
        try:
            tok = load_target_tokenizer(recorded)
        except TargetLoadError as exc:
            warnings.warn(f"the tokenizer of target {recorded} (the one the training recipe records) cannot be "
                          f"loaded here ({exc}); the export holds no tokenizer: pass --target NAME_OR_PATH to save "
                          "one", UserWarning, stacklevel=2)
    drafter = load_drafter(ckpt)
    lm = drafter.lm if dtype is None else drafter.lm.to(dtype)
    lm.save_pretrained(out)
    if tok is not None:
        tok.save_pretrained(out)
    apply_umask(out)  # transformers writes its safetensors owner-only
    return out


def check_repo_id(repo: str) -> None:
    """Raise ``ExportError`` unless ``repo`` looks like a Hub repo id ``owner/name``."""
    if repo.count("/") != 1 or any(not p for p in repo.split("/")) or Path(repo).exists():
        raise ExportError(f"--push-to-hub needs a Hub repo id 'owner/name', got {repo!r} (a local folder is "
                          "not a Hub repo: use --output for local copies)")


def check_hub(repo: str, timeout: float = 3.0) -> None:
    """Check, within ``timeout`` seconds, that ``repo`` can be pushed to: run it BEFORE the export.

    Raises:
        ExportError: ``repo`` is not ``owner/name``, or the Hub is unreachable (no network or
            ``HF_HUB_OFFLINE`` set).
    """
    check_repo_id(repo)
    if not hub_reachable(timeout=timeout):
        raise ExportError(f"cannot push to {repo}: the Hugging Face Hub is not reachable from this machine "
                          "(no network, or HF_HUB_OFFLINE is set)")


def push_to_hub(folder: Path, repo: str, timeout: float = 3.0) -> str:
    """Upload ``folder`` to the Hub model repo ``repo`` (created if needed). Returns the repo URL.

    Raises:
        ExportError: see :func:`check_hub` (checked first, fast).
    """
    check_hub(repo, timeout)
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, exist_ok=True)
    api.upload_folder(repo_id=repo, folder_path=str(folder))
    return f"https://huggingface.co/{repo}"


# the writers drafters.kinds.KINDS names (ExportFormat.writer): writer(ckpt, out, dtype, *, fmt, target, recorded)
def write_eagle3(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    return export_eagle3(ckpt, out, dtype, engine=fmt.split("-")[0])


def write_peagle(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    return export_peagle(ckpt, out, dtype)


def write_dflash(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    return export_dflash(ckpt, out, dtype)


def write_dspark(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    return export_dspark(ckpt, out, dtype)


def write_medusa(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    return export_medusa(ckpt, out, recorded, dtype)


def write_hf_assistant(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    export_hf_assistant(ckpt, out, target, dtype, recorded=recorded)
    if problem := draft_layer_types_problem(read_config_dict(out), f"the draft model of {out}"):
        print(f"drafterkit export: warning: {problem}", file=sys.stderr)
    return out


def export(ckpt: str | Path, fmt: str, output: str | Path, *, target: str | None = None,
           dtype: str | None = None, repo: str | None = None) -> Path:
    """Export the drafter at ``ckpt`` (resolved by ``drafters.resolve_checkpoint``) as ``fmt`` into
    ``output``, with its model card ``README.md``. The target the export is for is ``target`` (``--target``), else
    the one the training checkpoint around ``ckpt`` records (:func:`drafters.target.record.trained_target`): Medusa
    heads sharing its LM head write it from there, and a ``vllm-eagle3`` / ``vllm-peagle`` / ``vllm-dflash`` export
    for a target architecture vLLM cannot serve next to (:mod:`drafters.export.vllm_support`) is written with a one-line
    warning on stderr naming it. The model card ``README.md`` (:mod:`drafters.export.model_card`; ``repo``: the Hub repo
    it will be pushed to, named in its serve commands) names the target the drafter was trained for. Returns
    ``output``.

    Raises:
        ExportError: unknown format, the checkpoint's kind does not fit the format, or (EAGLE-3) feature
            layer ids the format's engine cannot express.
        drafters.DrafterLoadError: no drafter checkpoint at ``ckpt`` (the message says what is), or its weights
            do not match its config (``Drafter.check_weights``).
    """
    output = Path(output)
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; valid formats: {sorted(FORMATS)}")
    ckpt, kind = resolve_checkpoint(ckpt)
    if kind != FORMATS[fmt]:
        fits = sorted(f for f, k in FORMATS.items() if k == kind) or "none"
        raise ExportError(f"format {fmt!r} exports {FORMATS[fmt]!r} drafters but {ckpt} holds a drafter of kind "
                          f"{kind!r}; formats for {kind!r}: {fits}")
    if problem := layer_ids_refusal(fmt, read_config(ckpt)[1]):  # the engine's refusal of an id, before the config's
        raise ExportError(problem)
    get_kind(kind).check_weights(ckpt)  # a config this version refuses; weights of other shapes than it says
    if bad := nonfinite_tensors(ckpt):
        raise ExportError(f"{ckpt} holds NaN or inf values in {', '.join(bad[:3])}{left_out(bad, 3)}: its training "
                          "diverged; export an earlier checkpoint (a step-N one) or retrain with a lower optim.lr")
    if target is not None and (line := trained_for_problem(ckpt, target)):  # e.g. Medusa's LM head from another
        warnings.warn(line, UserWarning, stacklevel=2)
    dt = resolve_dtype(dtype) if dtype else None
    used = target or trained_target(ckpt)  # the target the export is for: --target, else the recorded one
    spec = export_format(fmt)
    spec.write_fn()(ckpt, output, dt, fmt=fmt, target=target, recorded=used)
    if spec.records_source:  # not a draft LM export: a plain transformers model, compared as it is
        record_source(output, ckpt)
    if problem := vllm_serve_problem(fmt, used):
        print(f"drafterkit export: warning: target {used}: {problem}", file=sys.stderr)
    write_model_card(output, fmt, kind, ckpt, target=target, repo=repo)
    return output


def _earlier_export(folder: Path) -> bool:
    """Whether ``folder`` holds an export drafterkit wrote (its ``config.json`` carries the ``drafterkit`` block)."""
    try:
        return "drafterkit" in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def output_problem(output: Path, overwrite: bool, source: Path | None = None) -> str | None:
    """Why ``output`` cannot take an export, or None: a file, the folder holding the ``source`` checkpoint, the
    working folder or one above it, or one already holding files, unless ``overwrite`` is on and they are an
    earlier export (``--overwrite`` replaces an earlier export whole and nothing else)."""
    if source is not None and source.resolve().is_relative_to(output.resolve()):
        return f"--output {output} holds the checkpoint being exported ({source}); give another folder"
    if why := unwritable_folder(output):
        return f"--output {output}: {why}; give a folder you can write"
    if Path.cwd().resolve().is_relative_to(output.resolve()):
        return f"--output {output} is the working folder or holds it; give a new folder for the export"
    held = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    if not held:
        return None
    shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    if not _earlier_export(output):
        return (f"--output {output} holds files that are not an earlier drafterkit export ({shown}); give an empty "
                "or new folder (--overwrite replaces only an earlier export)")
    if not overwrite:
        return (f"--output {output} holds an earlier export ({shown}); give --overwrite to replace it, or an "
                "empty or new folder")
    return None


@contextlib.contextmanager
def replacing(output: str | None):
    """Around an export into ``output``: a folder already there (``--overwrite``) is moved aside first, then
    deleted when the export succeeded, or put back when it failed (a failed export loses nothing)."""
    folder = Path(output) if output else None
    if folder is None or not folder.is_dir() or not any(folder.iterdir()):
        yield
        return
    aside = folder.with_name(f".{folder.name}.replaced")
    shutil.rmtree(aside, ignore_errors=True)  # left by a process killed mid-replace
    folder.rename(aside)
    try:
        yield
    except BaseException:
        if folder.exists():
            shutil.rmtree(folder)
        aside.rename(folder)
        raise
    shutil.rmtree(aside)


def run(args: argparse.Namespace) -> int:
    """``drafterkit export``: 0 on success, 2 on a usage error or an unreachable Hub (message on stderr)."""
    if args.output is None and not args.push_to_hub:
        print("drafterkit export: error: give --output DIR and/or --push-to-hub REPO", file=sys.stderr)
        return 2
    try:
        resolve_dtype(args.dtype)
    except ValueError as exc:
        print(f"drafterkit export: error: --dtype: {exc}", file=sys.stderr)
        return 2
    if args.output is not None:
        problem = output_problem(Path(args.output), args.overwrite, Path(args.checkpoint))
        if problem:
            print(f"drafterkit export: error: {problem}", file=sys.stderr)
            return 2
    hub_error = None
    try:
        if args.push_to_hub:
            check_repo_id(args.push_to_hub)
            try:
                check_hub(args.push_to_hub)  # before writing anything: fail fast
            except ExportError as exc:
                if args.output is None:
                    raise
                hub_error = exc  # still write the local export the user asked for
                print(f"drafterkit export: {exc}; writing the local export to {args.output} only",
                      file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="drafterkit-export-") as tmp, replacing(args.output):
            out = export(args.checkpoint, args.format, args.output or tmp, target=args.target, dtype=args.dtype,
                         repo=args.push_to_hub)
            if args.output:
                print(f"exported {args.checkpoint} as {args.format} -> {out}")
            if args.push_to_hub and hub_error is None:
                print(f"pushed to {push_to_hub(out, args.push_to_hub)}")
    except (ExportError, DrafterLoadError, TargetLoadError) as exc:
        print(f"drafterkit export: error: {exc}", file=sys.stderr)
        return 2
    if hub_error is not None:
        print(f"drafterkit export: not pushed to {args.push_to_hub} (Hub unreachable); the export is complete in "
              f"{args.output}: upload it later with `hf upload {args.push_to_hub} {args.output}`", file=sys.stderr)
        return 2
    return 0


def suggested_output(kind: str) -> str:
    """The ``--output`` the docs and the commands training prints use for a ``kind`` drafter's export:
    ``exports/<kind>`` (README: ``drafterkit export runs/eagle3/... --output exports/eagle3``, then
    ``vllm serve ... "model": "exports/eagle3"``), relative to where the command runs."""
    return f"exports/{kind}"
