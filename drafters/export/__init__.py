"""Export: what ``drafterkit export`` writes for serving engines and what they can serve. The format writers and
the verb (``writers.py``: Medusa, DFlash, DSpark, the HF assistant model; ``eagle3_layout.py``: the EAGLE-3 /
P-EAGLE layout vLLM and SGLang load), the model card written beside every export (``model_card.py``, its measured
section ``card_measured.py``), paths as an uploaded export holds them (``portable.py``), and which targets vLLM
serves a drafter next to (``vllm_support.py`` over vLLM's registry as data, ``vllm_registry.py``). Each kind's
formats are declared in ``drafters.kinds``."""

from drafterkit.drafters.export.writers import export  # noqa: F401 -- ``drafters.export.export``: the path it had as one module

__all__ = ["export"]
