"""Training strategies: one per drafter kind, all with the interface of :class:`Strategy`
(``train.strategies.base``, where the contract between a strategy and the loop is written).

Add a kind by writing ``train/strategies/<kind>.py`` with a class following :class:`Strategy` (and
:class:`FeatureStrategy` if it trains from target features) and naming it, with the kind's options model and
recipe check, in the kind's line of ``train.options.KINDS``; :func:`get_strategy` imports the module on first
use.
"""

from __future__ import annotations

import importlib
from functools import cache

from drafterkit.train.options import KINDS
from drafterkit.train.strategies.base import FeatureStrategy, OnPolicyStrategy, Strategy, check_common_batch, unwrap


@cache
def get_strategy(kind: str) -> Strategy:
    """The strategy for drafter ``kind`` (one instance per kind): the class ``train.options.KINDS[kind]``
    names in ``drafterkit.train.strategies.<kind>``. Raises ``ValueError`` listing the trainable kinds."""
    if kind not in KINDS:
        raise ValueError(f"no training strategy for drafter kind {kind!r}; trainable kinds: {sorted(KINDS)}")
    return getattr(importlib.import_module(f"drafterkit.train.strategies.{kind}"), KINDS[kind].strategy)()


__all__ = ["FeatureStrategy", "OnPolicyStrategy", "Strategy", "check_common_batch", "get_strategy", "unwrap"]
