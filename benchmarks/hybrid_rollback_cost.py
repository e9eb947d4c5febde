"""What exact rollback of recurrent state costs: prompt lookup against plain decoding on a tiny hybrid target, beside
an attention-only target of the same shape, in one run.

A hybrid target's verification pass records each recurrent layer's state at every position and keeps, per row, the
one after the accepted tokens (``decode.recurrent_cache``): its recurrent layers step token by token through the pass
where plain decoding steps one token per pass anyway. This decodes ``--num-prompts`` seeded random prompts that
repeat a span (so prompt lookup drafts) greedily with each target, plain and with ``ngram`` as a chain of ``--k``,
the four runs interleaved prompt by prompt after an untimed warm-up, and prints tokens/s per run, the ratio
lookup / plain per target (each pair measured side by side), tau, and whether the texts equal plain decoding's.
Then the rollback alone: the median time of one verification pass of ``--k + 1`` tokens through the hybrid's
``decode.cache.RaggedCache`` keeping 2 of them, with rollback (states recorded per position, then selected) and
without (transformers' chunked pass, the state left past the kept tokens: wrong, timed only), and a plain
decoding step of one token, interleaved.

    OMP_NUM_THREADS=1 python benchmarks/hybrid_rollback_cost.py --family qwen3_5 --num-prompts 6
"""

from __future__ import annotations

import argparse
import random
import time

import torch

#: hybrid family -> (model_type, class, config overrides); the attention twin is Qwen3 of the same shape
HYBRIDS = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", {
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
        "linear_num_key_heads": 4, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
        "linear_value_head_dim": 32}),
    "nemotron_h": ("nemotron_h", "NemotronHForCausalLM", {
        "hybrid_override_pattern": "M-M*M-M*", "mamba_num_heads": 8, "mamba_head_dim": 32, "ssm_state_size": 32,
        "n_groups": 1, "chunk_size": 64, "expand": 1}),
}


def build(model_type: str, cls: str, own: dict, hidden: int, vocab: int, seed: int = 0):
    import transformers
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=hidden // 4, max_position_embeddings=1024, tie_word_embeddings=False,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, **own)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # greedy decoding is no tie-break
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="qwen3_5", choices=sorted(HYBRIDS))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=5)
    a = p.parse_args()

    from drafterkit import decode
    from drafterkit.drafters.ngram import NGramDrafter

    targets = {a.family: build(*HYBRIDS[a.family], a.hidden, a.vocab),
               "qwen3 (attention)": build("qwen3", "Qwen3ForCausalLM", {}, a.hidden, a.vocab)}
    rnd = random.Random(0)
    prompts = []
    for _ in range(a.num_prompts):
        span = [rnd.randrange(3, a.vocab) for _ in range(24)]
        prompts.append(span + [rnd.randrange(3, a.vocab) for _ in range(40)] + span)
    runs = [(name, spec) for name in targets for spec in (False, True)]
    sums = {r: [0, 0.0, 0, 0] for r in runs}  # tokens, seconds, verified tokens, passes
    plain_texts: dict[tuple[str, int], list[int]] = {}
    differ = {name: 0 for name in targets}
    for i, ids in enumerate([prompts[0]] + prompts):  # the first prompt once untimed: warm-up
        for name, spec in runs:
            t0 = time.perf_counter()
            out = decode.generate(targets[name], [ids], drafter=NGramDrafter() if spec else None, num_draft_tokens=a.k,
                                  max_new_tokens=a.max_new_tokens, eos_token_id=[])
            dt = time.perf_counter() - t0
            if i == 0:
                continue
            seq = out.sequences[0]
            if not spec:
                plain_texts[(name, i)] = seq
            elif seq != plain_texts[(name, i)]:
                differ[name] += 1
            s = sums[(name, spec)]
            s[0] += len(seq)
            s[1] += dt
            s[2] += out.stats.committed - 1
            s[3] += out.stats.target_forwards
    print(f"{a.num_prompts} prompts x {a.max_new_tokens} new tokens, hidden {a.hidden}, vocab {a.vocab}, 8 layers, "
          f"fp32, {torch.get_num_threads()} thread(s), ngram chain of {a.k}")
    for name in targets:
        plain, look = sums[(name, False)], sums[(name, True)]
        tps_plain, tps_look = plain[0] / plain[1], look[0] / look[1]
        print(f"{name}: plain {tps_plain:.1f} tok/s, lookup {tps_look:.1f} tok/s, lookup / plain "
              f"{tps_look / tps_plain:.3f}, tau {look[2] / max(look[3], 1):.2f}, "
              f"texts differing from plain {differ[name]} of {a.num_prompts}")
    cost = pass_cost(targets[a.family], prompts[0], a.k)
    print(f"{a.family}: one verification pass of {a.k + 1} tokens keeping 2: with rollback "
          f"{1000 * cost['rollback']:.2f} ms, without {1000 * cost['chunked']:.2f} ms, with / without "
          f"{cost['rollback'] / cost['chunked']:.3f}; a plain one-token step {1000 * cost['step']:.2f} ms, pass with "
          f"rollback / step {cost['rollback'] / cost['step']:.3f}")


def pass_cost(target, prompt: list[int], k: int, reps: int = 40) -> dict[str, float]:
    """Median seconds, interleaved (the caches grow alike): a verification pass of ``k + 1`` tokens keeping 2 with
    rollback (``"rollback"``) and without (``"chunked"``), and a plain decoding step of one token (``"step"``)."""
    from drafterkit.decode.cache import RaggedCache

    runs = {"rollback": (True, k + 1, 2), "chunked": (False, k + 1, 2), "step": (False, 1, 1)}
    caches = {name: RaggedCache(target, 1, torch.device("cpu"), rollback=flag) for name, (flag, _, _) in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.inference_mode():
        for cache in caches.values():
            cache.prefill([prompt])
        for _ in range(reps):
            for name, (_, m, kept) in runs.items():
                t0 = time.perf_counter()
                caches[name].run(torch.tensor([prompt[-m:]]))
                caches[name].keep(torch.tensor([kept]))
                times[name].append(time.perf_counter() - t0)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


if __name__ == "__main__":
    main()
