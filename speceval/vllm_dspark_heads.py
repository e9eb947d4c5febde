"""vLLM's own DSpark sequential stage on given block outputs: a standalone script run by path with the vLLM venv's
python (it imports nothing of drafterkit), for the checks that vLLM's CPU build cannot run end to end (it refuses
method ``dspark``, :attr:`drafters.kinds.ExportFormat.cpu_refusal`)::

    VENV/bin/python speceval/vllm_dspark_heads.py REQUEST.json RESULT.json

REQUEST: ``{"export": a vllm-dspark folder, "target_lm_head": a safetensors file holding the target's
``lm_head.weight`` (used when the export has none: a full-vocabulary drafter shares the target's, as vLLM's
``load_dspark_model`` does), "hidden": [R][S][H] the backbone's final-norm outputs, "anchors": [R] the bonus
tokens}``. RESULT: ``{"tokens": [R][S] draft token ids (target ids), "confidence": [R][S] or null}``.

What runs is vLLM 0.32's code: ``DSparkMarkovHead`` and ``DSparkConfidenceHead`` (``models/qwen3_dspark.py``) with
the export's tensors put through their parameters' ``weight_loader``, the ``ParallelLMHead`` and
``LogitsProcessor`` of ``Qwen3DSparkForCausalLM``, its ``compute_draft_logits`` / ``markov_embed`` / ``markov_bias``
/ ``map_draft_to_target`` / ``compute_confidence``, and ``DSparkSpeculator._sample_sequential`` (greedy: the
speculator's ``draft_logits`` buffer is None), called on stand-ins holding exactly the attributes they read.
"""

from __future__ import annotations

import json
import sys
import tempfile
import types
from pathlib import Path


def _load(module, tensors: dict, prefix: str) -> None:
    """Every parameter of ``module`` from ``tensors[prefix + name]`` through its own ``weight_loader``."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    for name, param in module.named_parameters():
        loader = getattr(param, "weight_loader", default_weight_loader)
        loader(param, tensors[prefix + name])
    for sub in module.modules():
        if (method := getattr(sub, "quant_method", None)) is not None:
            method.process_weights_after_loading(sub)


def run(req: dict) -> dict:
    import torch
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(VllmConfig()), tempfile.TemporaryDirectory() as tmp:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tmp}/init")
        initialize_model_parallel(1, 1)
        from vllm.model_executor.layers.logits_processor import LogitsProcessor
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
        from vllm.model_executor.models.qwen3_dspark import (DSparkConfidenceHead, DSparkMarkovHead,
                                                             Qwen3DSparkForCausalLM)
        from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

        folder = Path(req["export"])
        cfg = json.loads((folder / "config.json").read_text())
        tensors = load_file(str(folder / "model.safetensors"))
        vocab, hidden_size, rank = cfg["vocab_size"], cfg["hidden_size"], cfg["markov_rank"]
        n_vocab = cfg.get("draft_vocab_size") or vocab
        markov = DSparkMarkovHead(vocab, n_vocab, rank, prefix="model.markov_head")
        _load(markov, tensors, "markov_head.")
        confidence = None
        if cfg.get("enable_confidence_head") and "confidence_head.proj.weight" in tensors:
            with_markov = bool(cfg.get("confidence_head_with_markov", False))
            confidence = DSparkConfidenceHead(hidden_size + (rank if with_markov else 0),
                                              prefix="model.confidence_head", bias=True, with_markov=with_markov)
            _load(confidence, tensors, "confidence_head.")
        lm_head = ParallelLMHead(n_vocab, hidden_size, prefix="lm_head")
        _load(lm_head, tensors if "lm_head.weight" in tensors else load_file(req["target_lm_head"]), "lm_head.")
        d2t = tensors.get("d2t") if n_vocab < vocab else None
        model = types.SimpleNamespace(model=types.SimpleNamespace(markov_head=markov, confidence_head=confidence),
                                      lm_head=lm_head, logits_processor=LogitsProcessor(n_vocab, scale=1.0),
                                      draft_id_to_target_id=d2t)
        for name in ("compute_draft_logits", "map_draft_to_target", "markov_embed", "markov_bias",
                     "compute_confidence"):
            setattr(model, name, types.MethodType(getattr(Qwen3DSparkForCausalLM, name), model))

        head_hidden = torch.tensor(req["hidden"], dtype=torch.float32)  # [R, S, H]
        r_n, s_n = head_hidden.shape[:2]
        spec = types.SimpleNamespace(
            num_speculative_steps=s_n, model=model, _draft_topk=None, draft_logits=None,
            use_confidence_head=confidence is not None,
            sample_indices=torch.arange(r_n * s_n), sample_idx_mapping=torch.arange(r_n).repeat_interleave(s_n),
            sample_pos=torch.zeros(r_n * s_n, dtype=torch.long), _step_cols=torch.arange(s_n),
            input_buffers=types.SimpleNamespace(input_ids=torch.tensor(req["anchors"]).repeat_interleave(s_n)),
            _anchor_idx=torch.arange(r_n) * s_n, draft_tokens=torch.zeros(r_n, s_n, dtype=torch.long),
            draft_token_confidence_probs=torch.zeros(r_n, s_n), _maybe_predict_acceptance=lambda *a: None)
        spec._sample_logits = types.MethodType(DSparkSpeculator._sample_logits, spec)
        with torch.no_grad():
            DSparkSpeculator._sample_sequential(spec, r_n, head_hidden.reshape(r_n * s_n, -1))
        return {"tokens": spec.draft_tokens.tolist(),
                "confidence": spec.draft_token_confidence_probs.tolist() if confidence is not None else None}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python vllm_dspark_heads.py REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    result = run(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
