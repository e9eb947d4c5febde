"""Evaluation: a drafter measured, never estimated, by the decoder on benchmark prompts.

``drafterkit eval`` lives here (``speceval.eval_run``; its settings and flags, importable without torch, in
``speceval.eval_args``): benchmark prompts (``speceval.prompts``: MT-bench, HumanEval, held-out ShareGPT)
chat-templated as the target serves them, the methods compared side by
side (``speceval.methods``: drafterkit's engine with and without a drafter, transformers ``generate``
and assisted generation), measurement, exactness checks, sweeps over K and temperature and concurrency
(``speceval.harness``), reports (``speceval.report``) and plots (``speceval.plots``).
Ranks above ``decode`` and ``drafters``; training imports it for in-loop evaluation.
"""
