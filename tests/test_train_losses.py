"""Losses against references computed another way (values and gradients), masking, padding."""

import pytest
import torch

from drafterkit.train import losses

V = 11


def _logits(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, V, generator=g) * 2.0)


def _ref_per_token(name, d, t, temp, beta=0.5):
    """Explicit per-row loops with torch.distributions (a different route from train.losses)."""
    from torch.distributions import Categorical, kl_divergence

    out = []
    for i in range(d.shape[0]):
        q = Categorical(logits=d[i] / temp)
        p = Categorical(logits=t[i] / temp)
        pp, qq = p.probs, q.probs
        if name == "fkl":
            out.append(kl_divergence(p, q))
        elif name == "rkl":
            out.append(kl_divergence(q, p))
        elif name == "jsd":
            m = Categorical(probs=beta * pp + (1 - beta) * qq)
            out.append(beta * kl_divergence(p, m) + (1 - beta) * kl_divergence(q, m))
        elif name in ("tvd", "alpha"):
            acc = sum(min(pp[x], qq[x]) for x in range(V))
            out.append(1 - acc if name == "alpha" else 0.5 * sum(abs(pp[x] - qq[x]) for x in range(V)))
        elif name == "neg_log_alpha":
            out.append(-torch.log(sum(min(pp[x], qq[x]) for x in range(V))))
    return torch.stack(out)


@pytest.mark.parametrize("name", ["fkl", "rkl", "jsd", "tvd", "alpha", "neg_log_alpha"])
@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_distribution_losses_match_reference_values_and_grads(name, temp):
    d = _logits(0, 2, 5).requires_grad_(True)
    t = _logits(1, 2, 5)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    fn = losses.DISTRIBUTION_LOSSES[name]
    kw = {"beta": 0.3} if name == "jsd" else {}
    loss, metrics = fn(d, t, mask, temp, **kw)
    (g,) = torch.autograd.grad(loss, d)

    d2 = d.detach().clone().requires_grad_(True)
    rows = mask.nonzero(as_tuple=True)
    ref = _ref_per_token(name, d2[rows], t[rows], temp, beta=0.3).mean()
    (g2,) = torch.autograd.grad(ref, d2)
    assert torch.allclose(loss, ref, atol=1e-5), (float(loss.detach()), float(ref))
    assert torch.allclose(g, g2, atol=1e-5)
    assert g[~mask].abs().max() == 0  # masked positions get exactly zero gradient
    assert metrics["tokens"] == mask.sum()


def test_ce_matches_cross_entropy_and_ignores_minus_100():
    d = _logits(2, 3, 4).requires_grad_(True)
    labels = torch.tensor([[1, -100, 3, 4], [-100, -100, 0, 2], [5, 6, 7, -100]])
    loss, m = losses.ce_loss(d, labels)
    ref = torch.nn.functional.cross_entropy(d.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    assert torch.allclose(loss, ref, atol=1e-6)
    (g,) = torch.autograd.grad(loss, d)
    assert g[labels == -100].abs().max() == 0
    assert m["tokens"] == 8


def test_fully_masked_batch_is_finite_zero_with_zero_grads():
    d = _logits(3, 2, 3).requires_grad_(True)
    t = _logits(4, 2, 3)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for fn in losses.DISTRIBUTION_LOSSES.values():
        loss, _ = fn(d, t, mask)
        (g,) = torch.autograd.grad(loss, d)
        assert torch.isfinite(loss) and float(loss.detach()) == 0.0 and g.abs().max() == 0
    loss, _ = losses.ce_loss(d, torch.full((2, 3), -100))
    assert float(loss.detach()) == 0.0


def test_padding_leaves_losses_unchanged():
    d, t = _logits(5, 1, 6), _logits(6, 1, 6)
    mask = torch.tensor([[0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    pad_d = torch.cat([d, _logits(7, 1, 4)], 1)  # 4 padding positions with junk logits
    pad_t = torch.cat([t, _logits(8, 1, 4)], 1)
    pad_mask = torch.cat([mask, torch.zeros(1, 4, dtype=torch.bool)], 1)
    for name, fn in losses.DISTRIBUTION_LOSSES.items():
        a, _ = fn(d, t, mask)
        b, _ = fn(pad_d, pad_t, pad_mask)
        assert torch.allclose(a, b, atol=1e-7), name


def test_alpha_equals_one_minus_tvd_and_is_one_for_identical_logits():
    d, t = _logits(9, 7), _logits(10, 7)
    a = losses.acceptance_probability(d, t)
    tvd, _ = losses.tvd_loss(d, t)
    assert torch.allclose(1 - a.mean(), tvd, atol=1e-6)
    assert torch.allclose(losses.acceptance_probability(t, t), torch.ones(7), atol=1e-6)


def test_expected_accept_length_worked_by_hand():
    # chain 1: 0.5, 0.5, 1.0 -> 0.5 + 0.25 + 0.25 = 1.0 ; chain 2: 1, 1, 1 -> 3 ; chain 3: 0.9, 0, 0.8 -> 0.9
    alphas = torch.tensor([[0.5, 0.5, 1.0], [1.0, 1.0, 1.0], [0.9, 0.0, 0.8]], requires_grad=True)
    exp = losses.expected_accept_length(alphas)
    assert torch.allclose(exp, torch.tensor([1.0, 3.0, 0.9]))
    loss, m = losses.accept_length_loss(alphas)
    assert abs(float(loss.detach()) - (1 - (1.0 + 3.0 + 0.9) / 3 / 3)) < 1e-6
    assert abs(m["expected_accept_len"] - 4.9 / 3) < 1e-6
    (g,) = torch.autograd.grad(loss, alphas)
    # dE/da1 = 1 + a2 + a2 a3 ; dE/da2 = a1 + a1 a3 ; dE/da3 = a1 a2 ; loss = 1 - mean(E)/K
    a = alphas.detach()
    dE = torch.stack([1 + a[:, 1] + a[:, 1] * a[:, 2], a[:, 0] + a[:, 0] * a[:, 2], a[:, 0] * a[:, 1]], 1)
    assert torch.allclose(g, -dE / 3 / 3, atol=1e-6)


def test_accept_length_step_mask_ends_chain_with_zero_grad_after():
    alphas = torch.tensor([[0.5, 0.5, 0.5]], requires_grad=True)
    step_mask = torch.tensor([[True, False, True]])  # step 2 dead -> step 3 dead too
    exp = losses.expected_accept_length(alphas, step_mask)
    assert torch.allclose(exp, torch.tensor([0.5]))
    (g,) = torch.autograd.grad(exp.sum(), alphas)
    assert g[0, 1] == 0 and g[0, 2] == 0 and g[0, 0] == 1


def test_alpha_step_metrics_count_the_chains_alive_at_that_step_as_the_loss_does():
    """A chain whose step 2 is dead never reaches step 3, even where its mask is True there: alpha_step3
    averages over the chains the loss counts at step 3 (the cumulative mask), not the raw step mask."""
    alphas = torch.tensor([[0.5, 0.4, 0.9], [0.6, 0.7, 0.2]])
    step_mask = torch.tensor([[True, False, True], [True, True, True]])
    _, m = losses.accept_length_loss(alphas, step_mask)
    assert m["alpha_step1"] == pytest.approx(0.55) and m["alpha_step2"] == pytest.approx(0.7)
    assert m["alpha_step3"] == pytest.approx(0.2)  # chain 1 is dead there: 0.55 counted it
    assert m["expected_accept_len"] == pytest.approx((0.5 + (0.6 + 0.42 + 0.084)) / 2)


def test_shape_and_temperature_errors_are_clear():
    with pytest.raises(ValueError, match="differ"):
        losses.fkl_loss(_logits(0, 3), _logits(0, 4))
    with pytest.raises(ValueError, match="temperature"):
        losses.fkl_loss(_logits(0, 3), _logits(1, 3), temperature=0.0)
    with pytest.raises(ValueError, match="mask shape"):
        losses.fkl_loss(_logits(0, 2, 3), _logits(1, 2, 3), torch.ones(3, 2, dtype=torch.bool))


@pytest.mark.parametrize("scale,decay", [(1.0, 1.0), (0.6, 3.0)])
def test_lk_lambda_blends_kl_and_rejection_by_a_weight_that_follows_acceptance(scale, decay):
    """LK-lambda against a per-row reference: lam = scale * exp(-decay * mean alpha), the mean without gradient."""
    from torch.distributions import Categorical, kl_divergence

    d = _logits(2, 2, 5).requires_grad_(True)
    t = _logits(3, 2, 5)
    mask = torch.tensor([[1, 0, 1, 1, 1], [1, 1, 0, 0, 1]], dtype=torch.bool)
    loss, metrics = losses.lk_lambda_loss(d, t, mask, 1.0, scale=scale, decay=decay)
    (g,) = torch.autograd.grad(loss, d)

    d2 = d.detach().clone().requires_grad_(True)
    rows = mask.nonzero(as_tuple=True)
    p, q = Categorical(logits=t[rows]), Categorical(logits=d2[rows])
    alpha = torch.minimum(p.probs, q.probs).sum(-1)
    lam = scale * torch.exp(-decay * alpha.mean().detach())
    ref = (lam * kl_divergence(p, q) + (1 - lam) * (1 - alpha)).mean()
    (g2,) = torch.autograd.grad(ref, d2)
    assert torch.allclose(loss, ref, atol=1e-5) and torch.allclose(g, g2, atol=1e-5)
    assert metrics["lk_weight"] == pytest.approx(float(lam), rel=1e-5)
    assert g[~mask].abs().max() == 0
    # at identical distributions alpha = 1 and KL = 0: the loss is 0 whatever the weight
    same, _ = losses.lk_lambda_loss(t, t, mask, 1.0, scale=scale, decay=decay)
    assert float(same) == pytest.approx(0.0, abs=1e-6)


def test_lk_lambda_settings_come_from_the_recipe_and_bad_ones_are_refused():
    from drafterkit.train.recipe import RecipeError, recipe_from_dict

    raw = {"output_dir": "o", "target": {"name_or_path": "t"}, "drafter": {"kind": "medusa"},
           "data": {"source": "jsonl", "path": "d.jsonl"}, "loss": {"name": "lk_lambda", "lk_decay": 2.0}}
    cfg = recipe_from_dict(raw).loss
    d, t = _logits(4, 3, 4), _logits(5, 3, 4)
    via_cfg, m = losses.distribution_loss("lk_lambda", d, t, None, cfg)
    direct, _ = losses.lk_lambda_loss(d, t, None, cfg.temperature, scale=1.0, decay=2.0)
    assert torch.equal(via_cfg, direct) and m["lk_weight"] < 1.0
    with pytest.raises(RecipeError, match="lk_scale"):
        recipe_from_dict({**raw, "loss": {"name": "lk_lambda", "lk_scale": 1.5}})


def test_the_head_kinds_chain_loss_trains_lk_lambda_at_every_drafting_position():
    from drafterkit.train.recipe import recipe_from_dict
    from drafterkit.train.strategies.heads import chain_loss

    cfg = recipe_from_dict({"output_dir": "o", "target": {"name_or_path": "t"}, "drafter": {"kind": "eagle3"},
                            "data": {"source": "jsonl", "path": "d.jsonl"},
                            "loss": {"weights": {"lk_lambda": 1.0, "ce": 0.5}}}).loss
    drafts = [_logits(10 + j, 4).requires_grad_(True) for j in range(3)]
    targets = [_logits(20 + j, 4) for j in range(3)]
    labels = [torch.tensor([1, 2, -100, 3]), torch.tensor([1, -100, -100, 3]), torch.tensor([-100, -100, -100, 3])]
    loss, metrics = chain_loss(drafts, targets, labels, [1.0, 0.8, 0.64], cfg)
    loss.backward()
    assert {"lk_lambda_step0", "lk_lambda_step2", "ce_step1", "lk_weight_step0", "lk_weight_step2"} <= metrics.keys()
    assert 0 < metrics["lk_weight_step0"] <= 1
    expected = sum(w * losses.lk_lambda_loss(d.detach(), t, y != -100)[0] * int((y != -100).sum()) / 4
                   for w, d, t, y in zip([1.0, 0.8, 0.64], drafts, targets, labels))
    assert metrics["lk_lambda_step0"] + metrics["lk_lambda_step1"] * 0.8 + metrics["lk_lambda_step2"] * 0.64 \
        == pytest.approx(float(expected), rel=1e-5)
    assert all(d.grad is not None and d.grad[2].abs().sum() == 0 for d in drafts)  # row 2 is never supervised


def test_dpace_weights_are_suffix_sums_of_smoothed_confidence_products_worked_by_hand():
    from drafterkit.train.strategies.heads import dpace_weights

    q = torch.tensor([[0.8, 0.5, 0.2], [0.9, 0.9, 0.9]])
    valid = torch.tensor([[True, True, True], [True, False, True]])
    w = dpace_weights(-torch.log(q), valid, alpha=0.5)
    r = 0.5 * q + 0.5  # smoothed confidence
    a = r[0, 0]
    b = a * r[0, 1]
    c = b * r[0, 2]
    assert torch.allclose(w[0], torch.stack([a + b + c, b + c, c]), atol=1e-6)
    # the second chain ends at its unsupervised step: only its first step counts, by its own reach
    assert torch.allclose(w[1], torch.tensor([float(r[1, 0]), 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(dpace_weights(-torch.log(q), torch.ones_like(valid), 1.0), torch.tensor([[3.0, 2, 1]] * 2))


def test_dpace_replaces_the_fixed_step_decay_of_the_ce_term_and_is_refused_where_it_cannot_apply():
    from drafterkit.train.recipe import RecipeError, recipe_from_dict
    from drafterkit.train.strategies.heads import chain_loss, dpace_weights

    raw = {"output_dir": "o", "target": {"name_or_path": "t"}, "drafter": {"kind": "medusa"},
           "data": {"source": "jsonl", "path": "d.jsonl"},
           "loss": {"name": "ce", "ce_labels": "data", "position_weights": "dpace", "dpace_alpha": 0.5}}
    cfg = recipe_from_dict(raw).loss
    drafts = [_logits(30 + j, 4).requires_grad_(True) for j in range(3)]
    targets = [_logits(40 + j, 4) for j in range(3)]
    labels = [torch.tensor([1, 2, -100, 3]), torch.tensor([4, -100, -100, 3]), torch.tensor([5, 6, -100, 3])]
    loss, metrics = chain_loss(drafts, targets, labels, [1.0, 0.8, 0.64], cfg)
    loss.backward()
    ce = torch.stack([torch.nn.functional.cross_entropy(d.detach(), y.clamp_min(0), reduction="none")
                      for d, y in zip(drafts, labels)], 1)
    valid = torch.stack([y != -100 for y in labels], 1)
    w = dpace_weights(ce, valid, 0.5)
    assert float(loss) == pytest.approx(float((w * ce * valid).sum() / 4), rel=1e-5)  # not the 0.8 ** j decay
    assert drafts[2].grad[1].abs().sum() == 0  # row 1's chain ended at step 1: its step 2 never counts
    assert {"dpace_weight_step0", "ce_step2"} <= metrics.keys()
    with pytest.raises(RecipeError, match="no ce term"):
        recipe_from_dict({**raw, "loss": {"name": "fkl", "position_weights": "dpace"}})
    with pytest.raises(RecipeError, match="draft_lm"):
        recipe_from_dict({**raw, "drafter": {"kind": "draft_lm"}})
