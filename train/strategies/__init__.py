"""Training strategies: one per drafter kind, all with the interface of :class:`Strategy`
(``train.strategies.base``, where the contract between a strategy and the loop is written).

Add a kind by writing ``train/strategies/<kind>.py`` with a class following :class:`Strategy` (and
:class:`FeatureStrategy` if it trains from target features) and naming it, with the kind's options model and
recipe check, in the kind's line of ``train.options.KINDS`` (a kind outside the package: its
:func:`register_kind` call, the class as ``"module:Class"``); :func:`get_strategy` imports the module on first
use.
"""

from __future__ import annotations

import importlib
from functools import cache

from drafterkit.train.options import KINDS, KindRecipe
from drafterkit.train.strategies.base import FeatureStrategy, OnPolicyStrategy, Strategy, check_common_batch, unwrap


@cache
def get_strategy(kind: str) -> Strategy:
    """The strategy for drafter ``kind`` (one instance per kind): the class ``train.options.KINDS[kind]``
    names, in ``drafterkit.train.strategies.<kind>`` or as ``"module:Class"``. Raises ``ValueError`` listing the
    trainable kinds."""
    if kind not in KINDS:
        raise ValueError(f"no training strategy for drafter kind {kind!r}; trainable kinds: {sorted(KINDS)}")
    where, _, name = KINDS[kind].strategy.rpartition(":")
    return getattr(importlib.import_module(where or f"drafterkit.train.strategies.{kind}"), name)()



def register_kind(kind: str, spec: KindRecipe) -> KindRecipe:
    """Add the training line (``train.options.KINDS``) of a kind defined outside the package; its drafter side is
    ``drafters.kinds.register_kind``. Returns ``spec``. Raises ``ValueError`` if ``kind`` has one."""
    if kind in KINDS:
        raise ValueError(f"drafter kind {kind!r} already has a training line")
    KINDS[kind] = spec
    return spec


def unregister_kind(kind: str) -> None:
    """Remove what :func:`register_kind` added, and its cached strategy (a test's cleanup)."""
    KINDS.pop(kind, None)
    get_strategy.cache_clear()


__all__ = ["FeatureStrategy", "OnPolicyStrategy", "Strategy", "check_common_batch", "get_strategy", "register_kind",
           "unregister_kind", "unwrap"]
