"""The decoding setting ``drafterkit tune`` chose for a drafter, read back from its folder.

``drafterkit tune`` (``speceval.tune``) writes a ``tuned`` entry into the drafter folder's
``decoding.json`` (the format is described in ``speceval.recorded``): per concurrency the winning
``{"tree", "k", "draft_threshold", "speedup", ...}`` and the machine it was measured on. A setting
measured on another machine is not a measurement of this one, so it applies only where the machine
matches (``assets.device.machine_matches``: CPU model, cores, threads, device), and only while the
folder holds the weights it was measured with (the record's ``weights_sha256``).

:func:`drafters.load_drafter` attaches the result to the drafter it loads as ``tuned_decoding`` (the
batch-size-1 winner, or ``None``) and ``tuned_note`` (why, or why not), which is how
``decode.generate(..., tree="auto")`` finds it without the decoder reading files.

The same drafter behind prompt lookup (``PATH+ngram``) or lookup + retrieval (``PATH+rest``,
``drafters.lookup.hybrid.LookupHybrid``) is another proposer with its own best shape (lookup proposes long
single continuations, so a chain can beat the tree the head alone prefers): ``drafterkit tune PATH+rest``
records it under its own key, ``tuned+rest`` (:func:`tuned_key`), beside the drafter's ``tuned``.
"""

from __future__ import annotations

import json
from pathlib import Path

from drafterkit.assets.device import host_info, machine_matches
from drafterkit.drafters.base import weights_sha256

DECODING_FILE = "decoding.json"
TUNED = "tuned"
#: spec suffixes that put a drafter behind prompt lookup (``+ngram``), lookup + retrieval (``+rest``) or suffix
#: decoding (``+suffix``, ``drafters.lookup.suffix_hybrid.SuffixHybrid``)
LOOKUP_SUFFIXES = ("+ngram", "+rest", "+suffix")


def tuned_key(behind: str = "") -> str:
    """The ``decoding.json`` key of a tuned entry: ``"tuned"`` for the drafter alone, ``"tuned+rest"`` /
    ``"tuned+ngram"`` for it behind lookup (``behind``: ``""`` or one of :data:`LOOKUP_SUFFIXES`).

    Raises:
        ValueError: another ``behind``."""
    if behind and behind not in LOOKUP_SUFFIXES:
        raise ValueError(f"no tuned entry for {behind!r}: use '' or one of {', '.join(LOOKUP_SUFFIXES)}")
    return TUNED + behind


#: the start of :func:`tuned_winner`'s reason when the tuned setting is used, and of the one when there is none
TUNED_HERE = "tuned by drafterkit tune on this machine"
NO_TUNED = "no tuned setting"
#: why a setting ``drafterkit tune`` kept but measured slower than plain decoding is left unused
SLOWER_NOT_USED = "a setting slower than plain decoding is not used by eval or tree='auto'"


def beats_plain(winner: dict) -> bool:
    """Whether a tuned winner measured faster than plain decoding (a record without ``speedup`` counts as yes):
    the setting a search keeps can still be a slowdown, and a slowdown is never used as the drafter's setting."""
    return float(winner.get("speedup", 2.0)) > 1.0


def setting_label(setting: dict) -> str:
    """``chain K=3 @0.1`` / ``tree=3,2,1 @0.1`` / ``tree=dynamic:24:5:4``: the name ``drafterkit tune`` gives a
    ``{"tree", "k", "draft_threshold"}`` setting (threshold 0 left out)."""
    shape = f"chain K={setting['k']}" if setting["tree"] == "chain" else f"tree={setting['tree']}"
    threshold = float(setting.get("draft_threshold") or 0.0)
    return f"{shape} @{threshold:g}" if threshold else shape


def search_outcome(winner: dict) -> str:
    """What ``drafterkit tune``'s search at one concurrency kept, in words, from its ``winners`` entry: the
    setting, its speedup over plain decoding (and tau), and, against an incumbent (``over_incumbent``), the
    last rung's fastest challenger, its speedup and whether it beat the incumbent beyond the noise. No setting
    is called the best: a kept incumbent can be slower than a challenger that did not clear the noise."""
    speed = f"{float(winner['speedup']):.2f}x plain decoding" if "speedup" in winner else "speedup not recorded"
    speed += f", tau {float(winner['tau']):.2f}" if "tau" in winner else ""
    duel = winner.get("over_incumbent")
    if not isinstance(duel, dict):
        slow = "" if beats_plain(winner) else ": no setting faster than plain decoding there"
        return f"{setting_label(winner)} is chosen ({speed}), the fastest in the last rung{slow}"
    n = int(duel.get("batches", 0))
    low = duel.get("low")
    noise = f"{float(duel['ratio']):.2f}x its tokens/s" + (f", 95% lower bound {low:.2f}x" if low is not None
                                                           else "; one batch is too few to tell")
    on = f"on {n} batch{'' if n == 1 else 'es'} ({noise})"
    challenger, theirs = duel["challenger"], duel.get("challenger_speedup")
    if winner.get("chosen") == "challenger":
        mine = duel.get("incumbent_speedup")
        against = f" ({mine:.2f}x)" if mine is not None else ""
        return (f"{challenger} ({speed}) replaces the incumbent {duel['incumbent']}{against}: faster than it "
                f"beyond the noise {on}")
    if theirs is None:
        measured = f"{challenger} was"
    else:
        faster = "speedup" in winner and float(theirs) > float(winner["speedup"])
        measured = f"{challenger} measured {float(theirs):.2f}x {'but' if faster else 'and'} was"
    return f"the incumbent {duel['incumbent']} is kept ({speed}): {measured} not faster than it beyond the noise {on}"


def tuned_winner(data: dict, current: dict, concurrency: int = 1,
                 folder: str | Path | None = None, key: str = TUNED) -> tuple[dict | None, str]:
    """``(winner, why)``: ``data[key]``'s (default ``data["tuned"]``) winner at ``concurrency``
    (``{"tree", "k", "draft_threshold", "dtype", "exact_mode", ...}``; ``exact_mode`` None in a record written
    before tune recorded it) when its machine matches ``current``
    (``assets.device.host_info``) and, given the drafter ``folder``, its ``model.safetensors`` still holds
    the weights tune measured (``weights_sha256`` of the record), else ``None``; ``why`` says which and why."""
    tuned = data.get(key) if isinstance(data, dict) else None
    winners = tuned.get("winners") if isinstance(tuned, dict) else None
    if not isinstance(winners, dict) or str(concurrency) not in winners:
        spec = "the drafter folder" if key == TUNED else f"PATH{key.removeprefix(TUNED)}"
        return None, f"{NO_TUNED} (run drafterkit tune on {spec})"
    if folder is not None and tuned.get("weights_sha256"):
        try:
            same = weights_sha256(folder) == tuned["weights_sha256"]
        except OSError:
            same = False
        if not same:
            return None, (f"its tuned setting was measured on other weights ({folder}/model.safetensors changed "
                          "since drafterkit tune ran, e.g. training resumed into this folder): not used; tune again")
    recorded = tuned.get("machine") or {}
    differ = machine_matches(recorded, current)
    if differ and all(d.startswith("threads ") for d in differ):
        return None, (f"its tuned setting was measured with {recorded.get('threads')} torch threads and this "
                      f"process runs {current.get('threads')} (OMP_NUM_THREADS / torch.set_num_threads): the "
                      "speedup depends on them, so it is not used; run with the same threads or tune again")
    if differ:
        return None, f"its tuned setting was measured on another machine ({'; '.join(differ)}): not used"
    w = dict(winners[str(concurrency)], dtype=tuned.get("dtype", "fp32"), exact_mode=tuned.get("exact_mode"))
    if not beats_plain(w):
        return None, (f"its tuned setting is not used, being slower than plain decoding on this machine; from "
                      f"drafterkit tune: {search_outcome(w)}")
    speed = f", {w['speedup']:.2f}x plain decoding on its tuning prompts" if "speedup" in w else ""
    return w, f"{TUNED_HERE} ({tuned.get('created')}{speed})"


def read_tuned(folder: str | Path, device="auto", behind: str = "") -> tuple[dict | None, str]:
    """:func:`tuned_winner` at batch size 1 of ``folder/decoding.json`` for this machine, for the drafter alone
    or (``behind``: ``"+rest"`` / ``"+ngram"``) behind lookup; a missing or unreadable file gives ``(None,
    why)``, never an error."""
    data, why = _decoding(folder)
    if data is None:
        return None, why
    return tuned_winner(data, host_info(device), folder=folder, key=tuned_key(behind))


def has_tuned(folder: str | Path, behind: str = "") -> bool:
    """Whether ``folder/decoding.json`` holds a tuned entry for ``behind`` at all (usable here or not)."""
    data, _ = _decoding(folder)
    return isinstance(data, dict) and isinstance(data.get(tuned_key(behind)), dict)


def _decoding(folder: str | Path) -> tuple[dict | None, str]:
    path = Path(folder) / DECODING_FILE
    if not path.is_file():
        return None, f"no {DECODING_FILE} in {folder} (run drafterkit tune on it)"
    try:
        return json.loads(path.read_text()), ""
    except (OSError, ValueError) as exc:
        return None, f"{path} is not readable JSON ({exc})"
