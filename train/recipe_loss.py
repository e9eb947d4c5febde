"""The recipe's ``loss`` section (``train.recipe.Recipe.loss``): which training objective, its settings, and
how a chained kind weighs its drafting positions. The losses themselves: :mod:`train.losses`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: every recipe section's pydantic settings: unknown keys refused, assignments validated
SECTION_CONFIG = ConfigDict(extra="forbid", validate_assignment=True)

LOSS_NAMES = ("ce", "fkl", "rkl", "jsd", "tvd", "alpha", "neg_log_alpha", "lk_lambda", "accept_len")


class LossSection(BaseModel):
    model_config = SECTION_CONFIG

    name: Literal["ce", "fkl", "rkl", "jsd", "tvd", "alpha", "neg_log_alpha", "lk_lambda", "accept_len"] = "fkl"
    temperature: float = Field(1.0, gt=0.0)  # for p and q; match the decoding temperature (>0)
    jsd_beta: float = Field(0.5, gt=0.0, lt=1.0)
    lk_scale: float = Field(1.0, gt=0.0, le=1.0)  # lk_lambda's KL weight at zero acceptance (train.losses)
    lk_decay: float = Field(1.0, ge=0.0)  # how fast lk_lambda's KL weight falls as acceptance rises
    # how a chained kind weighs its drafting positions' ce term: the kind's fixed decay, or D-PACE's weights from
    # the drafter's own confidence (train.strategies.heads.dpace_weights); dpace_alpha smooths that confidence
    position_weights: Literal["fixed", "dpace"] = "fixed"
    dpace_alpha: float = Field(0.5, gt=0.0, le=1.0)
    ce_labels: Literal["target", "data"] = "target"  # ce on the target's argmax, or on the data tokens
    draft_steps: int = Field(4, ge=1, le=16)  # K of the accept_len objective
    weights: dict[str, float] | None = None  # optional mix, e.g. {fkl: 1.0, ce: 0.1}; overrides name

    @field_validator("weights")
    @classmethod
    def _known_losses(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        bad = sorted(set(v) - set(LOSS_NAMES))
        if bad:
            raise ValueError(f"unknown loss names {bad} in loss.weights; valid names: {list(LOSS_NAMES)}")
        if not v or any(w < 0 for w in v.values()) or sum(v.values()) <= 0:
            raise ValueError("loss.weights must be non-negative with a positive sum")
        return v

    @model_validator(mode="after")
    def _dpace_needs_ce(self):
        if self.position_weights == "dpace" and "ce" not in self.terms():
            raise ValueError("loss.position_weights: dpace weighs the ce term's drafting positions (D-PACE is "
                             "defined on cross-entropy) and this recipe's loss has no ce term; add it (loss.name: "
                             "ce, or ce in loss.weights) or set loss.position_weights: fixed")
        return self

    def terms(self) -> dict[str, float]:
        """Loss name -> weight (``{name: 1.0}`` unless ``weights`` is set)."""
        return dict(self.weights) if self.weights else {self.name: 1.0}
