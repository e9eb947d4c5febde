"""A DFlash drafter's logits in vLLM and in drafterkit, block pass by block pass, at several ``rope_theta``.

    python benchmarks/dflash_vllm_logits.py --out runs/dflash-logits   # ~2 min on 2 cores, one vLLM process

Per ``--thetas`` value: a 2-layer Llama target (``tests/families.py``'s ``llama3`` family, 2 heads of 32 as vLLM's
CPU attention takes, default RoPE at that ``rope_theta``), a DFlash drafter of block ``--block-size`` (draft
vocabulary: every other id) trained ``--steps`` steps on the target's greedy answers to 10 prompts, exported
(``vllm-dflash``) and decoded greedily in fp32 on 2 prompts x 32 new tokens at K = ``--k`` in both engines.

drafterkit's side records, at every block pass, the drafter's logits with its trained block (``block_size - 1``
mask slots, ``mask_slots = B-1``) and with vLLM's block ``[bonus, mask x K]`` (the decoder's default at K).
vLLM's side is this file run by the vLLM venv's python (``--vllm-side REQUEST RESULT``; it imports
``speceval/vllm_runner.py`` by path, no drafterkit): it wraps
``DFlashQwen3ForCausalLM.precompute_and_store_context_kv`` / ``forward`` / ``compute_logits`` and saves
each pass's context positions, block positions and ids, and logits. Printed per theta: serve-check's chain
comparison against each drafterkit block, whether every shared pass had the same positions and ids, the largest
``|logit|`` difference from vLLM's logits for each block, and the draft positions whose argmax differs from vLLM's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PROMPT_LEN, NEW = 40, 32


def build_case(theta: float, args, folder: Path) -> dict:
    """Target, trained drafter and export for one ``theta`` under ``folder``; drafterkit's decode of the 2 prompts
    with both blocks, saved to ``folder/ours.pt``. Returns vLLM's job for it."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from families import build_family, family_prompts

    from drafterkit.decode import generate
    from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
    from drafterkit.drafters.export.writers import export
    from drafterkit.speceval import serve_parity
    from drafterkit.train.recipe import recipe_from_dict
    from drafterkit.train.strategies import get_strategy

    target, tok = build_family("llama3", num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                               num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": theta})
    target.save_pretrained(folder / "target")
    tok.save_pretrained(folder / "target")
    prompts = family_prompts(2, PROMPT_LEN)
    train_prompts = family_prompts(8, PROMPT_LEN, seed=1) + prompts
    answers = generate(target, train_prompts, max_new_tokens=24).sequences
    rows = [p + a for p, a in zip(train_prompts, answers)]
    width = max(map(len, rows))
    batch = {"input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
             "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
             "loss_mask": torch.tensor([[0] * len(p) + [1] * len(a) + [0] * (width - len(p) - len(a))
                                        for p, a in zip(train_prompts, answers)])}
    half = target.config.vocab_size // 2
    torch.manual_seed(0)
    drafter = DFlashDrafter(DFlashConfig.from_target(target, draft_vocab_size=half, block_size=args.block_size),
                            target=target)
    drafter.set_draft_vocab(torch.arange(half) * 2, target=target)
    options = {"draft_vocab_size": half, "block_size": args.block_size, "num_anchors": 32}
    recipe = recipe_from_dict({"output_dir": str(folder / "unused"), "loss": {"name": "fkl"},
                               "drafter": {"kind": "dflash", "options": options}})
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    drafter.train()
    for _ in range(args.steps):
        loss, _ = get_strategy("dflash").loss(drafter, target, batch, recipe)
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()
    exported = export(drafter.save_pretrained(folder / "dflash"), "vllm-dflash", folder / "export",
                      target=str(folder / "target"))
    ours = {}
    for name, slots in (("its trained block", drafter.config.block_size - 1), ("vLLM's block (the default)", None)):
        drafter.mask_slots = slots
        ours[name] = decode_recording(drafter, target, prompts, args.k, serve_parity)
    torch.save(ours, folder / "ours.pt")
    return {"target": str(folder / "target"), "draft": str(exported), "method": "dflash", "k": args.k,
            "max_new_tokens": NEW, "prompts": prompts, "eos": [2], "dtype": "float32", "max_num_seqs": 1,
            "dump": str(folder / "vllm.pt")}


def decode_recording(drafter, target, prompts, k: int, serve_parity) -> dict:
    """serve-check's drafterkit run (``speceval.serve_parity.run_drafterkit``) with every block pass's ``(tokens,
    logits [B-1, N])`` recorded per prompt in ``"passes"``."""
    passes: list = []
    original = type(drafter).block_logits

    def block_logits(self, rows, tokens, features, stable, slots=None):
        out = original(self, rows, tokens, features, stable, slots)
        passes.append((list(tokens[rows[0]]), out[0].clone()))
        return out

    type(drafter).block_logits = block_logits
    try:
        run = serve_parity.run_drafterkit(target, drafter, prompts, k, NEW, [2])
    finally:
        type(drafter).block_logits = original
    per_prompt: list[list] = []
    for tokens, logits in passes:  # a prompt's passes see ever longer token lists; the next prompt restarts
        if not per_prompt or len(tokens) <= len(per_prompt[-1][-1][0]):
            per_prompt.append([])
        per_prompt[-1].append((tokens, logits))
    return {**run, "passes": per_prompt}


def vllm_side(request: Path, result: Path) -> None:
    """In the vLLM venv: run the request's jobs as ``speceval/vllm_runner.py`` does, saving each job's DFlash
    passes ``[(context positions, block positions, block ids, logits [K, V])]`` and result to ``job["dump"]``."""
    sys.path.insert(0, str(HERE.parent / "speceval"))
    import vllm_runner

    for key, value in vllm_runner.CPU_ENV.items():
        os.environ.setdefault(key, value)
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM as Model

    events: list = []
    pre, fwd, logits_of = Model.precompute_and_store_context_kv, Model.forward, Model.compute_logits

    def precompute(self, states, positions, slots=None):
        if slots is not None:  # None: a dummy run at start-up
            events.append(["ctx", positions.clone()])
        return pre(self, states, positions, slots)

    def forward(self, input_ids, positions, inputs_embeds=None):
        events.append(["fwd", positions.clone(), input_ids.clone()])
        return fwd(self, input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states):
        out = logits_of(self, hidden_states)
        events.append(["logits", out.clone()])
        return out

    Model.precompute_and_store_context_kv, Model.forward, Model.compute_logits = precompute, forward, compute_logits
    record: dict = {}
    vllm_runner.install_hook(record)
    results = []
    for job in json.loads(request.read_text())["jobs"]:
        events.clear()
        res = vllm_runner.run_job({k: v for k, v in job.items() if k != "dump"}, record)
        passes = [(e[1], f[1], f[2], g[1]) for e, f, g in zip(events, events[1:], events[2:])
                  if (e[0], f[0], g[0]) == ("ctx", "fwd", "logits")]
        torch.save({"passes": passes, "result": res}, job["dump"])
        results.append(res)
    result.write_text(json.dumps({"results": results}))


def compare_case(folder: Path, k: int) -> str:
    """One theta's lines: chains (serve-check's comparison), positions, logit differences, argmax flips."""
    from drafterkit.speceval import serve_parity

    ours, theirs = (torch.load(folder / name, weights_only=True) for name in ("ours.pt", "vllm.pt"))
    result = theirs["result"]
    lines = []
    vllm_per_prompt: list[list] = []
    for entry in theirs["passes"]:  # a prompt's first pass pre-inserts the context from position 0
        if not vllm_per_prompt or int(entry[0][0]) == 0:
            vllm_per_prompt.append([])
        vllm_per_prompt[-1].append(entry)
    for name, run in ours.items():
        cmp = serve_parity.compare(run, result)
        shared, parted, worst, flips, positions = 0, False, 0.0, 0, 0
        for mine, vllm_passes in zip(run["passes"], vllm_per_prompt):
            for (tokens, logits), (_, pos, ids, vlogits) in zip(mine, vllm_passes):
                n = len(tokens)
                if pos.tolist() != list(range(n - 1, n + k)) or int(ids[0]) != tokens[-1]:
                    parted = True  # the runs took different steps from here on
                    break
                shared += 1
                draft_ids = torch.arange(logits.shape[-1]) * 2  # the draft vocabulary: every other target id
                mine_k, theirs_k = logits[:k], vlogits[:, draft_ids]
                worst = max(worst, (mine_k - theirs_k).abs().max().item())
                flips += int((mine_k.argmax(-1) != theirs_k.argmax(-1)).sum())
                positions += k
        lines.append(f"  drafterkit, {name}: chains identical {cmp['chains_identical']}/{cmp['chains']}, "
                     f"{shared} passes with the same positions and ids{' (then the runs part)' if parted else ''}, "
                     f"max |logit difference| {worst:.2g}, argmax differs at {flips}/{positions} draft positions")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/dflash-logits"))
    ap.add_argument("--thetas", default="1e4,1e6,1.2e7", help="comma-separated rope_theta values")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--k", type=int, default=5, help="vLLM's num_speculative_tokens (<= block_size - 1)")
    ap.add_argument("--steps", type=int, default=40, help="drafter training steps")
    ap.add_argument("--vllm-side", nargs=2, type=Path, metavar=("REQUEST", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.vllm_side:
        vllm_side(*args.vllm_side)
        return 0
    if not 1 <= args.k <= args.block_size - 1:
        ap.error(f"--k must be in [1, block_size - 1 = {args.block_size - 1}], got {args.k}")
    sys.path.insert(0, str(HERE.parent))
    from drafterkit.speceval import serve_parity

    torch.set_num_threads(1)  # as vLLM's CPU engine runs
    thetas = [float(t) for t in args.thetas.split(",")]
    folders = [args.out / f"theta-{t:g}" for t in thetas]
    jobs = [build_case(t, args, f) for t, f in zip(thetas, folders)]
    request = args.out / "request.json"
    request.write_text(json.dumps({"jobs": jobs}))
    env = {**os.environ, **serve_parity.VLLM_ENV}
    python = serve_parity.vllm_python()
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = str(iomp)
    with open(args.out / "vllm.log", "w") as log:
        subprocess.run([str(python), __file__, "--vllm-side", str(request), str(args.out / "result.json")],
                       env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    for theta, folder in zip(thetas, folders):
        print(f"rope_theta {theta:g}, block {args.block_size}, K={args.k}:")
        print(compare_case(folder, args.k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
