"""Where a speculative round leaves plain decoding's bits: one verification pass replayed against plain steps.

Greedy speculative decoding equals plain decoding token for token only if every committed token's tensors get
the bits a plain decoding step gives them. This replays one verification pass of a given shape (a chain, a
tree whose true path sits beside a wrong leaf, a ragged batch of two rows) over a cache that plain decoding
grew, runs the plain steps of the same tokens, and reports, per committed token, the first module output (in
forward order) whose row differs bitwise, or None. It is the diagnosis behind the decoder's exact mode
(``decode.exact_mode``): a CPU whose kernels round some pass apart shows here which tensor, with each part of
exact mode on or off.

    python benchmarks/exactness_replay.py                       # SmolLM2-135M in bf16, every shape and mode
    python benchmarks/exactness_replay.py --target PATH --dtype fp16 --shape tree

tests/test_decode_exact.py imports :func:`replay` and :func:`first_difference`.
"""

from __future__ import annotations

import argparse

import torch

from drafterkit.decode import generate
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.fused import fused_projections
from drafterkit.decode.tree import DraftTree

SHAPES = ("chain", "tree", "ragged")


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(model, fn) -> list[tuple[str, torch.Tensor]]:
    """``(name, first output tensor)`` of every module call made by ``fn()``, in call order."""
    rec, handles = [], []
    for name, mod in model.named_modules():
        def hook(m, args, out, name=name):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(t, torch.Tensor):
                rec.append((name, t.detach().clone()))
        handles.append(mod.register_forward_hook(hook))
    try:
        fn()
    finally:
        for h in handles:
            h.remove()
    return rec


def _plain_steps(model, prompt: list[int], toks: list[int], exact: bool) -> list[list]:
    """Per token of ``toks``, the records of the plain decoding step that processes it."""
    c = RaggedCache(model, 1, torch.device("cpu"), exact=exact)
    c.prefill([prompt], logits_to_keep=1)
    out = []
    for t in toks:
        out.append(_run(model, lambda t=t: c.run(torch.tensor([[t]]), logits_to_keep=1)))
        c.keep(torch.tensor([1]), valid_max=1)
    return out


def first_difference(step: list, wide: list, b: int, col: int, m: int) -> str | None:
    """The first module output (forward order) whose row ``col`` of batch row ``b`` in the verification pass
    (``wide``, ``m`` new columns) differs bitwise from the plain step's (``step``); None when none does."""
    assert [n for n, _ in step] == [n for n, _ in wide]
    for (name, a), (_, w) in zip(step, wide):
        if a.dim() >= 2 and w.dim() >= 2 and w.shape[1] == m and a.shape[1] == 1:
            if not torch.equal(a[:1], w[b: b + 1, col: col + 1]):
                return name
    return None


def replay(model, exact: bool, shape: str, length: int = 45, n: int = 8) -> list[str | None]:
    """One verification pass of ``shape`` (:data:`SHAPES`) against plain steps of the same tokens.

    Args:
        model: the target (any dtype, on the CPU).
        exact: the caches run exact attention (``decode.attention.exact_sdpa``); the linear layers follow
            ``decode.fused.ROW_INVARIANT`` as set by the caller.
        length: prompt tokens; ``n``: tokens decoded, of which the last ``n - 2`` are verified in one pass.

    Returns:
        Per verified token, the name of the first module whose output row differs, or None.
    """
    vocab = model.config.vocab_size
    prompt = _prompt(0, length, vocab)
    seq = generate(model, [prompt], max_new_tokens=n + 1, eos_token_id=[]).sequences[0]
    with torch.inference_mode(), fused_projections(model):
        plain = _plain_steps(model, prompt, seq[:n], exact)
        c = RaggedCache(model, 2 if shape == "ragged" else 1, torch.device("cpu"), exact=exact)
        rows = [prompt, _prompt(1, 30, vocab)] if shape == "ragged" else [prompt]
        c.prefill(rows, logits_to_keep=1)
        for t in seq[:2]:  # two plain steps first, so the pass runs over a cache that decoding grew
            c.run(torch.tensor([[t]] * len(rows)), logits_to_keep=1)
            c.keep(torch.ones(len(rows), dtype=torch.long), valid_max=1)
        path = seq[2:n]
        if shape == "tree":  # the true path as the rank-1 branch beside a wrong rank-0 leaf: nodes in between
            tree = DraftTree.parse([[0]] + [[1] + [0] * d for d in range(len(path) - 1)])
            ids = {(0,): (path[1] + 1) % vocab}
            ids.update({(1,) + (0,) * d: path[d + 1] for d in range(len(path) - 1)})
            toks = [path[0]] + [ids[p] for p in tree.paths]  # [root = the last committed token, nodes]
            cols = [0] + [tree.paths.index((1,) + (0,) * d) + 1 for d in range(len(path) - 1)]
            wide = _run(model, lambda: c.run_tree(torch.tensor([toks]), torch.tensor((0,) + tree.depths),
                                                  tree.attention_mask(), logits_to_keep=len(toks)))
            return [first_difference(plain[2 + d], wide, 0, cols[d], len(toks)) for d in range(len(path))]
        ids = torch.tensor([path] * len(rows))
        wide = _run(model, lambda: c.run(ids, logits_to_keep=len(path)))
        return [first_difference(plain[2 + j], wide, 0, j, len(path)) for j in range(len(path))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--shape", choices=SHAPES, action="append", help="default: every shape")
    p.add_argument("--length", type=int, default=45, help="prompt tokens (random ids)")
    a = p.parse_args()

    from drafterkit.assets.target import load_target
    from drafterkit.decode import attention, fused, invariance

    model, _ = load_target(a.target, dtype=a.dtype)
    print(f"{a.target}, {a.dtype}, {torch.get_num_threads()} threads; per verified token, the first module whose "
          "row differs from the plain step's (None: identical)")
    for attn, rows in ((True, True), (True, False), (False, True), (False, False)):
        before = (attention.EXACT, fused.ROW_INVARIANT)
        attention.EXACT, fused.ROW_INVARIANT = attn, rows
        try:
            for shape in a.shape or SHAPES:
                found = replay(model, attn, shape, a.length)
                print(f"  exact attention {'on ' if attn else 'off'}, row-invariant linear "
                      f"{'on ' if rows else 'off'}, {shape:6s}: {found}")
        finally:
            attention.EXACT, fused.ROW_INVARIANT = before
    print("GEMM checks (decode.invariance):", invariance.checks())


if __name__ == "__main__":
    main()
