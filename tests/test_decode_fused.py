"""decode.fused: merged q/k/v and gate/up GEMMs give the separate layers' outputs, and leave the model usable."""

from __future__ import annotations

import pytest
import torch

from drafterkit import decode
from drafterkit.decode import few_rows
from drafterkit.decode.fused import engine_groups, fused_projections
from drafterkit.decode.tree import DraftTree
from drafterkit.drafters.ngram import NGramDrafter
from conftest import tiny_llama


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_merged_forward_is_bit_identical_and_uses_one_gemm_per_group(monkeypatch):
    model = tiny_llama(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    gemms = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: gemms.append(w.shape) or linear(x, w, b))
    want = _logits(model, ids)
    layers = model.config.num_hidden_layers
    assert len(gemms) == 7 * layers + 1  # q, k, v, o, gate, up, down per layer + the LM head
    groups = engine_groups(model)
    assert len(groups) == 4 * layers + 1  # q/k/v, gate/up, o and down in every layer, and the LM head
    gemms.clear()
    with fused_projections(model):
        got = _logits(model, ids)  # 18 rows: more than FEW_ROWS, the stock GEMMs on the merged weights
    assert torch.equal(got, want)
    assert len(gemms) == 4 * layers + 1  # qkv, o, gate_up, down per layer + the LM head
    assert all("forward" not in lin.__dict__ for g in groups for lin in g.layers)  # stock forwards restored
    gemms.clear()
    assert torch.equal(_logits(model, ids), want) and len(gemms) == 7 * layers + 1


def test_a_few_fp32_rows_compute_weight_times_input_with_the_stock_results():
    from drafterkit.decode.fused import FEW_ROWS, _few_rows

    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 40, generator=g), torch.randn(96, generator=g)
    one = torch.randn(1, 1, 40, generator=g)
    assert torch.equal(_few_rows(one, w, None), torch.nn.functional.linear(one, w))  # one row: the stock bits
    for rows in range(2, FEW_ROWS + 1):  # a verification pass: the same values up to fp32 rounding
        x = torch.randn(1, rows, 40, generator=g)
        for bias in (None, b):
            got, want = _few_rows(x, w, bias), torch.nn.functional.linear(x, w, bias)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            # the stock layout (row-major, last dimension of stride 1), not the GEMM's transposed [out, rows]:
            # torch.view_as_complex (Llama-4's, DeepSeek-V2's rotary embedding) refuses any other last stride
            assert got.stride() == want.stride(), (rows, bias is None, got.stride())


def test_the_model_is_untouched_and_bf16_copies_are_prepacked_with_the_same_outputs():
    model = tiny_llama(1).to(torch.bfloat16)
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    ids = torch.randint(0, model.config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(1))
    want = _logits(model, ids)
    groups = engine_groups(model)
    layers = model.config.num_hidden_layers
    # bf16: q/k/v, gate/up, o, down per layer and the LM head, each prepacked for oneDNN where the CPU has its bf16
    # GEMM (the stock bits), else run through the few-row kernel (the stock values up to bf16 rounding)
    assert len(groups) == 4 * layers + 1
    assert all((g.packed is None) == (g.kernel is not None) for g in groups) or not few_rows.available()
    with fused_projections(model):
        got = _logits(model, ids)
    if groups[0].packed is not None:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=0.06, rtol=0.02)
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == ptrs  # parameters never replaced


def test_replaced_or_updated_weights_get_new_copies():
    model = tiny_llama(2)
    first = engine_groups(model)
    assert engine_groups(model) is first  # cached while the weights are the same
    other = tiny_llama(3)
    model.load_state_dict(other.state_dict(), assign=True)  # new tensors
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with fused_projections(model):  # 5 rows in fp32: _few_rows, the stock values up to rounding
        got = _logits(model, ids)
    torch.testing.assert_close(got, _logits(other, ids), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(2.0)  # in place, as an optimizer step
    want = _logits(model, ids)
    with fused_projections(model):
        torch.testing.assert_close(_logits(model, ids), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want, got, rtol=1e-3, atol=1e-3)  # the edit was seen


def test_hooked_or_foreign_layers_are_not_merged():
    model = tiny_llama(4)
    model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda *a: None)
    groups = {id(lin): g for g in engine_groups(model) for lin in g.layers}
    attn = model.model.layers[0].self_attn
    assert id(attn.k_proj) not in groups  # hooked: its own forward
    assert len(groups[id(attn.q_proj)].layers) == 1  # not merged with it (alone, as fp32 layers are)
    assert len(groups[id(model.model.layers[0].mlp.gate_proj)].layers) == 2


def test_speculative_greedy_output_still_equals_plain_and_transformers():
    target = tiny_llama(5)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    with torch.no_grad():
        hf = target.generate(torch.tensor([prompt]), max_new_tokens=14, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
    plain = decode.generate(target, [prompt], max_new_tokens=14)
    spec = decode.generate(target, [prompt], drafter=NGramDrafter(), max_new_tokens=14, tree=DraftTree.parse("2,1"))
    assert spec.counts.drafted > 0
    assert spec.sequences[0] == plain.sequences[0] == hf[0, len(prompt):].tolist()


def test_large_inputs_and_the_switch_run_the_stock_layers(monkeypatch):
    from drafterkit.decode import fused

    model = tiny_llama(6)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(6))
    want = _logits(model, ids)
    gemms = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: gemms.append(w.shape) or linear(x, w, b))
    stock = 7 * model.config.num_hidden_layers + 1
    monkeypatch.setattr(fused, "MAX_ROWS", 17)  # 18 rows: a "prefill"
    with fused_projections(model):
        assert torch.equal(_logits(model, ids), want)
    assert len(gemms) == stock
    monkeypatch.setattr(fused, "MAX_ROWS", 256)
    monkeypatch.setattr(fused, "ENABLED", False)
    gemms.clear()
    with fused_projections(model):
        assert torch.equal(_logits(model, ids), want)
    assert len(gemms) == stock


def test_generate_runs_the_drafter_on_engine_copies_too_and_shared_layers_once():
    from drafterkit.drafters.draft_lm import DraftLM

    target = tiny_llama(7)
    draft_model = tiny_llama(8, layers=1)
    seen = []
    draft_model.model.layers[0].register_forward_pre_hook(
        lambda mod, args: seen.append("forward" in mod.self_attn.q_proj.__dict__))
    prompt = [3, 4, 5, 6, 7]
    plain = decode.generate(target, [prompt], max_new_tokens=10).sequences[0]
    out = decode.generate(target, [prompt], drafter=DraftLM.from_model(draft_model), max_new_tokens=10)
    assert out.sequences[0] == plain and seen and all(seen)
    shared = DraftLM.from_target(target, 1)  # the target's first layer: one engine copy serves both
    assert decode.generate(target, [prompt], drafter=shared, max_new_tokens=10).sequences[0] == plain
    assert all("forward" not in m.__dict__ for m in target.modules())


def test_edits_that_bypass_the_version_counter_are_noticed():
    from drafterkit.decode.fused import refresh

    model = tiny_llama(9)
    prompt = [4, 9, 2, 7, 7, 1]
    before = decode.generate(model, [prompt], max_new_tokens=12).sequences[0]

    def hf():
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
        return out[0, len(prompt):].tolist()

    mlp = model.model.layers[1].mlp
    version = mlp.up_proj.weight._version
    mlp.up_proj.weight.data.mul_(-3.0)  # through .data, as peft's merge_adapter: no version bump
    assert mlp.up_proj.weight._version == version
    assert hf() != before  # the edit matters ...
    assert decode.generate(model, [prompt], max_new_tokens=12).sequences[0] == hf()  # ... and the engine sees it
    opt = torch.optim.AdamW(model.model.layers[0].parameters(), lr=0.5, fused=True)
    for p in model.model.layers[0].parameters():
        p.requires_grad_(True)
        p.grad = torch.randn_like(p)
    opt.step()  # fused AdamW writes without bumping the counters either
    model.requires_grad_(False)
    assert decode.generate(model, [prompt], max_new_tokens=12).sequences[0] == hf()
    with torch.no_grad():
        model.lm_head.weight.data[prompt[0], 0] += 1.0  # one element: may go unseen by the sampled check
    refresh(model)
    assert decode.generate(model, [prompt], max_new_tokens=12).sequences[0] == hf()


def test_threads_decoding_one_model_get_their_own_outputs():
    import threading

    model = tiny_llama(10)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2]]
    want = [decode.generate(model, [p], max_new_tokens=24).sequences[0] for p in prompts]
    got: dict[tuple[int, int], list[int]] = {}

    def work(t: int) -> None:
        for i, p in enumerate(prompts * 4):
            got[t, i] = decode.generate(model, [p], max_new_tokens=24).sequences[0]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(got) == 4 * 4 * len(prompts)
    assert all(seq == want[i % len(prompts)] for (_, i), seq in got.items())


def test_a_hook_added_after_the_copies_were_built_is_honoured():
    model = tiny_llama(11)
    ids = torch.tensor([[1, 5, 9, 13]])
    engine_groups(model)
    k_proj = model.model.layers[0].self_attn.k_proj
    handle = k_proj.register_forward_hook(lambda mod, args, out: out * 0)
    want = _logits(model, ids)
    with fused_projections(model):
        got = _logits(model, ids)
    handle.remove()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # 4 fp32 rows: _few_rows rounding
    assert not torch.allclose(want, _logits(model, ids), rtol=1e-3, atol=1e-3)


def test_a_one_dimensional_bf16_input_runs_through_the_engine_copy():
    """A layer called on a 1-D vector (P-EAGLE's learned mask feature through its fc) is one row like
    ``[1, H]``: same output as the stock layer, shape ``[out]``, exact mode on or off."""
    from drafterkit.decode import fused

    model = tiny_llama(2).to(torch.bfloat16)
    lin = model.model.layers[0].mlp.down_proj
    x = torch.randn(lin.in_features, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    want = torch.nn.functional.linear(x, lin.weight, lin.bias)
    for row_invariant in (True, False):
        old, fused.ROW_INVARIANT = fused.ROW_INVARIANT, row_invariant
        try:
            with torch.inference_mode(), fused_projections(model):
                got = lin(x)
        finally:
            fused.ROW_INVARIANT = old
        assert got.shape == want.shape == (lin.out_features,)
        if fused.engine_groups(model)[0].packed is not None:  # oneDNN prepacked: the stock bits
            assert torch.equal(got, want)
        else:  # the few-row kernel: the stock values up to bf16 rounding
            torch.testing.assert_close(got.float(), want.float(), atol=0.02, rtol=2 ** -7)


def test_bf16_layers_oneDNN_cannot_prepack_run_the_few_row_kernel(monkeypatch):
    """Where oneDNN has no bf16 GEMM (an AVX2 CPU; here forced by refusing its prepacking) a bf16 layer runs the few-row
    kernel, in 16-row calls, and an fp32 GEMM past KERNEL_MAX_ROWS rows: the stock values up to bf16 rounding."""
    from drafterkit.decode import fused

    if not few_rows.available():
        pytest.skip("the few-row kernel does not run on this CPU (neither AVX-512 BF16 nor AVX2)")
    monkeypatch.setattr(fused, "_pack", lambda weight, bias: None)
    lin = torch.nn.Linear(64, 40).to(torch.bfloat16)
    group = fused._Group([lin])
    assert group.packed is None and group.kernel is not None
    g = torch.Generator().manual_seed(4)
    for m in (1, 6, few_rows.ROWS, 20, fused.KERNEL_MAX_ROWS, fused.KERNEL_MAX_ROWS + 1, 100):
        x = torch.randn(2, m, 64, generator=g).to(torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
        got = group._matmul(x)
        assert got.shape == (2, m, 40) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), ref, atol=1e-2, rtol=2 ** -8)
        if 2 * m <= fused.KERNEL_MAX_ROWS:  # the kernel: a row's bits whatever else is in the call
            assert torch.equal(group._matmul(x[:1, :1]), got[:1, :1])
