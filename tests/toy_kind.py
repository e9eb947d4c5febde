"""A toy drafter kind defined outside the package, registered at runtime by ``tests/test_kind_registry.py``:
everything drafterkit knows of it comes from its two registry entries (:data:`KIND`, :data:`TRAINING`).

The drafter is a one-layer feature head: at position ``t`` it reads the target's final-norm state ``f_t``
(``hidden_states[L][t]``) and the token ``t + 1`` and predicts the next state, ``f'_{t+1} = f_t + fc([embed(token
t+1); f_t])``, whose logits under the target's frozen LM head predict token ``t + 2``; a chain feeds each draft
token and predicted state back in. Its one export format, ``toy-plain``, is its weights and config under a
serving-style ``config.json``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn

from drafterkit.decode.protocol import Proposal
from drafterkit.drafters.base import Drafter
from drafterkit.drafters.heads.feature_head import borrow
from drafterkit.drafters.kinds import ExportFormat, Kind
from drafterkit.train.data import shift_for_next_token
from drafterkit.train.features import batch_features
from drafterkit.train.options import KindRecipe
from drafterkit.train.strategies.base import unwrap
from drafterkit.train.strategies.heads import (FeatureHeadStrategy, chain_loss, feature_store, shifted_rows,
                                              trainable_own)


@dataclass
class ToyConfig:
    vocab_size: int
    hidden_size: int
    target_num_layers: int


class ToyDrafter(Drafter):
    kind = "toy"
    config_class = ToyConfig
    borrowed_prefixes = ("embed.", "lm_head.")

    def __init__(self, config: ToyConfig, target: nn.Module | None = None):
        super().__init__(config)
        self.embed, self.lm_head = borrow(target, config, self.kind)
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.feature_layers = (config.target_num_layers,)

    def step(self, ids: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """``ids [...]``, ``feats [..., H]`` (the state before each token) -> the predicted next state ``[..., H]``."""
        return feats + self.fc(torch.cat([self.embed(ids).to(feats.dtype), feats], -1))

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, T]``, ``features [B, T, H]`` -> ``[B, T, H]``: row ``t`` predicts ``f_{t+1}`` from
        ``(token t + 1, f_t)``; the last row is garbage."""
        return self.step(input_ids.roll(-1, dims=1), features)

    @torch.no_grad()
    def propose(self, state, k, sampling, generator) -> Proposal:
        ids = torch.tensor([row[-1] for row in state.tokens], device=self.fc.weight.device)  # [B]
        feats = torch.stack([f[-1] for f in state.features]).to(self.fc.weight)  # [B, H]: f at the last-but-one
        drafts = []
        for _ in range(k):
            feats = self.step(ids, feats)
            logits = self.lm_head(feats.to(self.lm_head.weight.dtype))[:, :state.vocab_size]  # [B, V']
            ids = logits.argmax(-1)
            drafts.append(ids)
        tokens = torch.stack(drafts, 1)  # [B, k]
        return Proposal(tokens=tokens, probs=F.one_hot(tokens, state.vocab_size).float())  # q: a point mass


def card_line(cfg: dict, export_config: dict | None) -> str:
    return f"toy: one linear layer over the target's last hidden state ({cfg['hidden_size']} wide)"


def write_plain(ckpt: Path, out: Path, dtype, *, fmt: str, target: str | None, recorded: str | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(ckpt) / "model.safetensors", out / "model.safetensors")
    cfg = json.loads((Path(ckpt) / "config.json").read_text())["config"]
    config = {"architectures": ["ToyHead"], **cfg, "drafterkit": {"kind": "toy", "target": recorded}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


class ToyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    noise: float = 0.0


class ToyStrategy(FeatureHeadStrategy):
    kind = "toy"
    options_model = ToyOptions

    def build(self, recipe, target, tokenizer):
        c = target.config
        return trainable_own(ToyDrafter(ToyConfig(c.vocab_size, c.hidden_size, c.num_hidden_layers), target), target)

    def loss(self, drafter, target, batch, recipe):
        self.refuse_on_policy(batch)
        d = unwrap(drafter)
        f = batch_features(target, batch, d.feature_layers, feature_store(recipe))  # [B, T, H]
        labels = shift_for_next_token(batch)  # [B, T]: token t + 1
        starts = torch.nonzero(labels[:, 1:] != -100, as_tuple=True)  # rows whose token t + 2 is supervised
        pred = drafter(batch["input_ids"], f)[starts]  # [N, H]
        w = d.lm_head.weight
        with torch.no_grad():
            target_rows = shifted_rows(f, starts, 1) @ w.t()  # the target's logits for token t + 2
        return chain_loss([pred @ w.t()], [target_rows], [shifted_rows(labels, starts, 1, fill=-100)], [1.0],
                          recipe.loss)


KIND = Kind("toy", "ToyDrafter", "ToyConfig", module=__name__, reads_features=True, title="Toy head",
            card_line="card_line", formats=(ExportFormat("toy-plain", f"{__name__}:write_plain", "drafterkit"),))
TRAINING = KindRecipe(ToyOptions, f"{__name__}:ToyStrategy", True)
