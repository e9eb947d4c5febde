"""train.evaluate decodes as ``drafterkit eval`` does: exact mode, one uncounted warm-up call, and on a CPU whose
cores other processes keep busy, only the torch threads that fit beside them.

The root cause these tests guard: an evaluation inside ``drafterkit train`` decoded a tiny target at 3-6 tokens/s
where ``drafterkit eval`` gave tens; measured side by side in one process on a 2-core CPU both of whose cores other
work kept busy, training's drafter and target decoded as fast as eval-loaded ones at the same thread count, and the
thread count alone moved it (2 threads 3-6 tokens/s, 1 thread 43-61). Nothing here is timed: the cores are made
busy for real (one spinning process per core) and the thread count the evaluation decoded with is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_llama

from drafterkit import decode
from drafterkit.assets.device import fitting_threads
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.train.evaluate import evaluate
from drafterkit.train.recipe import recipe_from_dict


def _recipe(tmp_path):
    return recipe_from_dict({
        "output_dir": str(tmp_path / "run"),
        "target": {"name_or_path": str(tmp_path / "target")},
        "drafter": {"kind": "draft_lm", "options": {"init": "truncated", "num_layers": 1}},
        "eval": {"num_prompts": 2, "max_new_tokens": 6, "k": 3},
        "logging": {"trackers": []},
    })


def test_threads_fit_beside_the_other_work():
    assert fitting_threads(None, 2, 2) == 2  # not measurable (not Linux): as asked
    assert fitting_threads(0.2, 2, 2) == 2  # a quiet machine
    assert fitting_threads(2.0, 2, 2) == 1  # both cores busy: one thread, never none
    assert fitting_threads(1.0, 4, 4) == 3
    assert fitting_threads(1.0, 2, 4) == 2  # they fit already
    assert fitting_threads(7.5, 8, 4) == 1


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: torch runs one thread, nothing to fit")
def test_an_evaluation_beside_busy_cores_decodes_with_the_threads_left_and_in_exact_mode(tmp_path, recwarn,
                                                                                       monkeypatch):
    target = tiny_llama(0)
    drafter = DraftLM.from_target(target, 1)
    prompts = [[5, 9, 17, 3, 22], [7, 7, 40, 2, 11, 30]]
    cores, before = os.cpu_count(), torch.get_num_threads()
    seen: list[tuple[int, bool]] = []  # (torch threads, exact mode) at each decode.generate call
    real = decode.generate

    def generate(*args, **kwargs):
        seen.append((torch.get_num_threads(), decode.exact_mode_enabled()))
        return real(*args, **kwargs)

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        torch.set_num_threads(cores)  # torch's default: one thread per core
        monkeypatch.setattr(decode, "generate", generate)  # records, then decodes for real
        out = evaluate(drafter, target, prompts, _recipe(tmp_path))
    finally:
        for p in spinners:
            p.kill()
            p.wait()
        torch.set_num_threads(before)
    assert out["busy_cores"] >= cores - 0.75 and out["threads"] == 1
    assert seen == [(1, True)] * 3  # the warm-up, then each prompt: one thread, exact mode
    assert out["exact_mode"] is True and not decode.exact_mode_enabled()  # the mode found before is back
    said = [str(w.message) for w in recwarn if "busy" in str(w.message)]
    assert len(said) == 1 and f"decode with 1 torch thread instead of {cores}" in said[0]
    assert 2 <= out["committed"] <= 12 and out["tokens_per_s"] > 0  # 2 prompts of at most 6 new tokens, warm-up apart
