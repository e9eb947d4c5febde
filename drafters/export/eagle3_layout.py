"""The EAGLE-3 layout vLLM and SGLang load (``LlamaForCausalLMEagle3``), and P-EAGLE's, which is EAGLE-3's plus
its mask inputs (vLLM's parallel drafting): writing it, the engines' feature layer ids, and loading it back.

* ``vllm-eagle3`` / ``sglang-eagle3`` (:func:`export_eagle3`): ``config.json`` (``architectures``,
  ``draft_vocab_size``, ``target_hidden_size``, ``num_hidden_layers`` (the head's decoder layers),
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` in the engine's convention, :func:`engine_layer_ids`) and
  ``model.safetensors`` with ``fc.weight``, ``midlayer.*`` (one layer) or ``layers.{i}.*`` (``num_layers > 1``,
  the names vLLM's ``llama_eagle3.LlamaModel`` loads: layer 0 with ``hidden_norm`` and 2H-wide q/k/v, later
  layers plain Llama layers), ``norm.weight``, ``lm_head.weight`` and, for a reduced draft vocabulary only,
  ``d2t`` / ``t2d``. :func:`load_eagle3_export` loads either back. A multi-layer head is refused for SGLang
  (its ``LlamaForCausalLMEagle3`` stacks later layers with a different residual, so it would draft other
  tokens).
* ``vllm-peagle`` (:func:`export_peagle`, a ``peagle`` checkpoint): the ``vllm-eagle3`` layout plus the tensor
  ``mask_hidden [3H]`` (vLLM's ``Eagle3LlamaForCausalLM.load_weights`` copies it into its ``mask_hidden``
  buffer and feeds ``fc(mask_hidden)`` at every masked slot, ``llm_base_proposer.py``) and ``mask_token_id``
  (also as ``pard_token``) in ``config.json``, the token vLLM's proposer feeds there
  (``_init_parallel_drafting_params``). vLLM serves it with ``{"method": "eagle3", "parallel_drafting": true}``;
  without ``parallel_drafting`` vLLM 0.32.0 warns, skips ``mask_hidden`` and drafts autoregressively, which is
  not what the head was trained for. :func:`load_peagle_export` loads it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from drafterkit.drafters.base import DrafterLoadError, ExportError, read_config, read_weights, save_tensors
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter, default_feature_layers
from drafterkit.drafters.kinds import KINDS
from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter


def cast_tensors(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    if dtype is None:
        return state
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def sglang_default_layers(num_layers: int) -> list[int]:
    """The layers SGLang captures when the draft config gives no ids: the inputs of decoder layers
    ``[2, L//2, L-3]``, i.e. drafterkit ids ``[2, L//2, L-3]`` (no shift)."""
    return [2, num_layers // 2, num_layers - 3]


def engine_layer_ids(layers, num_layers: int, engine: str) -> list[int] | None:
    """drafterkit EAGLE-3 feature layer ids -> the ``eagle_aux_hidden_state_layer_ids`` ``engine`` reads,
    sorted (both engines capture layers in layer order); ``None``: write no ids (the engine's default
    capture is the same layers).

    drafterkit id ``i`` is transformers' ``hidden_states[i]``, the input of decoder layer ``i``. vLLM reads
    the input of layer ``id`` (``model_executor/models/llama.py``): the same ids, ``0 <= id < L``. SGLang
    with explicit ids captures the input of layer ``id + 1`` (``srt/models/llama.py``,
    ``set_eagle3_layers_to_capture``), so drafterkit id ``i`` is SGLang id ``i - 1`` and id 0 (the
    embedding output) cannot be expressed; without ids SGLang captures the inputs of ``[2, L//2, L-3]``.

    Raises:
        ExportError: an id the engine cannot express, or a repeated id (each engine captures a layer once,
            so the head would get fewer than 3 features); the message names the id, the engine and the fix.
    """
    ids, name = [int(i) for i in layers], ENGINE_NAMES[engine]
    lo = 1 if engine == "sglang" else 0
    retrain = _retrain_hint(num_layers, lo, name)
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if len(ids) != 3 or repeated:
        what = f"repeat layer {repeated[0]}" if repeated else f"are {len(ids)} ids"
        raise ExportError(f"EAGLE-3 feature layer ids {', '.join(map(str, ids))} {what}: {name} captures each layer "
                          f"once, so the head needs 3 distinct ids. Fix: {retrain}")
    for i in ids:
        if i == 0 and engine == "sglang":
            raise ExportError(
                f"EAGLE-3 feature layer id 0 (hidden_states[0], the embedding output) cannot be expressed in SGLang: "
                "with explicit ids SGLang captures hidden_states[id+1] (the output of layer id), so drafterkit id 0 "
                "would be SGLang id -1, which it does not take. Fix: export with --format vllm-eagle3 and serve "
                f"with vLLM (its ids are drafterkit's); for SGLang, {retrain}")
        if not lo <= i < num_layers:
            where = "after the final norm" if i == num_layers else "outside the target"
            raise ExportError(
                f"EAGLE-3 feature layer id {i} (hidden_states[{i}], {where}) cannot be expressed in {name} for a "
                f"{num_layers}-layer target: its eagle_aux_hidden_state_layer_ids read the input of a decoder "
                f"layer, ids in [{lo}, {num_layers - 1}]. Fix: {retrain}")
    ids = sorted(ids)
    if engine == "vllm":
        return ids
    return None if ids == sglang_default_layers(num_layers) else [i - 1 for i in ids]


def layer_ids_refusal(fmt: str, config: dict) -> str | None:
    """Why export format ``fmt`` (``vllm-eagle3``, ``sglang-eagle3``, ``vllm-peagle``) cannot express the feature
    layer ids a drafter's ``config`` dict records (``feature_layers``, ``target_num_layers``): the
    :class:`ExportError` message of :func:`engine_layer_ids`, or None (expressible, another format, or no ids)."""
    layers, n = config.get("feature_layers"), config.get("target_num_layers")
    if not fmt.endswith(("eagle3", "peagle")) or not isinstance(layers, list) or \
            not all(type(i) is int for i in [*layers, n]):
        return None
    try:
        engine_layer_ids(layers, n, fmt.split("-")[0])
    except ExportError as exc:
        return str(exc)
    return None


def repeated_layers_warning(kind: str, layers: list[int] | None, num_layers: int) -> str | None:
    """The one-line warning for an EAGLE-3 / P-EAGLE drafter (``kind``) whose feature layer ids repeat a layer:
    ``layers`` (``drafter.options.feature_layers``), else the default for a ``num_layers``-layer target
    (``drafters.eagle3.default_feature_layers``: the last id three times below 3 layers). The head trains and decodes
    in drafterkit, but the kind's vLLM / SGLang exports refuse it (:func:`layer_ids_refusal`); the line names the
    ids, the formats refused and how to choose ids. None where the ids are distinct."""
    ids = [int(i) for i in (layers if layers is not None else default_feature_layers(num_layers))]
    if len(set(ids)) == len(ids) or kind not in KINDS:
        return None
    config = {"feature_layers": ids, "target_num_layers": num_layers}
    refused = [f.name for f in KINDS[kind].formats if layer_ids_refusal(f.name, config)]
    lo = 1 if any(f.startswith("sglang") for f in refused) else 0  # SGLang cannot read id 0
    where = "drafter.options.feature_layers" if layers is not None else \
        f"the default for a {num_layers}-layer target, drafter.options.feature_layers unset"
    if num_layers - lo >= 3:
        fix = (f"set drafter.options.feature_layers to 3 distinct ids in [{lo}, {num_layers - 1}], e.g. "
               f"{[lo, (lo + num_layers) // 2, num_layers - 1]}")
    elif num_layers == 3:  # vLLM reads ids 0-2; SGLang cannot read id 0
        fix = ("set drafter.options.feature_layers to [0, 1, 2] for vLLM; SGLang cannot read id 0, so it needs a "
               "target of at least 4 layers")
    else:
        fix = (f"a {num_layers}-layer target has no 3 distinct ids: train for a target of at least {lo + 3} layers"
               + (" (3 for vLLM alone)" if lo else ""))
    return (f"drafter.options.feature_layers: the {KINDS[kind].title}'s feature layers {ids} ({where}) repeat layer "
            f"{min(i for i in ids if ids.count(i) > 1)}: it trains and decodes in drafterkit, but drafterkit export "
            f"will refuse {' and '.join(refused)} (an engine captures each layer once and needs 3 distinct ids); "
            f"{fix}")


def _retrain_hint(num_layers: int, lo: int, name: str) -> str:
    """How to get feature layer ids ``name`` can express for a ``num_layers``-layer target (ids ``>= lo``)."""
    if num_layers - lo < 3:
        ids = list(range(lo, num_layers))
        read = f"only {'id' if len(ids) == 1 else 'ids'} {', '.join(map(str, ids))}" if ids else "no id"
        return (f"train the head for a target of at least {lo + 3} layers ({name} reads {read} of a {num_layers}-layer "
                "target)")
    default = sglang_default_layers(num_layers)
    example = default if len(set(default)) == 3 else [lo, lo + 1, num_layers - 1]
    return (f"retrain with drafter.options.feature_layers set to 3 distinct ids in [{lo}, {num_layers - 1}], "
            f"e.g. {example}")


def drafterkit_layer_ids(engine_ids, num_layers: int, engine: str) -> list[int]:
    """The inverse of :func:`engine_layer_ids`: an export's ``eagle_aux_hidden_state_layer_ids`` (``None``:
    absent) -> drafterkit feature layer ids."""
    if engine_ids is None:
        return sglang_default_layers(num_layers)  # vLLM's default capture is the same layers
    return [int(i) + (1 if engine == "sglang" else 0) for i in engine_ids]


def _eagle3_tensors(renamed: dict[str, torch.Tensor], cfg: dict, order: list[int]) -> dict[str, torch.Tensor]:
    """fc's input blocks in ``order`` (the ids sorted); no ``d2t`` / ``t2d`` for a full vocabulary (vLLM
    has no parameter for them then)."""
    out = dict(renamed)
    if order != sorted(order):
        blocks = out["fc.weight"].chunk(3, dim=1)  # [H, 3H]: one [H, H] block per feature layer
        out["fc.weight"] = torch.cat([blocks[j] for j in order], dim=1).contiguous()
    if cfg["draft_vocab_size"] == cfg["vocab_size"]:
        if out["d2t"].any():
            raise ExportError("a full-vocabulary EAGLE-3 head must map draft id i to target id i, but its d2t is "
                              "not all zeros; the checkpoint is damaged: save it again from training")
        del out["d2t"], out["t2d"]
    return out


def export_eagle3(ckpt: Path, out: Path, dtype: torch.dtype | None = None, engine: str = "vllm") -> Path:
    """Write the vLLM / SGLang EAGLE-3 layout of the ``eagle3`` checkpoint ``ckpt`` into ``out``: the
    feature layer ids in ``engine``'s convention (:func:`engine_layer_ids`), ``d2t`` / ``t2d`` only for a
    reduced draft vocabulary.

    Raises:
        ExportError: not an eagle3 checkpoint, or feature layer ids ``engine`` cannot express.
    """
    _, cfg = read_config(ckpt)
    num_layers = int(cfg.get("num_layers", 1))
    if num_layers > 1 and engine == "sglang":
        raise ExportError(
            f"{ckpt} is a {num_layers}-layer EAGLE-3 head, which SGLang cannot serve as trained: its "
            "LlamaForCausalLMEagle3 restarts the residual at each additional layer (vLLM's carries the stream, as "
            "drafterkit trains it), so it would draft other tokens. Fix: export with --format vllm-eagle3 and serve "
            "with vLLM, or train with drafter.options.num_layers: 1 for SGLang")
    state = read_weights(ckpt)
    renamed = {_engine_name(k, num_layers): v for k, v in state.items()}
    expected = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
                "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight"}
    expected = {k.replace("midlayer.", "layers.0.") for k in expected} if num_layers > 1 else expected
    if not expected <= renamed.keys():
        raise ExportError(f"{ckpt} lacks {sorted(expected - renamed.keys())}; is it an eagle3 checkpoint?")
    layers = [int(i) for i in cfg["feature_layers"]]
    ids = engine_layer_ids(layers, cfg["target_num_layers"], engine)
    renamed = _eagle3_tensors(renamed, cfg, sorted(range(3), key=layers.__getitem__))
    saved_dtype = dtype or renamed["fc.weight"].dtype
    eagle_config = {"use_aux_hidden_state": True} if ids is None else \
        {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": cfg["hidden_size"], "target_hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"], "num_hidden_layers": num_layers,
        "num_attention_heads": cfg["num_attention_heads"], "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"], "hidden_act": "silu", "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"], "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "vocab_size": cfg["vocab_size"], "draft_vocab_size": cfg["draft_vocab_size"],
        "torch_dtype": str(saved_dtype).removeprefix("torch."), "eagle_config": eagle_config,
        "drafterkit": {"kind": "eagle3", "engine": engine, "target_num_layers": cfg["target_num_layers"]},
    }
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(cast_tensors(renamed, dtype), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _eagle3_fields(config: dict, engine: str) -> dict:
    """The :class:`drafters.eagle3.Eagle3Config` fields an export's ``config.json`` records (feature layer ids
    turned back into drafterkit's). Raises ``KeyError`` / ``ValueError`` / ``TypeError`` on a config it lacks."""
    num_layers = int(config["drafterkit"]["target_num_layers"])
    layers = drafterkit_layer_ids(config["eagle_config"].get("eagle_aux_hidden_state_layer_ids"), num_layers, engine)
    fields = {k: config[k] for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                     "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "draft_vocab_size")}
    return {**fields, "target_num_layers": num_layers, "feature_layers": layers,
            "num_layers": int(config["num_hidden_layers"])}


def _engine_name(name: str, num_layers: int) -> str:
    """A checkpoint tensor name -> the export's: layer 0 (``layer.``) is ``midlayer.`` in a one-layer head (the
    EAGLE-3 name both engines load) and ``layers.0.`` in a multi-layer one (vLLM's own name; it maps
    ``midlayer.`` there too); layers ``i >= 1`` keep ``layers.{i}.``, vLLM's index."""
    if name.startswith("layer."):
        return ("midlayer." if num_layers == 1 else "layers.0.") + name[len("layer."):]
    return name


def _from_engine_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An export's tensors under the checkpoint's names (``midlayer.`` / ``layers.0.`` -> ``layer.``)."""
    out = {}
    for k, v in state.items():
        for prefix in ("midlayer.", "layers.0."):
            if k.startswith(prefix):
                k = "layer." + k[len(prefix):]
        out[k] = v
    return out


def load_eagle3_export(path: str | Path, target: torch.nn.Module) -> Eagle3Drafter:
    """Load a ``vllm-eagle3`` / ``sglang-eagle3`` export back into an :class:`Eagle3Drafter` for
    ``target`` (its feature layer ids turned back into drafterkit's; ``d2t`` / ``t2d`` may be absent for
    a full vocabulary). Strict, as every drafterkit loader.

    Raises:
        DrafterLoadError: not an EAGLE-3 export, a config this version refuses, or a tensor mismatch.
    """
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        block, engine = config["drafterkit"], config["drafterkit"]["engine"]
        if block.get("kind") != "eagle3" or engine not in ENGINE_NAMES:
            raise KeyError("kind")
        cfg = Eagle3Config(**_eagle3_fields(config, engine))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DrafterLoadError(f"{path} is not a drafterkit vllm-eagle3 / sglang-eagle3 export ({exc})") from None
    drafter = Eagle3Drafter(cfg, target=target)
    drafter.load_own_state_dict(_from_engine_names(read_weights(path)), source=str(path))
    return drafter.eval()


def export_peagle(ckpt: Path, out: Path, dtype: torch.dtype | None = None) -> Path:
    """Write vLLM's P-EAGLE layout of the ``peagle`` checkpoint ``ckpt`` into ``out``: the ``vllm-eagle3``
    layout (:func:`export_eagle3`, its tensors include ``mask_hidden``) with ``mask_token_id`` / ``pard_token``
    and the trained ``num_depths`` in ``config.json``.

    Raises:
        ExportError: not a peagle checkpoint, or feature layer ids vLLM cannot express.
    """
    _, cfg = read_config(ckpt)
    if "mask_token_id" not in cfg or "mask_hidden" not in read_weights(ckpt):
        raise ExportError(f"{ckpt} lacks mask_token_id / mask_hidden; is it a peagle checkpoint?")
    export_eagle3(ckpt, out, dtype, engine="vllm")
    config = json.loads((out / "config.json").read_text())
    config.update(mask_token_id=int(cfg["mask_token_id"]), pard_token=int(cfg["mask_token_id"]))
    config["drafterkit"].update(kind="peagle", num_depths=int(cfg["num_depths"]),
                                serve='speculative_config {"method": "eagle3", "parallel_drafting": true}')
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def load_peagle_export(path: str | Path, target: torch.nn.Module) -> PEagleDrafter:
    """Load a ``vllm-peagle`` export back into a :class:`PEagleDrafter` for ``target`` (strict).

    Raises:
        DrafterLoadError: not a P-EAGLE export, a config this version refuses, or a tensor mismatch.
    """
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        if config["drafterkit"].get("kind") != "peagle":
            raise KeyError("kind")
        cfg = PEagleConfig(**_eagle3_fields(config, "vllm"), mask_token_id=int(config["mask_token_id"]),
                           num_depths=int(config["drafterkit"]["num_depths"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DrafterLoadError(f"{path} is not a drafterkit vllm-peagle export ({exc})") from None
    drafter = PEagleDrafter(cfg, target=target)
    drafter.load_own_state_dict(_from_engine_names(read_weights(path)), source=str(path))
    return drafter.eval()
