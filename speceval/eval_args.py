"""``drafterkit eval``'s settings and flags, importable without torch: ``drafterkit eval --help`` and its usage
errors answer before anything heavy loads (the verb itself runs in :mod:`speceval.eval_run`).

:class:`EvalConfig` is everything an evaluation measures (``speceval.eval_run.evaluate`` takes one; the
quickstart builds its own); :class:`RunOptions` is what the command adds (threads, output files). Each of
their fields is one flag, built by :func:`add_arguments` from the field's type, default and help.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from drafterkit.speceval.prompts import check_benchmark

__all__ = ["BASELINES", "DEFAULT_DATASTORE", "MAX_DRAFT_TOKENS", "RECORDED", "EvalConfig", "RunOptions",
           "add_arguments", "check_plots_dir", "field_flag", "flag_fields", "k_refusal"]

#: the baselines ``drafterkit eval`` can measure next to the drafters (``speceval.methods``)
BASELINES = ("engine", "hf", "hf-assisted")
#: the corpus ``+rest`` drafters retrieve from when no datastore is given (``--datastore``)
DEFAULT_DATASTORE = "sharegpt"
#: ``EvalConfig`` field -> its ``drafterkit eval`` flag: the settings a ``decoding.json`` records
#: (``speceval.recorded``)
RECORDED = {"dtype": "--dtype", "trees": "--tree", "k": "--k", "draft_thresholds": "--draft-threshold"}
#: the most draft tokens per verification (K) a drafterkit command takes (eval, tune, serve-check, a recipe's eval.k):
#: the longest block a DFlash / DSpark drafter drafts (its drafter.options.block_size is at most this,
#: ``train.options``); a longer chain is almost never accepted to its end, and each verification pass grows with it
MAX_DRAFT_TOKENS = 32


def k_refusal(flag: str, k: int) -> str | None:
    """Why ``flag`` cannot take ``k`` draft tokens per verification (below 1, or above :data:`MAX_DRAFT_TOKENS`),
    in one line naming the fix; None when it can."""
    if k < 1:
        return f"{flag} must be >= 1, got {k}"
    if k > MAX_DRAFT_TOKENS:
        return (f"{flag} {k}: at most {MAX_DRAFT_TOKENS} draft tokens per verification (the longest block a DFlash / "
                "DSpark drafter drafts; a longer chain is almost never accepted to its end, and every verification "
                f"pass grows with it); give {flag} of at most {MAX_DRAFT_TOKENS} (3 to 8 is usual)")
    return None


def reads_corpus(spec: str) -> bool:
    """Whether a ``--drafter`` spec reads ``--datastore``: ``rest`` and ``SPEC+rest`` (retrieval), ``suffix`` and
    ``SPEC+suffix`` (the corpus as suffix decoding's global tree)."""
    return spec in ("rest", "suffix") or spec.endswith(("+rest", "+suffix"))


def tree_spec(text: str) -> str:
    """argparse type of every ``--tree``: the spec without whitespace (no tree spec has meaningful spaces), so
    that ``' 3, 2 ,1'`` measures and labels as ``3,2,1``."""
    return "".join(text.split())


def thread_count(text: str) -> int:
    """argparse type of every ``--threads``: a count of torch CPU threads, >= 1 (0 or less used to be taken
    silently as torch's default).

    Raises:
        argparse.ArgumentTypeError: not an int >= 1."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"takes a count of CPU threads >= 1, got {text!r}; leave --threads out for "
                                         "torch's default")
    return count


#: every form a ``--drafter`` spec takes, with what it measures (None: nothing to add): the flag's help and the
#: refusal of an unknown spec (``speceval.methods.check_drafter_spec``) are both made from it
DRAFTER_SPECS: tuple[tuple[str, str | None], ...] = (
    ("PATH", "checkpoint"),
    ("ngram", None),
    ("rest", "prompt lookup, else retrieval from --datastore"),
    ("suffix", "suffix decoding, vLLM's method: suffix trees over the prompt and output, plus --datastore's corpus"),
    ("draft:N", "target truncated to N layers"),
    ("SPEC+ngram", "prompt lookup first, SPEC's drafter where the row's last 2+ tokens never occurred before"),
    ("SPEC+rest", "as +ngram, plus retrieval from --datastore merged into SPEC's tree, or its majority continuation "
                  "on chains"),
    ("SPEC+suffix", "suffix decoding where its draft scores at least the draft length, else SPEC's drafter"),
    ("none", None),
)


def drafter_spec_forms() -> str:
    """The ``--drafter`` spec forms of :data:`DRAFTER_SPECS` for an error line: ``'ngram', 'rest', ..., 'none' or a
    drafter checkpoint folder (PATH)``."""
    named = ", ".join(f"'{form}'" for form, _ in DRAFTER_SPECS if form != "PATH")
    return f"{named} or a drafter checkpoint folder (PATH)"


@dataclass
class EvalConfig:
    """Everything ``drafterkit eval`` measures. Each field is one flag, ``--<field>`` with dashes unless
    ``metadata["flag"]`` says otherwise, built by :func:`add_arguments` from the field's type, default and
    ``metadata["help"]`` (lists are comma-separated values, ``metadata["action"] == "append"`` a repeatable
    flag, a bool that defaults to True a ``--no-<field>`` switch)."""

    target: str = field(default="smollm2-135m", metadata={"unset": True, "help": (
        "smollm2-135m | local folder | Hub id (default: the target the --drafter checkpoints' recipe.yaml "
        "records, else smollm2-135m)")})
    drafters: list[str] = field(default_factory=lambda: ["ngram"], metadata={
        "flag": "--drafter", "action": "append", "metavar": "SPEC",
        "help": " | ".join(f"{form} ({what})" if what else form for form, what in DRAFTER_SPECS) + "; repeatable"})
    benchmark: str = field(default="mt-bench", metadata={"help": "mt-bench | humaneval | sharegpt | FILE.jsonl"})
    num_prompts: int = field(default=8, metadata={"help": "prompts measured"})
    max_new_tokens: int = field(default=128, metadata={"help": "new tokens per answer at most"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature; 0: greedy"})
    top_k: int = field(default=0, metadata={"help": "sample from the k likeliest tokens; 0: all"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    k: int = field(default=5, metadata={"help": (
        f"draft tokens per verification (K) of chain rows, 1 to {MAX_DRAFT_TOKENS}; at most Medusa's num_heads, "
        "DFlash's block_size - 1, "
        "DSpark's block_size (a larger --k is refused; left out, their rows use 5 or that bound if smaller)")})
    draft_thresholds: list[float] = field(default_factory=lambda: [0.0], metadata={
        "flag": "--draft-threshold",
        "help": "confidence-based drafting: a chain stops, and tree nodes are pruned, once the drafter's path "
                "probability falls below this (EAGLE-2 criterion); comma-separated values are measured side by side "
                "(default 0: always K / the full tree). In +rest trees only the drafter's nodes that also clear the "
                "corpus's bar (0.2) get children; the others are verified as leaves. ngram and suffix rows have no "
                "probability to cut at: they are measured once, without a threshold (refused if they are all)"})
    trees: list[str] = field(default_factory=lambda: ["chain"], metadata={
        "flag": "--tree", "action": "append", "metavar": "TREE", "type": tree_spec,
        "help": "draft shape: chain (K tokens, the default) or a static tree verified in one pass: branching factors "
                "per depth such as 3,2,1 (3 + 6 + 6 nodes) or a JSON list of rank paths such as '[[0],[1],[0,0]]' "
                "(paths are sorted and a path given twice counts once, so [[0],[0]] is the tree [[0]]); repeatable, "
                "each measured side by side (the same tree given twice, however spelled, e.g. 1 and [[0]], is "
                "measured once, under its first spelling); or an EAGLE-2 dynamic tree grown per row and round from the "
                "drafter's cumulative log-probabilities: dynamic or dynamic:TOTAL[:DEPTH[:TOPK]] (TOTAL nodes "
                "verified, DEPTH levels, top-TOPK expansion; default dynamic:24:5:4); or auto: one row per "
                "checkpoint with the chain / tree, K and threshold drafterkit tune recorded for it on this machine "
                "(as decode.generate(tree='auto')). Tree rows ignore --k (their K column is the tree's depth) and "
                "the --sweep over K covers chain rows only. A chain-only drafter (dflash, dspark) is refused with a "
                "tree"})
    served_chain: bool = field(default=False, metadata={"help": (
        "also measure each checkpoint alone as a serving engine drafts it, a chain of --k without a draft threshold "
        "(vLLM's num_speculative_tokens): the factor drafterkit export carries (added where no such row is measured)")})
    dtype: str = field(default="auto", metadata={
        "help": "fp32 | bf16 | fp16 | auto (bf16 where the device computes it natively: a CPU with AVX512-BF16 / AMX "
                "units or a GPU with bf16, as drafterkit quickstart picks; else fp32, since emulated bf16 is several "
                "times slower); the run prints and records what auto chose"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N"})
    exact: bool = field(default=True, metadata={"help": (
        "measure the fast path instead of the decoder's exact mode (decode.exact_mode, on by default here: greedy "
        "speculative rows decode the same text as plain decoding in bf16 / fp16 on a CPU too, and are checked "
        "token for token; it costs ~5-10%% of tokens/s for plain decoding and chains, ~11-20%% for trees by CPU, "
        "SmolLM2-135M bf16, docs/benchmarks/exactness.md). Without exact mode bf16 rows may diverge from plain "
        "decoding at near-ties: the report then counts them and gives the speed over the texts that did not "
        "diverge")})
    compile: bool = field(default=False, metadata={"help": (
        "compile the target's passes, and an EAGLE or EAGLE-3 head's drafting passes, with torch.compile "
        "(decode.compiled_mode: Llama-layout targets on a CPU; every graph compiles before the timed prompts, "
        "tens of seconds each on 2 cores); needs --no-exact, whose fast path it compiles")})
    seed: int = field(default=0, metadata={"help": "sampling seed; prompt i uses seed + i"})
    baselines: list[str] = field(default_factory=lambda: list(BASELINES), metadata={
        "help": f"comma-separated subset of {','.join(BASELINES)} (default: all). hf-assisted rows exist for prompt "
                "lookup (ngram) and draft LMs measured as a chain at threshold 0 (transformers has no path for the "
                "others): named for drafters without one, it is refused"})
    sweep: bool = field(default=False, metadata={"help": "sweep K x temperature per category; Markdown + PNGs"})
    sweep_k: list[int] = field(default_factory=lambda: list(range(1, 9)),
                               metadata={"help": "comma-separated K values of the --sweep"})
    sweep_temperature: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0],
                                           metadata={"help": "comma-separated temperatures of the --sweep"})
    concurrency: list[int] = field(default_factory=list, metadata={
        "help": "e.g. 1,2,4,8: prompts decoded together, speculation on vs off"})
    max_prompt_tokens: int = field(default=2048, metadata={"help": "skip longer prompts"})
    #: the ``+rest`` drafters' corpus (``--datastore``); ``None``: not given, they use ``DEFAULT_DATASTORE``
    datastore: str | None = field(default=None, metadata={
        "help": "corpus the +rest drafters retrieve from and suffix / +suffix drafters index as their global "
                "suffix tree: a pinned data asset (sharegpt), a ShareGPT/chat JSON(L) "
                "file (assistant turns outside the held-out split), or a saved .npz; built once and cached under "
                f"$DRAFTERKIT_HOME/datastores (default: {DEFAULT_DATASTORE}; given without a +rest or suffix "
                "drafter, it is refused as unused)"})
    progress: bool = field(default=True, metadata={"help": "no tqdm bars"})

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad flag and the fix (also for a ``datastore`` given while
        no drafter spec ends in ``+rest``, and ``sweep_k`` / ``sweep_temperature`` other than their defaults
        without ``sweep``: nothing would read them)."""
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad:
            raise ValueError(f"--baselines: unknown {bad}; choose from {','.join(BASELINES)}")
        for name, value, low in (("--num-prompts", self.num_prompts, 1), ("--max-new-tokens", self.max_new_tokens, 1),
                                 ("--top-k", self.top_k, 0)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        for flag, k in [("--k", self.k), *(("--sweep-k", k) for k in self.sweep_k)]:
            if problem := k_refusal(flag, k):
                raise ValueError(problem)
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need --temperature >= 0 and 0 < --top-p <= 1, got {self.temperature}, {self.top_p}")
        if any(t < 0 for t in self.sweep_temperature) or any(c < 1 for c in self.concurrency):
            raise ValueError("--concurrency values must be >= 1, --sweep-temperature values >= 0")
        defaults = {f.name: f for f in dataclasses.fields(EvalConfig)}
        for name in ("sweep_k", "sweep_temperature"):  # the default's value given again changes nothing either
            if not self.sweep and getattr(self, name) != defaults[name].default_factory():
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} applies to --sweep only: add --sweep or drop {flag}")
        if self.compile and self.exact:
            raise ValueError("--compile compiles the fast path's target passes and exact mode runs its own "
                             "attention: add --no-exact, or drop --compile")
        if not self.drafters:
            raise ValueError("give at least one --drafter (PATH | ngram | draft:N | none)")
        check_benchmark(self.benchmark)
        if self.datastore is not None and not any(reads_corpus(d) for d in self.drafters):
            raise ValueError(f"--datastore {self.datastore} is unused: only +rest and suffix drafters read a datastore "
                             "and no --drafter is suffix or ends in +rest / +suffix; add --drafter PATH+rest (prompt "
                             "lookup plus retrieval from it) or --drafter suffix, or drop --datastore")
        if not self.draft_thresholds or any(not 0.0 <= t < 1.0 for t in self.draft_thresholds):
            raise ValueError(f"--draft-threshold values must be in [0, 1), got {self.draft_thresholds}")
        if not self.trees:
            raise ValueError("--tree needs at least one value: chain, branching factors such as 3,2,1, or a "
                             "JSON list of paths")
        for t in self.trees:
            if t != "chain":
                try:
                    _check_tree(t)
                except ValueError as e:
                    raise ValueError(f"--tree {t!r}: {e} (or 'chain' for a chain of --k tokens)") from None


@dataclass
class RunOptions:
    """What the ``drafterkit eval`` command adds to an :class:`EvalConfig`: how it runs and where it writes
    (flags built like :class:`EvalConfig`'s; not part of the record's ``config``)."""

    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's)",
                                                        "type": thread_count})
    output: str = field(default="drafterkit-eval.json", metadata={
        "help": "JSON record, Markdown next to it (.md); default: drafterkit-eval.json in the current folder"})
    plots_dir: str | None = field(default=None, metadata={
        "help": "PNG folder for the --sweep / --concurrency plots (default: <output stem>-plots); refused "
                "without --sweep or --concurrency (a plain eval writes none)"})


def check_plots_dir(plots_dir: str | None, cfg: EvalConfig) -> None:
    """Refuse a ``--plots-dir`` (:class:`RunOptions`) that nothing would write into: only a ``--sweep`` or a
    ``--concurrency`` run makes plots (``speceval.eval_run.write_outputs``).

    Raises:
        ValueError: ``plots_dir`` given for an eval with neither, naming the fix.
    """
    if plots_dir is not None and not (cfg.sweep or cfg.concurrency):
        raise ValueError(f"--plots-dir {plots_dir} applies to --sweep and --concurrency only (a plain eval writes no "
                         "plots): add --sweep or --concurrency, or drop --plots-dir")


def _check_tree(spec: str) -> None:
    """Check a ``--tree`` spec other than ``chain``: ``decode.inputs.AUTO`` (the tuned setting) or one
    ``decode.dynamic_tree.parse_tree`` reads. The decoder's modules are imported by name here, when a config
    is validated: they import torch, which building the flags must not (``drafterkit eval --help``).

    Raises:
        ValueError: a malformed static or dynamic tree spec.
    """
    if spec != importlib.import_module("drafterkit.decode.inputs").AUTO:
        importlib.import_module("drafterkit.decode.dynamic_tree").parse_tree(spec)


# ---------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------

def csv_values(kind: type, name: str) -> Callable[[str], list]:
    """An argparse ``type`` for ``name``'s comma-separated values of ``kind`` (``0.05,0.1``). An empty entry
    (``0.1,,0.2``, a trailing comma) is refused, not dropped: it is a typo for a value left out. An empty
    text is the empty list (``--baselines ""``: none)."""
    def parse(text: str) -> list:
        if not text.strip():
            return []
        parts = [x.strip() for x in text.split(",")]
        if "" in parts:
            raise argparse.ArgumentTypeError(f"{name} {text!r} has an empty entry (two commas in a row, or one at an "
                                             f"end): give comma-separated {EXAMPLES.get(kind, 'values')}")
        try:
            return [kind(x) for x in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes comma-separated {kind.__name__}s, got {text!r}") from None
    return parse


#: what :func:`csv_values`' errors show as an example of each kind
EXAMPLES = {int: "ints such as 2,3,5", float: "floats such as 0.05,0.1"}


#: the order ``drafterkit eval --help`` lists the flags in (fields of :class:`EvalConfig` and :class:`RunOptions`;
#: a field left out of it comes last)
HELP_ORDER = ("target", "drafters", "datastore", "benchmark", "num_prompts", "max_new_tokens", "max_prompt_tokens",
              "temperature", "top_k", "top_p", "k", "draft_thresholds", "trees", "dtype", "device", "exact", "compile",
              "threads", "seed", "output", "plots_dir", "baselines", "sweep", "sweep_k", "sweep_temperature",
              "concurrency", "progress")


#: said in the ``--help`` of the flags a drafter's ``decoding.json`` (``drafters.tuned.DECODING_FILE``) may set
#: (:data:`RECORDED`)
RECORDED_HELP = ("; not given, the value the --drafter folder's decoding.json records (drafterkit quickstart "
                 "writes one) is used instead of the default")


def field_flag(f: dataclasses.Field, hint: Any) -> tuple[str, dict]:
    """``(flag, argparse keyword arguments)`` of the field ``f`` whose resolved type is ``hint`` (see
    :class:`EvalConfig`). A repeatable flag, and one a drafter's ``decoding.json`` may set
    (:data:`RECORDED`), gets argparse default ``None`` (so an explicit value is told from
    none; argparse would append to a default list) and the field's default in its help; ``dest`` is the
    field's name (``no_<name>`` for a ``--no-<name>`` switch)."""
    meta = dict(f.metadata)
    flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
    unset = meta.pop("unset", False)  # a default the verb works out when the flag is not given (--target)
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    kwargs = dict(dest=f.name, **meta)
    if hint is bool:
        if default:
            return "--no-" + flag[2:], dict(kwargs, dest=f"no_{f.name}", action="store_true")
        return flag, dict(kwargs, action="store_true")
    unset = unset or kwargs.get("action") == "append" or f.name in RECORDED
    if unset and "default" not in kwargs["help"]:
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        kwargs["help"] += f" (default: {shown})"
    if f.name in RECORDED:
        kwargs["help"] += RECORDED_HELP
    if kwargs.get("action") == "append":
        return flag, dict(kwargs, default=None)
    default = None if unset else default
    if typing.get_origin(hint) is list:
        return flag, dict(kwargs, type=csv_values(typing.get_args(hint)[0], flag), default=default)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)]  # `X | None` parses as X
    return flag, dict(kwargs, type=kwargs.pop("type", kinds[0] if kinds else hint), default=default)


def flag_fields() -> list[tuple[dataclasses.Field, Any]]:
    """``(field, resolved type)`` of every ``drafterkit eval`` flag, in :data:`HELP_ORDER`."""
    out = [(f, typing.get_type_hints(cls)[f.name]) for cls in (EvalConfig, RunOptions) for f in dataclasses.fields(cls)]
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    return sorted(out, key=lambda pair: rank.get(pair[0].name, len(rank)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``drafterkit eval``: one per field of :class:`EvalConfig` and :class:`RunOptions`."""
    for f, hint in flag_fields():
        flag, kwargs = field_flag(f, hint)
        p.add_argument(flag, **kwargs)

