"""Exact decoding on targets with recurrent layers: the hybrids Qwen3.5 (dense and MoE), Qwen3-Next and OLMo-hybrid
(Gated DeltaNet), Kimi-Linear (Kimi Delta Attention), Nemotron-H, Granite-4.0-H, Falcon-H1, Bamba and Zamba2
(Mamba-2), Jamba (Mamba), LFM2 (dense and MoE) and LFM3 (short convolutions; LFM3's beside sliding-window
attention), Bailing-hybrid (delta attention beside latent attention), and Mamba, Mamba-2 and Falcon-Mamba, recurrent
throughout; each a tiny seeded random target built from its transformers 5.25 config.

Plain decoding through the engine equals transformers' greedy ``generate``; chain speculative decoding (prompt
lookup, and a draft LM of the same family whose head is perturbed, so drafts are partly rejected and the draft
model's own recurrent state is rolled back too) equals plain decoding token for token in fp32, single rows and
ragged batches; after a verification round each recurrent layer's state is the state after only the accepted tokens
(``decode.recurrent_cache``); the first tokens at temperature 1 follow the target's law (chi-square, as
tests/test_decode_distribution.py); trees are refused before any token is generated."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers import AutoConfig

from drafterkit.cli import main
from drafterkit.decode import generate
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.chain_round import chain_round
from drafterkit.decode.decoder import Decoder, prefill
from drafterkit.decode.draft_model import DraftModel
from drafterkit.decode.protocol import SamplingParams
from drafterkit.decode.recurrent import ROLLBACK_MODEL_TYPES, UNRECORDED, recurrent_layers, recurrent_problem
from drafterkit.decode.sampling import logits_to_probs
from drafterkit.drafters.ngram import NGramDrafter
from drafterkit.speceval.tune import tune
from conftest import tiny_llama
from families import one_thread, tiny_tokenizer  # noqa: F401 -- one_thread: autouse, one intra-op thread here
from test_decode_distribution import _chi2

_BASE = {"vocab_size": 320, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256,
         "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DELTANET = {"head_dim": 16,
             "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
             "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
             "linear_value_head_dim": 8}
#: family -> (model_type, causal-LM class, config overrides): recurrent layers mixed with attention
HYBRIDS = {
    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM", _DELTANET),
    "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", {
        **_DELTANET, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16}),
    "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM", {
        **_DELTANET, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16}),
    "nemotron_h": ("nemotron_h", "NemotronHForCausalLM", {
        "head_dim": 16, "hybrid_override_pattern": "M-M*", "mamba_num_heads": 4, "mamba_head_dim": 8,
        "ssm_state_size": 8, "n_groups": 1, "chunk_size": 16}),
    "granite_h": ("granitemoehybrid", "GraniteMoeHybridForCausalLM", {
        "layer_types": ["mamba", "attention", "mamba", "attention"], "mamba_n_heads": 4, "mamba_d_head": 16,
        "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_chunk_size": 16, "num_local_experts": 2,
        "num_experts_per_tok": 1, "shared_intermediate_size": 48}),
    "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM", {
        "head_dim": 16, "mamba_d_ssm": 32, "mamba_n_heads": 2, "mamba_d_head": 16, "mamba_d_state": 8,
        "mamba_chunk_size": 16}),
    "lfm2": ("lfm2", "Lfm2ForCausalLM", {"layer_types": ["conv", "full_attention", "conv", "full_attention"],
                                         "conv_L_cache": 3, "block_ff_dim": 48}),
    "lfm2_moe": ("lfm2_moe", "Lfm2MoeForCausalLM", {
        "layer_types": ["conv", "full_attention", "conv", "full_attention"], "conv_L_cache": 3, "num_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 16, "num_dense_layers": 1}),
    "jamba": ("jamba", "JambaForCausalLM", {
        "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
        "num_experts": 2, "num_experts_per_tok": 1, "mamba_d_state": 8, "mamba_dt_rank": 4}),
    "bamba": ("bamba", "BambaForCausalLM", {
        "attn_layer_indices": [1, 3], "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8,
        "mamba_n_groups": 1, "mamba_chunk_size": 16}),
    "zamba2": ("zamba2", "Zamba2ForCausalLM", {  # Mamba-2 layers, two with the shared attention block
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "mamba_d_state": 8, "n_mamba_heads": 4,
        "chunk_size": 16, "attention_head_dim": 16}),
    "kimi_linear": ("kimi_linear", "KimiLinearForCausalLM", {  # Kimi Delta Attention beside latent attention
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "num_key_value_heads": 2, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
        "head_dim": 8, "linear_attn_config": {"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 4},
        "num_experts": 2, "num_experts_per_token": 1, "moe_intermediate_size": 16}),
    "olmo_hybrid": ("olmo_hybrid", "OlmoHybridForCausalLM", {}),  # Gated DeltaNet layers, then attention
    "lfm3": ("lfm3", "Lfm3ForCausalLM", {  # short convolutions, sliding and full attention
        "layer_types": ["conv", "sliding_attention", "conv", "full_attention"], "sliding_window": 8,
        "conv_L_cache": 3, "block_ff_dim": 48}),
    "bailing_hybrid": ("bailing_hybrid", "BailingHybridForCausalLM", {  # delta attention, latent attention
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "num_key_value_heads": 2, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
        "head_dim": 16, "num_local_experts": 2, "num_experts_per_tok": 1, "n_group": 1, "topk_group": 1,
        "moe_intermediate_size": 16, "first_k_dense_replace": 1, "layer_group_size": 2}),
    # recurrent throughout: no attention layer
    "mamba": ("mamba", "MambaForCausalLM", {"state_size": 8}),
    "mamba2": ("mamba2", "Mamba2ForCausalLM", {"num_heads": 4, "head_dim": 16, "state_size": 8, "n_groups": 1,
                                               "chunk_size": 16}),
    "falcon_mamba": ("falcon_mamba", "FalconMambaForCausalLM", {"state_size": 8}),
}
#: the families the fast tier decodes (Gated DeltaNet, Mamba-2 beside attention, short convolutions); `--all` adds
#: the rest (marked ``matrix``)
FAST_HYBRIDS = ("qwen3_5", "nemotron_h", "lfm2")


def per_family(cases, fast=FAST_HYBRIDS) -> list:
    """``cases`` (families, or tuples that start with one) as parameters, those of a family outside ``fast`` marked
    ``matrix`` (run by the full suite only)."""
    out = []
    for case in cases:
        values = case if isinstance(case, tuple) else (case,)
        out.append(pytest.param(*values, marks=() if values[0] in fast else pytest.mark.matrix))
    return out


# repeated spans, so prompt lookup drafts; different lengths, so a batch of them is ragged (left-padded)
ROWS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12, 13, 11, 12], [20, 21, 22, 23, 24, 25, 26, 20, 21, 22, 23]]
NEW = 24


def build(family: str, seed: int = 0, noise: float = 0.0, **overrides):
    """A seeded random fp32 target of ``family`` (eval mode, frozen, LM head scaled 8x so greedy decoding is no
    tie-break); ``noise`` perturbs its LM head by that many of its standard deviations (a draft model that agrees
    with the seed-``seed`` target often)."""
    model_type, cls, own = HYBRIDS[family]
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(AutoConfig.for_model(model_type, **{**_BASE, **own, **overrides})).eval()
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(8.0)
        if noise:
            head.add_(noise * head.std() * torch.randn(head.shape, generator=torch.Generator().manual_seed(seed + 1)))
    model.requires_grad_(False)
    model.generation_config.eos_token_id = model.config.eos_token_id
    return model


@pytest.fixture(scope="module", params=per_family(sorted(HYBRIDS)))
def hybrid(request):
    """``(family, target, plain)``: plain greedy decoding of each of :data:`ROWS` through the engine."""
    target = build(request.param)
    plain = [generate(target, [r], max_new_tokens=NEW, eos_token_id=[]).sequences[0] for r in ROWS]
    return request.param, target, plain


def test_the_families_are_hybrids_the_decoder_rolls_back(hybrid):
    family, target, _ = hybrid
    assert target.config.model_type in ROLLBACK_MODEL_TYPES and recurrent_problem(target.config) is None
    assert recurrent_layers(target.config)  # recurrent layers beside attention ones
    assert RaggedCache(target, 1, torch.device("cpu")).recurrent


def test_plain_equals_transformers_greedy(hybrid):
    _, target, plain = hybrid
    for row, out in zip(ROWS, plain):
        ref = target.generate(torch.tensor([row]), max_new_tokens=NEW, do_sample=False, eos_token_id=None)
        assert out == ref[0, len(row):].tolist()


def test_chains_equal_plain_single_and_ragged(hybrid):
    """Prompt lookup and a perturbed draft LM of the family (a hybrid draft model: its draft steps are rolled back
    from RaggedCache.mark) as chains, each row alone and the three rows as one ragged batch."""
    family, target, plain = hybrid
    for drafter in (NGramDrafter(), build(family, noise=0.5)):
        singles = [generate(target, [r], drafter=drafter, max_new_tokens=NEW, eos_token_id=[]) for r in ROWS]
        assert [s.sequences[0] for s in singles] == plain
        batch = generate(target, ROWS, drafter=drafter, max_new_tokens=NEW, num_draft_tokens=4, eos_token_id=[])
        assert batch.sequences == plain
    assert 0 < batch.stats.accepted < batch.stats.drafted  # the draft LM's drafts accepted and rejected
    # an EOS that ends the rows at different rounds: a finished row stays in the batch keeping no tokens
    eos = plain[1][6]
    cut = [p[: p.index(eos) + 1] if eos in p else p for p in plain]
    assert len({len(c) for c in cut}) > 1
    assert generate(target, ROWS, drafter=NGramDrafter(), max_new_tokens=NEW, eos_token_id=eos).sequences == cut


def _states(cache: RaggedCache, row: int) -> list[torch.Tensor]:
    """Row ``row``'s convolution windows and SSM / linear-attention states, layer by layer."""
    out = []
    for layer in cache.recurrent.layers:
        out += [layer.conv_states[i][row] for i in range(layer.number_of_states) if layer.is_conv_states_initialized[i]]
        out += [layer.recurrent_states[i][row] for i in range(layer.number_of_states)
                if layer.is_recurrent_states_initialized[i]]
    return out


def test_rollback_leaves_the_state_of_the_accepted_tokens(hybrid):
    """Chain rounds of a ragged batch with a draft LM whose drafts are partly rejected: after every round, every
    row's recurrent state is the one a fresh cache reaches by feeding that row's prompt and then its committed
    tokens one at a time."""
    family, target, _ = hybrid
    dec = Decoder(target, DraftModel(build(family, noise=0.5)), SamplingParams(0.0), None, 4, NEW, frozenset(), 320,
                  None, ROWS)
    dec.proposer.reset(len(ROWS))
    prefill(dec)
    for _ in range(4):
        chain_round(dec)
        for b, row in enumerate(ROWS):
            ref = RaggedCache(target, 1, torch.device("cpu"))
            ref.prefill([row])
            for t in dec.tokens[b][len(row): -1]:  # the last committed token is the next pass's input
                ref.run(torch.tensor([[t]]))
                ref.keep(torch.ones(1, dtype=torch.long))
            assert int(dec.cache.n_real[b]) == len(dec.tokens[b]) - 1 == int(ref.n_real[0])
            for got, want in zip(_states(dec.cache, b), _states(ref, 0), strict=True):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=f"{family} row {b}")
    assert 0 < dec.counts.accepted < dec.counts.drafted  # rows kept some draft tokens and dropped others


@pytest.mark.parametrize("tree", ["2,1", "dynamic:4:2:2"])
def test_trees_are_refused_up_front(hybrid, tree):
    family, target, _ = hybrid
    with pytest.raises(ValueError, match=r"tree drafts would need a recurrent state per tree node.*use chain drafts"):
        generate(target, ROWS, drafter=NGramDrafter(), tree=tree, max_new_tokens=NEW)


def test_a_hybrid_draft_model_drafts_chains_only():
    """A draft LM with recurrent layers (a Qwen3.5 one, before an attention target) drafts chains, rolled back from
    its mark, and is refused with a tree before any token is generated."""
    target, draft = tiny_llama(0, vocab_size=320), build("qwen3_5", noise=0.5)
    plain = generate(target, ROWS, max_new_tokens=NEW, eos_token_id=[]).sequences
    assert generate(target, ROWS, drafter=draft, max_new_tokens=NEW, eos_token_id=[]).sequences == plain
    with pytest.raises(ValueError, match=r"draft model Qwen3_5ForCausalLM \(qwen3_5_text\) has recurrent.*tree drafts"):
        generate(target, ROWS, drafter=draft, tree="2,1", max_new_tokens=NEW)


V, PROMPT, RUNS = 16, [1, 5, 9], 3000


@pytest.mark.parametrize("family,kind", per_family([("qwen3_5", "ngram"), ("nemotron_h", "ngram"), ("lfm2", "draft_lm"),
                                                     ("jamba", "ngram"), ("mamba2", "draft_lm")]))
def test_first_tokens_follow_target_distribution(family, kind):
    """Temperature 1, chains of 2 (prompt lookup with every id in the prompt, or a perturbed draft LM of the family
    with its q): the first round verifies two draft tokens per row, accepted, or rejected at either, so the rows'
    states diverge; the first four tokens keep the target's joint law (each pair of neighbours tested), enumerated
    with cache-free forwards."""
    target = build(family, vocab_size=V)
    drafter = NGramDrafter() if kind == "ngram" else build(family, noise=0.5, vocab_size=V)
    prompt = list(range(V)) + PROMPT
    res = generate(target, [prompt] * RUNS, drafter=drafter, max_new_tokens=4, num_draft_tokens=2, temperature=1.0,
                   seed=1234, eos_token_id=[])
    seqs = torch.tensor(res.sequences)  # [RUNS, 4]
    params = SamplingParams(1.0)
    with torch.no_grad():
        p1 = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], params).double()
        p2 = logits_to_probs(target(torch.tensor([prompt + [a] for a in range(V)])).logits[:, -1], params).double()
        three = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3 = logits_to_probs(target(three).logits[:, -1], params).double().reshape(V, V, V)
        four = torch.tensor([prompt + [a, b, c] for a in range(V) for b in range(V) for c in range(V)])
        p4 = logits_to_probs(target(four).logits[:, -1], params).double().reshape(V, V, V, V)
    joint = p1[:, None, None, None] * p2[:, :, None, None] * p3[:, :, :, None] * p4  # [V, V, V, V]
    for pos, marg in ((0, joint.sum((2, 3))), (1, joint.sum((0, 3))), (2, joint.sum((0, 1)))):
        pairs = torch.bincount(seqs[:, pos] * V + seqs[:, pos + 1], minlength=V * V).double()
        assert _chi2(pairs, marg.flatten()) > 1e-3, f"tokens {pos + 1} and {pos + 2}"
    assert 0 < res.stats.accepted < res.stats.drafted


def test_other_recurrent_families_stay_refused():
    """Families whose state transformers keeps where it cannot be recorded per position (Zamba, RecurrentGemma,
    RWKV, ...) are refused with that reason, naming the ones that are covered; a loaded Zamba target is refused by
    generate before decoding."""
    for config in ({"model_type": "zamba", "layers_block_type": ["mamba", "hybrid"]},
                   {"model_type": "recurrent_gemma", "block_types": ["recurrent", "attention"]},
                   {"model_type": "rwkv"}):
        line = recurrent_problem(config, "target T")
        assert line.startswith(f"target T ({config['model_type']}) has recurrent") and "exact rollback covers" in line
        assert UNRECORDED[config["model_type"]] in line and "jamba" in line and "\n" not in line
    torch.manual_seed(0)
    zamba = transformers.ZambaForCausalLM(AutoConfig.for_model("zamba", **{
        **_BASE, "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 8, "n_mamba_heads": 2,
        "attention_head_dim": 16})).eval()
    with pytest.raises(ValueError, match=r"target ZambaForCausalLM \(zamba\) has recurrent.*keeps only its final"):
        generate(zamba, [[5, 6, 7]], max_new_tokens=2)


@pytest.mark.filterwarnings("ignore:.*CPU cores are busy")  # a shared test machine; the search's shape is checked
def test_tune_sweeps_chains_only_on_a_hybrid_target(tmp_path):
    """``drafterkit tune``'s search on a hybrid target: the default trees and dynamic trees are not swept and the
    incumbent is a chain; the record says why."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"the cat sat on the mat {i} the cat sat"}) + "\n"
                               for i in range(2)))
    rec = tune("ngram", target_name="tiny-qwen3_5", target=build("qwen3_5"), tok=tiny_tokenizer(),
               benchmark=str(prompts), num_prompts=2, max_new_tokens=4, concurrency=1, ks=[2, 3],
               thresholds=[0.0], eta=2, first=1, progress=False, write=False)
    assert "tree drafts would need a recurrent state per tree node" in rec["search"]["chains_only"]
    assert rec["search"]["incumbent"].startswith("chain") and rec["winners"]["1"]["tree"] == "chain"
    assert {r["tree"] for r in rec["table"]} == {"chain"} and len(rec["table"]) >= 2


@pytest.mark.filterwarnings("ignore:.*CPU cores are busy")
def test_eval_measures_prompt_lookup_on_a_hybrid_target_folder(tmp_path, capsys):
    """``drafterkit eval`` on a saved hybrid target (weights, tokenizer with its chat template): prompt lookup beside
    the engine's plain decoding and transformers' ``generate``, 0 outputs differing from plain decoding."""
    target = tmp_path / "target"
    build("nemotron_h").save_pretrained(target)
    tiny_tokenizer().save_pretrained(target)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat sat on the mat, the cat sat on the"}) + "\n")
    out = tmp_path / "eval.json"
    assert main(["eval", "--target", str(target), "--drafter", "ngram", "--benchmark", str(prompts),
                 "--num-prompts", "1", "--max-new-tokens", "12", "--output", str(out)]) == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    assert record["exactness"]["checked"] and record["exactness"]["mismatches"] == {"ngram": 0}
    assert {row["method"] for row in record["summary"]} >= {"ngram", "engine"}
