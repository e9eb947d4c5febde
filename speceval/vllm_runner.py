"""The vLLM side of ``drafterkit serve-check``: a standalone script run by path with the vLLM venv's python,

    VENV/bin/python speceval/vllm_runner.py REQUEST.json RESULT.json

It imports nothing of drafterkit (drafterkit is not installed in that venv) and talks to the parent
(:mod:`speceval.serve_parity`) through two JSON files.

REQUEST: ``{"keep_going": bool (a job that raises gives ``{"error": its exception line}`` and the next runs;
else the script stops), "jobs": [{"target": folder, "draft": export folder, "method": "eagle3" | "peagle" | "medusa" |
"draft_model" | "suffix", "k": int, "max_new_tokens": int, "prompts": [[token ids]], "eos": [ids], "dtype":
"float32"}]}``; a ``suffix`` job (vLLM's suffix decoding, which needs the ``arctic_inference`` package importable)
has no ``draft`` and may give ``"suffix": {knob: value}`` (vLLM's ``suffix_decoding_<knob>`` fields) and
``"max_num_seqs"`` (1: the prompts one after the other, as a replay of its proposals needs);
the jobs run one after the other in this process (vLLM is imported once), each with an ``LLM`` of its own
(``enforce_eager=True`` unless the job gives ``"eager": false``, vLLM's default of compiled graphs; greedy,
``stop_token_ids`` = ``eos``). ``"method": "none"`` decodes without speculation (vLLM's plain decoding). A job with
``"timed": true`` measures speed at batch size 1: ``max_num_seqs`` 1, the first prompt decoded once untimed (a
warm-up), then each prompt alone, ``"repeats"`` times (default 1), its wall seconds recorded.

RESULT: ``{"vllm_version", "device", "results": [per job: {"load_seconds", "seconds" (generate only),
"outputs": [[ids]], "finish_reasons", "steps": [[{"draft": [ids], "generated": [ids]}]] (per prompt, per
verification step), "metrics": {"num_drafts", "num_draft_tokens", "num_accepted_tokens",
"num_accepted_tokens_per_pos"}}]}``; a timed job's entry also holds ``"per_prompt"``: ``[[prompt index, new
tokens, wall seconds], ...]``, one entry per prompt and repeat (summed by the caller).

How the draft chains are captured (vLLM v1, read in ``vllm/v1/core/sched/scheduler.py`` of 0.32.0): each
engine step the scheduler hands the model runner ``SchedulerOutput.scheduled_spec_decode_tokens``
(request id -> the draft tokens verified this step, cut to what was scheduled; ``-1`` pads drafts a grammar
rejected), and gets back ``ModelRunnerOutput.sampled_token_ids`` (per request, the accepted draft tokens
plus the bonus / correction token). Both meet in ``Scheduler.update_from_output``, which this script wraps
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine core in this process) to record
``{"draft", "generated"}`` per request and step. ``generated`` is raw: tokens past EOS or ``max_tokens``
are cut from the request's output afterwards by vLLM, not here. The counters in ``metrics`` are vLLM's
own (``LLM.get_metrics()``, ``vllm:spec_decode_*``; ``num_accepted_tokens_per_pos[i]`` counts acceptances
at position i over ALL drafts). A ``suffix`` job's result also holds ``proposals``: every call of its proposer, in
order, per request ``{"prompt", "tokens" (what it saw), "draft"}`` (:func:`install_suffix_hook`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from itertools import zip_longest

#: what a progress line starts with: ``drafterkit serve-check`` shows these lines while this runs
#: (``speceval.vllm_process.STAGE``, the same text: this script imports nothing of drafterkit)
STAGE = "[drafterkit-stage] "


def stage(line: str) -> None:
    """Announce a stage (on stdout, which the caller reads from the log as it grows)."""
    print(STAGE + line, flush=True)


#: job methods that are a vLLM method with options: P-EAGLE is EAGLE-3 with parallel drafting (all K draft tokens
#: from one pass over the mask slots; ``vllm/config/speculative.py``, ``v1/spec_decode/llm_base_proposer.py``)
SPEC_METHODS = {"peagle": {"method": "eagle3", "parallel_drafting": True}}
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def install_hook(record: dict) -> None:
    """Wrap ``Scheduler.update_from_output`` to append ``{"draft", "generated"}`` to ``record[req_id]
    ["steps"]`` for each request that had draft tokens scheduled in the step (``record[req_id]["prompt"]``:
    its prompt ids, to match requests to prompts)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output

    def update_from_output(self, scheduler_output, model_runner_output):
        index = model_runner_output.req_id_to_index
        sampled = model_runner_output.sampled_token_ids
        for req_id, draft in scheduler_output.scheduled_spec_decode_tokens.items():
            req = self.requests.get(req_id)
            if req is None:
                continue
            i = index.get(req_id)
            generated = [int(t) for t in sampled[i]] if sampled and i is not None else []
            entry = record.setdefault(req_id, {"prompt": [int(t) for t in req.prompt_token_ids], "steps": []})
            entry["steps"].append({"draft": [int(t) for t in draft if t >= 0], "generated": generated})
        return original(self, scheduler_output, model_runner_output)

    Scheduler.update_from_output = update_from_output


def install_suffix_hook(calls: list) -> None:
    """Wrap vLLM's ``SuffixDecodingProposer.propose`` (the ``suffix`` method, Arctic Inference's
    ``SuffixDecodingCache`` inside) to append, per request and call, ``{"prompt": its prompt ids, "tokens": every
    token the proposer saw (prompt + output so far), "draft": what it proposed}`` to ``calls``, in call order."""
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    original = SuffixDecodingProposer.propose

    def propose(self, num_speculative_tokens, input_batch, sampled_token_ids, *args, **kwargs):
        drafts = original(self, num_speculative_tokens, input_batch, sampled_token_ids, *args, **kwargs)
        for i, draft in enumerate(drafts):
            if not sampled_token_ids[i]:
                continue
            index = input_batch.req_id_to_index[input_batch.req_ids[i]]
            n, p = int(input_batch.num_tokens_no_spec[i]), int(input_batch.num_prompt_tokens[index])
            row = input_batch.token_ids_cpu[i]
            calls.append({"prompt": [int(t) for t in row[:p]], "tokens": [int(t) for t in row[:n]],
                          "draft": [int(t) for t in draft]})
        return drafts

    SuffixDecodingProposer.propose = propose


def spec_metrics(llm) -> dict:
    """vLLM's speculative-decoding counters, summed over engines."""
    from vllm.v1.metrics.reader import Counter, Vector

    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:spec_decode_")
        if isinstance(m, Counter) and name in out:
            out[name] += int(m.value)
        elif isinstance(m, Vector) and name == "num_accepted_tokens_per_pos":
            out[name] = [a + int(v) for a, v in zip_longest(out[name], m.values, fillvalue=0)]
    return out


def run_job(job: dict, record: dict, calls: list | None = None) -> dict:
    """Load ``job["target"]`` with the drafter in vLLM, greedy-decode ``job["prompts"]``: one RESULT entry
    (``proposals``: the ``suffix`` method's calls, :func:`install_suffix_hook`, when ``calls`` collects them)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    record.clear()
    if calls is not None:
        calls.clear()
    longest = max(len(p) for p in job["prompts"])
    spec = {**SPEC_METHODS.get(job["method"], {"method": job["method"]}), "num_speculative_tokens": job["k"]}
    if job["method"] == "suffix":  # model-free: vLLM's suffix_decoding_* knobs instead of a draft model
        spec.update({f"suffix_decoding_{k}": v for k, v in job.get("suffix", {}).items()})
    elif job["method"] == "ngram":  # prompt lookup: vLLM's own n-gram sizes unless the job gives them
        spec.update(job.get("ngram", {}))
    elif job["method"] != "none":
        spec["model"] = job["draft"]
    timed = bool(job.get("timed"))
    t0 = time.perf_counter()
    what = ("the target alone" if job["method"] == "none"
            else f"the target and the drafter ({job['method']}, K={job['k']})")
    stage(f"{job.get('label', 'job')}: starting vLLM with {what}: loading, compiling, allocating its KV cache")
    llm = LLM(model=job["target"], dtype=job.get("dtype", "float32"), enforce_eager=job.get("eager", True), seed=0,
              max_model_len=longest + job["max_new_tokens"] + job["k"] + 16,
              max_num_seqs=1 if timed else job.get("max_num_seqs", len(job["prompts"])), disable_log_stats=False,
              async_scheduling=False, speculative_config=None if job["method"] == "none" else spec)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"], stop_token_ids=job["eos"],
                            ignore_eos=False, detokenize=False)
    before = spec_metrics(llm)
    n = len(job["prompts"])
    stage(f"{job.get('label', 'job')}: vLLM ready in {load_s:.0f} s; decoding {n} prompt{'s' if n != 1 else ''} x up "
          f"to {job['max_new_tokens']} new tokens")
    per_prompt = []
    if timed:  # batch size 1, each prompt alone after one untimed warm-up
        llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])], params, use_tqdm=False)
        before = spec_metrics(llm)
        record.clear()
        outs, per_prompt = timed_generate(llm, job["prompts"], params, int(job.get("repeats", 1)))
        seconds = sum(s for _, _, s in per_prompt)
    else:
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in job["prompts"]], params, use_tqdm=False)
        seconds = time.perf_counter() - t0
    stage(f"{job.get('label', 'job')}: decoded in {seconds:.0f} s")
    after = spec_metrics(llm)
    by_prompt = {tuple(e["prompt"]): e["steps"] for e in record.values()}
    result = {
        "load_seconds": load_s, "seconds": seconds,
        "outputs": [[int(t) for t in o.outputs[0].token_ids] for o in outs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outs],
        "steps": [by_prompt.get(tuple(p), []) for p in job["prompts"]],
        "proposals": list(calls or []), "per_prompt": per_prompt,
        "metrics": {k: ([a - b for a, b in zip_longest(v, before[k], fillvalue=0)] if isinstance(v, list)
                        else v - before[k]) for k, v in after.items()},
    }
    del llm, outs  # free the engine before the next job's
    free_engine()
    return result


def timed_generate(llm, prompts: list, params, repeats: int) -> tuple[list, list]:
    """Each prompt decoded alone, ``repeats`` times over the list: the last pass's outputs (in prompt order) and
    ``[[prompt index, new tokens, wall seconds], ...]`` per prompt and repeat."""
    from vllm.inputs import TokensPrompt

    outs, per_prompt = [], []
    for _ in range(max(1, repeats)):
        outs = []
        for i, p in enumerate(prompts):
            t0 = time.perf_counter()
            (out,) = llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)
            per_prompt.append([i, len(out.outputs[0].token_ids), time.perf_counter() - t0])
            outs.append(out)
    return outs, per_prompt


def free_engine() -> None:
    """Tear down vLLM's parallel state so the next job's ``LLM`` starts afresh (also after a failed load)."""
    import gc

    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()


def run(req: dict) -> dict:
    """Every job of ``req["jobs"]`` in turn, in this one process (vLLM imports once)."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    stage("importing vLLM")
    import torch
    import vllm

    record: dict = {}
    install_hook(record)
    record_calls: list | None = None
    if any(job["method"] == "suffix" for job in req["jobs"]):
        record_calls = []
        install_suffix_hook(record_calls)
    results = []
    for i, job in enumerate(req["jobs"]):
        job = {**job, "label": f"{'export' if job.get('draft') else job['method']} {i + 1} of {len(req['jobs'])}"}
        try:
            results.append(run_job(job, record, record_calls))
        except Exception as exc:  # noqa: BLE001 (keep_going: vLLM's reason is the job's result)
            if not req.get("keep_going"):
                raise
            print(f"job {job.get('draft') or job['method']} failed", file=sys.stderr, flush=True)
            import traceback

            traceback.print_exc()
            results.append({"error": (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:400]})
        if "error" in results[-1]:  # here, not in the except block: the traceback held the failed engine, which
            free_engine()  # collected later would tear down the next job's parallel groups ("... not initialized")
    return {"vllm_version": vllm.__version__, "device": "cuda" if torch.cuda.is_available() else "cpu",
            "results": results}


def json_main(argv: list[str], run, script: str) -> int:
    """``python SCRIPT REQUEST.json RESULT.json``: ``run`` (the REQUEST dict -> the RESULT dict) between the two
    JSON files; 2 with a usage line naming ``script`` for another argument count. Also the ``main`` of
    ``train/vllm_data_runner.py``, the other script run with the vLLM venv's python."""
    if len(argv) != 2:
        print(f"usage: python {script} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        req = json.load(f)
    result = run(req)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


def main(argv: list[str]) -> int:
    return json_main(argv, run, "vllm_runner.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
