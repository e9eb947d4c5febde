"""The vLLM side of training data made by vLLM (``data.regenerate_engine: vllm``, ``data.features_engine: vllm``):
a standalone script run by path with the vLLM venv's python,

    VENV/bin/python train/vllm_data_runner.py REQUEST.json RESULT.json

It imports nothing of drafterkit (drafterkit is not installed in that venv) and talks to the parent
(:mod:`train.vllm_data`) through two JSON files; hidden states travel as safetensors files.

REQUEST: ``{"task": "generate" | "hidden_states", "target": folder, "dtype": "float32" | "bfloat16",
"max_model_len": int, "prompts": [[token ids]], "max_num_seqs": int, "tensor_parallel_size": int}``, and

- ``generate``: ``"sampling": {"temperature", "top_k", "top_p", "max_tokens", "seed"}``, ``"stop_token_ids"``.
  RESULT: ``{"outputs": [[ids]], "finish_reasons", "load_seconds", "seconds", "vllm_version", "device"}``.
- ``hidden_states``: ``"layers"`` (vLLM aux-hidden-state ids: ``i`` is the residual stream entering decoder
  layer ``i``, ``0`` the embeddings, ``L`` the last layer's output BEFORE the final norm), ``"out"`` (a
  folder). RESULT: ``{"files": [per prompt a safetensors file holding "hidden_states" [T, len(layers), H]
  (layers in sorted order) and "token_ids" [T]], "layers": sorted ids, ...}``.

How the hidden states are taken (vLLM 0.32, read in its source): the speculative method
``extract_hidden_states`` (``vllm/v1/spec_decode/extract_hidden_states.py``) makes the target return its
auxiliary hidden states at ``eagle_aux_hidden_state_layer_ids`` (``SupportsEagle3``: ``hidden + residual`` at
each id, ``vllm/model_executor/models/interfaces.py``) and writes them into a cache-only attention layer's KV
cache; ``ExampleHiddenStatesConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py``) copies a finished request's rows out to ``<out>/<request id>.safetensors``.
Each prompt runs with ``max_tokens=1``, so the file holds the prompt's rows. The connector writes a request's
file at the engine step AFTER the one it finished in; offline ``LLM.generate`` stops stepping when its last
request finishes, so the last requests' files would never be written (and a reader would wait on their lock
forever): one more one-token request flushes them (:func:`flush_saves`).

On a CPU the connector's write refuses: ``_submit_async_write`` copies the rows into pinned memory
(``torch.empty_like(..., device="cpu", pin_memory=True)``, line 403 of that file in 0.32.0), and torch without an
accelerator raises ``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory
allocator is available on this system``. Where no CUDA device is present, the connector is a subclass whose
``_submit_async_write`` is the same extraction (the connector's own ``extract_from_kv_cache`` over the request's
blocks) written synchronously (:func:`cpu_connector`); vLLM imports it from this module by name
(``kv_connector_module_path``), so that tensor-parallel workers, which a CPU starts by ``spawn``, get it too (a
class patched in this process would not reach them). On a GPU vLLM's own connector runs unchanged.

``tensor_parallel_size`` in REQUEST (default 1) is vLLM's: the target split over that many processes (GPUs; on a
CPU, processes over gloo / shared memory). Only tensor-parallel rank 0 writes the hidden-state files.
"""

from __future__ import annotations

import fcntl
import functools
import os
import sys
import time
from pathlib import Path

# speceval/vllm_runner.py, the serve-check runner, holds what both scripts share (the stage lines drafterkit shows,
# vLLM's CPU settings, the JSON in / JSON out main); it imports nothing of drafterkit either
if __package__:  # imported as drafterkit.train.vllm_data_runner (drafterkit's tests)
    from drafterkit.speceval.vllm_runner import CPU_ENV, json_main, stage
else:  # run by path with the vLLM venv's python, where drafterkit is not installed: the file itself
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speceval"))
    from vllm_runner import CPU_ENV, json_main, stage


def make_llm(req: dict, **extra):
    from vllm import LLM

    return LLM(model=req["target"], dtype=req.get("dtype", "float32"), enforce_eager=True, seed=0,
               skip_tokenizer_init=True, max_model_len=req["max_model_len"], max_num_seqs=req.get("max_num_seqs", 32),
               enable_prefix_caching=False, async_scheduling=False,
               tensor_parallel_size=req.get("tensor_parallel_size", 1), **extra)


def generate(req: dict) -> dict:
    """Answer every prompt (token ids, the chat template already applied by drafterkit) with the sampling asked."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = make_llm(req)
    load_s = time.perf_counter() - t0
    s = req["sampling"]
    seed = s.get("seed") if s["temperature"] > 0 else None  # prompt i samples from seed + i: runs repeat, and
    params = [SamplingParams(temperature=s["temperature"], top_k=s.get("top_k") or 0, top_p=s.get("top_p", 1.0),
                             max_tokens=s["max_tokens"], seed=None if seed is None else seed + i,  # prompts differ
                             stop_token_ids=req["stop_token_ids"], ignore_eos=False, detokenize=False)
              for i in range(len(req["prompts"]))]
    stage(f"vLLM ready in {load_s:.0f} s; generating {len(req['prompts'])} responses x up to {s['max_tokens']} tokens")
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return {"load_seconds": load_s, "seconds": seconds,
            "outputs": [[int(t) for t in o.outputs[0].token_ids] for o in outs],
            "finish_reasons": [o.outputs[0].finish_reason for o in outs]}


def wait_written(path: str) -> None:
    """Block until the connector's writer thread has written ``path`` (it holds LOCK_EX on ``path.lock``)."""
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
    if not os.path.isfile(path):
        raise RuntimeError(f"vLLM's ExampleHiddenStatesConnector wrote no {path}")


class _Done:
    """Stands for the connector's copy-done CUDA event: the CPU write is synchronous, so it is always done."""

    def query(self) -> bool:
        return True


def _cpu_submit(self, pending) -> None:
    """The connector's ``_submit_async_write`` as a synchronous CPU write (module docstring)."""
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as ehs

    if not self._is_tp_rank_zero:
        return
    blocks = torch.tensor(pending.block_ids, dtype=torch.long)
    slots = (torch.arange(self._block_size).reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
    rows = ehs.extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])  # [T, layers, H]
    os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
    lock_fd = self._lock_fds.pop(pending.req_id, None)
    try:
        save_file({"hidden_states": rows.contiguous().clone(), "token_ids": pending.token_ids.clone()},
                  pending.filename)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)  # releases LOCK_EX: a reader waiting in wait_written goes on
    self._req_copy_events[pending.req_id] = _Done()


@functools.cache
def cpu_connector() -> type:
    """``ExampleHiddenStatesConnector`` with :func:`_cpu_submit` as its write."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as ehs

    return type("ExampleHiddenStatesConnector", (ehs.ExampleHiddenStatesConnector,),
                {"_submit_async_write": _cpu_submit, "__module__": __name__})


def __getattr__(name: str):
    """vLLM reads the CPU connector class from this module by name (``kv_connector_module_path``, set by
    :func:`hidden_states` without CUDA): in every process it runs the model in, its tensor-parallel workers too,
    which start by ``spawn`` on a CPU (``vllm/platforms/cpu.py``) and so would not see a class patched here."""
    if name == "ExampleHiddenStatesConnector":
        return cpu_connector()
    raise AttributeError(name)


def flush_saves(llm, params, prompt: list[int]) -> None:
    """One more engine step, so the connector writes the files of the requests that finished last."""
    from vllm.inputs import TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=prompt[:1])], params, use_tqdm=False)


def hidden_states(req: dict) -> dict:
    """Each prompt's hidden states at ``req["layers"]`` through ``extract_hidden_states`` (module docstring)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    import torch

    connector = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                 "kv_connector_extra_config": {"shared_storage_path": req["out"]}}
    if not torch.cuda.is_available():  # this module is on the path of vLLM's processes (spawn copies sys.path)
        connector["kv_connector_module_path"] = os.path.splitext(os.path.basename(__file__))[0]
    layers = sorted({int(i) for i in req["layers"]})
    os.makedirs(req["out"], exist_ok=True)
    t0 = time.perf_counter()
    llm = make_llm(req, speculative_config={
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}}},
        kv_transfer_config=connector)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    stage(f"vLLM ready in {load_s:.0f} s; hidden states of layers {layers} for {len(req['prompts'])} examples")
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    flush_saves(llm, params, req["prompts"][0])
    files = [o.kv_transfer_params["hidden_states_path"] for o in outs]
    for path in files:
        wait_written(path)
    seconds = time.perf_counter() - t0
    return {"load_seconds": load_s, "seconds": seconds, "files": files, "layers": layers}


def run(req: dict) -> dict:
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    stage("importing vLLM")
    import torch
    import vllm

    task = {"generate": generate, "hidden_states": hidden_states}[req["task"]]
    return {**task(req), "vllm_version": vllm.__version__,
            "device": "cuda" if torch.cuda.is_available() else "cpu"}


def main(argv: list[str]) -> int:
    return json_main(argv, run, "vllm_data_runner.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
