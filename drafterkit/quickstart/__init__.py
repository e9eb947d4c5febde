"""``drafterkit quickstart``: fetch the pinned assets, train a drafter for the default target, tune and evaluate
it, end to end. The verb (``run.py``), its flags, importable without torch (``args.py``), what it says before
and while it runs (``plan.py``), its stages after training: tune, eval, export (``stages.py``), and its report
(``report.py``). It drives the lower packages (``train``, ``speceval``, ``drafters``) and holds no training or
measuring of its own."""
