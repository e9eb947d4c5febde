"""vLLM's own DSpark stage on a trained checkpoint's real rounds: the check vLLM's CPU build allows in place of an
end-to-end serve-check (it refuses method ``dspark``; docs/export-and-serving.md, "DSpark in vLLM").

    python benchmarks/dspark_vllm_stage.py --drafter runs/dspark --export exports/dspark --num-prompts 2 \\
        --max-new-tokens 32 --k 7

drafterkit's decoder runs the drafter on the benchmark prompts (greedy, fp32, batch 1, chains of ``--k``) and
records every round's block outputs (after the final norm) and bonus token (rounds that draft a whole block:
the last rounds before ``--max-new-tokens`` ask fewer tokens and are left out); ``speceval/vllm_dspark_heads.py``
then runs, in the vLLM venv, vLLM 0.32's DSpark heads loaded from ``--export`` and its
``DSparkSpeculator._sample_sequential`` on those outputs. Printed: rounds, draft chains identical, and the
largest confidence difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from drafterkit.assets.target import load_target
    from drafterkit.decode import generate
    from drafterkit.decode.inputs import resolve_eos
    from drafterkit.drafters import load_drafter
    from drafterkit.speceval.prompts import select_prompts
    from drafterkit.speceval.serve_parity import RUNNER, vllm_python

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", required=True)
    p.add_argument("--export", required=True, help="the vllm-dspark export of --drafter")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--benchmark", default="mt-bench")
    p.add_argument("--num-prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=7)
    p.add_argument("--venv", default=None)
    args = p.parse_args(argv)
    target, tok = load_target(args.target, dtype="float32", chat=True)
    drafter = load_drafter(args.drafter, target=target)
    rounds: list[tuple] = []
    chain = drafter.chain

    def recording(hidden, prev, k, sampling, generator, vocab_size):
        out = chain(hidden, prev, k, sampling, generator, vocab_size)
        if k >= hidden.shape[1]:  # a whole block drafted (rounds near max_new_tokens ask fewer: left out)
            rounds.append((drafter.norm(hidden).float(), prev.clone(), out[0][:, :hidden.shape[1]].clone()))
        return out

    drafter.chain = recording
    eos = sorted(resolve_eos(target, None, target.config.vocab_size))
    for x in select_prompts(args.benchmark, tok, args.num_prompts).prompts:
        with torch.no_grad():
            generate(target, [x.input_ids], drafter=drafter, max_new_tokens=args.max_new_tokens,
                     num_draft_tokens=args.k, eos_token_id=eos)
    hidden = torch.cat([h for h, _, _ in rounds])  # [R, S, H]
    anchors = torch.cat([a for _, a, _ in rounds])
    ours = torch.cat([t for _, _, t in rounds])
    prevs = torch.cat([anchors[:, None], ours[:, :-1]], 1)
    with torch.no_grad():  # drafterkit's confidences of the recorded (normed) outputs
        conf = torch.sigmoid(drafter.confidence_head(hidden, drafter.markov_head.embed(prevs)))
    with tempfile.TemporaryDirectory() as tmp:
        req, res = Path(tmp) / "req.json", Path(tmp) / "res.json"
        from safetensors.torch import save_file

        head = Path(tmp) / "lm_head.safetensors"  # a full-vocabulary export shares the target's LM head
        save_file({"lm_head.weight": target.get_output_embeddings().weight.detach().contiguous()}, str(head))
        req.write_text(json.dumps({"export": str(Path(args.export).resolve()), "target_lm_head": str(head),
                                   "hidden": hidden.tolist(), "anchors": anchors.tolist()}))
        subprocess.run([str(vllm_python(args.venv)), str(RUNNER.with_name("vllm_dspark_heads.py")), str(req),
                        str(res)], check=True, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PATH": "/usr/bin:/bin"})
        theirs = json.loads(res.read_text())
    same = sum(a == b for a, b in zip(theirs["tokens"], ours.tolist()))
    diff = float((torch.tensor(theirs["confidence"]) - conf).abs().max()) if theirs["confidence"] else float("nan")
    print(f"rounds {len(ours)}, draft chains identical {same}/{len(ours)}, largest confidence difference {diff:.2e}")
    return 0 if same == len(ours) else 1


if __name__ == "__main__":
    sys.exit(main())
