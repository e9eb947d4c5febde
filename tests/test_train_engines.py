"""The training loop's two interfaces: every trainable kind's strategy implements the :class:`Strategy` protocol
(and :class:`FeatureStrategy` exactly where the kind reads target features, :class:`OnPolicyStrategy` exactly
where the recipe layer lets it train on-policy batches), and ``make_engine`` picks the engine a run's sharding
asks for and names it. The engines' numerics (one process, DDP, FSDP2 and ZeRO giving one update) are checked by
tests/test_train_loop.py, tests/test_train_fsdp.py and tests/test_train_deepspeed.py."""

from __future__ import annotations

import pytest
import torch

from drafterkit.train.options import KINDS
from drafterkit.train.strategies import FeatureStrategy, OnPolicyStrategy, Strategy, get_strategy


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_strategy_implements_the_protocols_its_kind_claims(kind):
    strategy = get_strategy(kind)
    assert isinstance(strategy, Strategy), f"{kind}: {type(strategy).__name__} lacks a Strategy method"
    assert strategy.kind == kind and strategy.options_model is KINDS[kind].options_model
    assert isinstance(strategy, FeatureStrategy) == KINDS[kind].reads_features, \
        f"{kind}: feature_layers present iff the kind reads target features"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_only_an_on_policy_strategy_passes_validation_with_on_policy_batches(kind, tmp_path):
    from drafterkit.train.recipe import RecipeError, recipe_from_dict

    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    raw = {"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "none")},
           "drafter": {"kind": kind}, "data": {"source": "jsonl", "path": str(data), "on_policy_fraction": 0.5},
           "logging": {"trackers": []}}
    try:
        recipe_from_dict(raw)
        accepted = True
    except RecipeError as exc:
        accepted = False
        assert "on_policy_fraction" in str(exc)
    assert accepted == isinstance(get_strategy(kind), OnPolicyStrategy)


def test_a_one_process_run_trains_through_accelerate_and_says_so():
    from accelerate import Accelerator

    from drafterkit.train.distributed import AccelerateEngine, make_engine
    from drafterkit.train.recipe import recipe_from_dict

    recipe = recipe_from_dict({"output_dir": "unused", "target": {"name_or_path": "unused"},
                               "drafter": {"kind": "draft_lm"}, "data": {"source": "jsonl", "path": "unused"}})
    acc = Accelerator(cpu=True)
    layer = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    engine = make_engine(recipe, acc, layer, None, opt, list(layer.parameters()))
    assert isinstance(engine, AccelerateEngine) and engine.name == "one process"
    with engine.sync(True):
        loss = layer(torch.ones(1, 2)).sum()
    engine.backward(loss, True)
    before = layer.weight.detach().clone()
    norm = engine.step(max_norm=0.5)  # the gradient is (1, 1): norm sqrt(2), clipped to 0.5
    assert norm == pytest.approx(2 ** 0.5)
    assert torch.allclose(before - layer.weight.detach(), torch.full((1, 2), 0.5 / 2 ** 0.5))
    assert all(p.grad is None for p in layer.parameters())
