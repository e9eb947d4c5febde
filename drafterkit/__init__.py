"""drafterkit: train speculative-decoding drafters for a frozen target LLM and judge them by measured
acceptance length (tau) and tokens/s.

The installed packages, in their rank order (each imports only those before it; ``tests/test_layout.py``):
``drafterkit.assets`` (pinned assets, ``load_target``), ``drafterkit.decode`` (the speculative decoder:
``drafterkit.decode.generate``), ``drafterkit.drafters`` (drafter kinds, save / load, export),
``drafterkit.speceval`` (evaluation) and ``drafterkit.train`` (training), with the CLI layer here: the
``drafterkit`` command in ``drafterkit.cli`` and the verbs' front-ends that nothing below uses
(``drafterkit.quickstart``, the argument modules). In the repository each lives in a top-level folder of its
name (``decode/``, ``train/``, ...); ``pyproject.toml`` maps them under this namespace.
"""
