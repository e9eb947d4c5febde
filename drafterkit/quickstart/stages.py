"""The quickstart's stages after training (:mod:`drafterkit.quickstart.run`): the ``drafterkit tune`` search on the
trained
drafter (alone and behind prompt lookup + retrieval), the eval stage on MT-bench and HumanEval, the fp32 exactness
check and the ``decoding.json`` that records the measured settings with the commands that reproduce them; also
the stage list and the words the stage headers print.
"""

from __future__ import annotations

from pathlib import Path

from drafterkit.assets.records import plural
from drafterkit.assets.target import load_target
from drafterkit.decode.inputs import AUTO
from drafterkit.drafters import resolve_checkpoint
from drafterkit.drafters.base import weights_sha256
from drafterkit.drafters.tuned import beats_plain
from drafterkit.quickstart.args import (
    DEFAULT_THRESHOLD,
    DEFAULT_TREES,
    EVAL_DEFAULTS,
    EXACTNESS_TOKENS,
)
from drafterkit.quickstart.plan import rows_checked
from drafterkit.quickstart.report import exactness_summary, merge_checks
from drafterkit.speceval.eval_run import EvalConfig, command_line, evaluate, print_record
from drafterkit.speceval.recorded import write_decoding
from drafterkit.speceval.tune import tune
from drafterkit.speceval.tune_search import Candidate

BENCHMARKS = ("mt-bench", "humaneval")
#: The ``drafterkit tune`` search the quickstart runs after training (``speceval.tune.tune`` arguments): chains
#: of 3 and 5, the fixed tree, two EAGLE-2 dynamic trees, three thresholds (15 candidates), successive halving
#: at batch size 1 on 4 held-out ShareGPT prompts x 32 new tokens (never the MT-bench / HumanEval prompts the
#: eval stage measures)
QUICK_TUNE = dict(ks=[3, 5], dynamic=["dynamic:12:4:3", "dynamic:24:5:4"], thresholds=[0.05, 0.1, 0.2],
                  benchmark="sharegpt", num_prompts=4, max_new_tokens=32, concurrency=1, eta=3, first=1)
#: the shape the drafter behind prompt lookup + retrieval keeps unless a challenger is faster beyond the noise:
#: behind lookup a chain of 5 beat the fixed tree on unseen MT-bench (1.58x vs 1.47x and 1.60x vs 1.51x plain
#: decoding, two runs; BENCHMARKS.md, "Tuning the head behind lookup + retrieval as its own proposer")
REST_INCUMBENT = "chain:5@0.1"
#: The search for the model-free proposers (prompt lookup ``ngram``, suffix decoding ``suffix``) when every row is
#: to be measured in its own tuned shape: chains of 3 and 5 and the fixed tree (3 candidates, no threshold), on
#: :data:`QUICK_TUNE`'s prompts, from the incumbent a chain of K (the shape they were measured in before they had
#: a tuned one); a model-free proposer drafts for free, so each search costs about a fifth of the drafter's
#: (4 + 6 runs of 32 new tokens at batch size 1 against ~40)
QUICK_FREE_TUNE = dict(QUICK_TUNE, ks=[3, 5], dynamic=[], thresholds=[0.0])
#: the model-free proposers the eval measures beside the drafter (``ngram`` always, ``suffix`` unless --no-hybrid)
FREE = ("ngram", "suffix")
#: the target the quickstart trains for and the corpus its ``+rest`` rows retrieve from
TARGET, DATASTORE = EVAL_DEFAULTS.target, "sharegpt"
#: what the report calls the fp32 exactness check run apart from the eval (:data:`EXACTNESS_TOKENS` new tokens)
SEPARATE_CHECK = "a separate fp32 run"


def tune_stage(ckpt: Path, args, target, tok, *, target_name: str = TARGET, behind: str = "", datastore=None,
               **search) -> dict:
    """``drafterkit tune`` on the trained drafter (``behind="+rest"``: on the drafter behind prompt lookup +
    retrieval from ``datastore``, a proposer with its own best shape, from the incumbent :data:`REST_INCUMBENT`)
    with :data:`QUICK_TUNE`'s search (``search`` overrides entries of it), written into its folder's
    ``decoding.json`` (``speceval.tune.tune``); returns tune's record (``winners``, ``table``, ``search``...)."""
    own = dict(incumbent=REST_INCUMBENT, datastore=datastore) if behind == "+rest" else {}
    return tune(f"{ckpt}{behind}", target_name=target_name, dtype=args.dtype, device=args.device,
                trees=list(DEFAULT_TREES), target=target, tok=tok, progress=not args.no_progress, write=True,
                exact=not args.no_exact,
                **{**QUICK_TUNE, **own, **search})


def fixed_trees(args) -> list[str]:
    """The draft shapes the eval stage measures when neither ``--tree`` nor a tuned setting says: ``DEFAULT_TREES``,
    or a chain for a chain-only kind (``drafters.kinds.Kind.trees`` False, DFlash; ``args.chain_only``, which
    :func:`drafterkit.quickstart.run.run` sets)."""
    return ["chain"] if getattr(args, "chain_only", False) else list(DEFAULT_TREES)


def free_tune_stage(args, target, tok, k: int, *, datastore=None, target_name: str = TARGET, **search) -> dict:
    """``drafterkit tune ngram`` and ``drafterkit tune suffix`` (suffix decoding over ``datastore``, the
    ``+rest`` rows' corpus) with :data:`QUICK_FREE_TUNE`'s search from the incumbent a chain of ``k``
    (``search`` overrides entries of it), each written under ``$DRAFTERKIT_HOME/tuned`` for this target and
    dtype (``drafters.lookup.tuned_free``), where the eval's ``--tree auto`` finds it; returns ``{spec: tune's
    record}``. Run only when every row is to be measured in its own shape (:func:`own_shapes`)."""
    return {spec: tune(spec, target_name=target_name, dtype=args.dtype, device=args.device,
                       trees=list(DEFAULT_TREES), target=target, tok=tok, progress=not args.no_progress, write=True,
                       exact=not args.no_exact, incumbent=f"chain:{k}",
                       datastore=datastore if spec == "suffix" else None, **{**QUICK_FREE_TUNE, **search})
            for spec in FREE}


def own_shapes(args, tuned: dict | None, tuned_rest: dict | None) -> bool:
    """Whether the eval measures every row in its own tuned shape (``--tree auto``): neither ``--tree`` nor
    ``--draft-threshold`` given, and the drafter's winner alone and behind lookup + retrieval both faster than
    plain decoding. The model-free proposers are then tuned too (:func:`free_tune_stage`)."""
    w, rest = (((rec or {}).get("winners") or {}).get("1") for rec in (tuned, tuned_rest))
    return (w is not None and rest is not None and not args.trees and args.draft_thresholds is None
            and beats_plain(w) and beats_plain(rest))


def apply_tuned(args, k: int, tuned: dict | None, tuned_rest: dict | None = None,
                free: dict | None = None) -> tuple[int, str]:
    """Make the eval stage measure tune's batch-size-1 winners: set ``args.trees`` / ``args.draft_thresholds``
    and return ``(K, what was done)``. With a usable winner for the drafter behind lookup + retrieval too
    (``tuned_rest``) and for each model-free proposer (``free``: :func:`free_tune_stage`'s records), every row is
    measured in its own tuned shape (``--tree auto``); else every row in the drafter's winner. Left as they are
    (and said why) when ``--tree`` or ``--draft-threshold`` was given (explicit flags win), when there is no tuned
    record, or when the drafter's winner was not faster than plain decoding (``drafters.tuned.beats_plain``:
    the fixed tree is measured instead)."""
    w = ((tuned or {}).get("winners") or {}).get("1")
    if w is None:
        return k, f"no tuned setting: the eval measures {' and '.join(args.trees or fixed_trees(args))}"
    found = _found(w)
    if args.trees or args.draft_thresholds is not None:
        return k, f"tune chose {found}; the eval measures the --tree / --draft-threshold given instead"
    if not beats_plain(w):
        fixed = " and ".join(fixed_trees(args))
        same = w["tree"] in fixed_trees(args) and (w["tree"] != "chain" or int(w["k"]) == k)
        fixed = f"a chain of K={k}" if fixed == "chain" else f"the fixed tree {fixed}"
        return k, (f"tune's choice, {found}, was not faster than plain decoding: the eval measures {fixed} "
                   + ("all the same" if same else "instead"))
    rest = ((tuned_rest or {}).get("winners") or {}).get("1")
    free_w = {spec: rec["winners"]["1"] for spec, rec in (free or {}).items()}
    slow = [f"{spec}'s, {_found(fw)}" for spec, fw in free_w.items() if not beats_plain(fw)]
    if rest is not None and beats_plain(rest) and free_w and not slow:
        args.trees = [AUTO]
        return k, (f"tune chose {found} for the drafter alone, {_found(rest)} for it behind prompt lookup + "
                   f"retrieval and {', '.join(f'{_found(fw)} for {s}' for s, fw in free_w.items())}: the eval "
                   "measures each in its own tuned shape")
    args.trees, args.draft_thresholds = [w["tree"]], str(w["draft_threshold"])
    why = "" if rest is None else f" (behind prompt lookup + retrieval tune's choice, {_found(rest)}, was not faster " \
                                  "than plain decoding)"
    if rest is not None and beats_plain(rest):
        why = (f" (a model-free proposer's tuned shape, {'; '.join(slow)}, was not faster than plain decoding, so the "
               "rows are not measured each in its own shape)" if slow else " (the model-free proposers were not tuned)")
    return int(w["k"]), f"tune chose {found}: the eval measures it{why}"


def _found(w: dict) -> str:
    return (f"{Candidate(w['tree'], int(w['k']), float(w['draft_threshold'])).label} ({w['speedup']:.2f}x plain "
            f"decoding on the tuning prompts)")


def measured_shapes(tuned: dict | None, tuned_rest: dict | None, ckpt: Path) -> dict[str, dict]:
    """``{drafter spec: tune's batch-size-1 winner}`` of the rows an ``--tree auto`` eval measured in their own
    tuned shape (the drafter, and the drafter behind lookup + retrieval), for the fp32 exactness check."""
    out = {}
    for spec, rec in ((str(ckpt), tuned), (f"{ckpt}+rest", tuned_rest)):
        w = ((rec or {}).get("winners") or {}).get("1")
        if w is not None:
            out[spec] = w
    return out


def eval_config(ckpt: Path, args, bench: str, k: int, *, target_name: str = TARGET,
                datastore_source: str = DATASTORE):
    """The ``speceval.eval_run.EvalConfig`` of one benchmark, validated: the drafter alone (and, where its shape is not
    one, as the chain of K a serving engine drafts: ``served_chain``), prompt lookup alone (``ngram``) and, unless
    ``--no-hybrid``, suffix decoding alone (``suffix``) and the drafter behind prompt lookup + retrieval from
    ``datastore_source``, on the target ``target_name``. Raises ``ValueError`` naming the bad flag."""
    try:
        thresholds = [float(x) for x in str(args.draft_thresholds or DEFAULT_THRESHOLD).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--draft-threshold takes comma-separated numbers, got {args.draft_thresholds!r}") from None
    drafters = [str(ckpt), "ngram"] + ([] if args.no_hybrid else ["suffix", f"{ckpt}+rest"])
    cfg = EvalConfig(target=target_name, drafters=drafters, benchmark=bench,
                     num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, k=k, dtype=args.dtype,
                     draft_thresholds=thresholds, trees=args.trees or fixed_trees(args),
                     device=args.device, progress=not args.no_progress, exact=not args.no_exact,
                     baselines=[b for b in args.baselines.split(",") if b],
                     datastore=None if args.no_hybrid else datastore_source, served_chain=True)
    cfg.validate()
    return cfg


def eval_stage(ckpt: Path, args, target, tok, k: int, datastore=None, **names) -> dict:
    """``speceval.eval_run.evaluate`` of the checkpoint on each benchmark with the loaded ``target`` and
    ``datastore`` (``names``: :func:`eval_config`'s ``target_name`` and ``datastore_source``, the names
    the records and the printed commands carry); returns ``{benchmark: record}``."""
    records = {}
    for bench in BENCHMARKS:
        records[bench] = evaluate(eval_config(ckpt, args, bench, k, **names), target=target, tok=tok,
                                  datastore=datastore)
        print_record(records[bench], exactness_note=exactness_later(args))
    return records


def exactness_later(args) -> str | None:
    """What an eval block says of exactness when the exactness stage checks it after the measurements (an eval
    whose rows are not compared themselves: bf16 / fp16 off the CPU), else None (the row's own verdict)."""
    if "exactness" not in stage_names(args):
        return None
    return (f"checked after these measurements, in the exactness stage (fp32, greedy, "
            f"{plural(args.exactness_prompts, 'prompt')} per benchmark vs plain decoding)")


def exactness_stage(records: dict, args, tok, datastore=None, shapes: dict | None = None) -> dict:
    """The fp32 greedy check: the drafter's rows of each eval record (not ``ngram``'s or ``suffix``'s) on its first
    ``--exactness-prompts`` prompts, :data:`EXACTNESS_TOKENS` new tokens at most, against plain decoding
    through the same engine, with a target loaded in fp32 (``speceval.harness.check_exactness`` via
    ``speceval.eval_run.evaluate``); rows an ``--tree auto`` eval measured in their own tuned shape are checked
    in it (``shapes``: :func:`measured_shapes`). In fp32, and in bf16 / fp16 on a CPU where the engine is bitwise
    exact (``decode.fused.bitwise_exact``), the eval rows themselves were checked and are summarized instead.
    Returns ``drafterkit.quickstart.report.exactness_summary``."""
    if rows_checked(args):
        return exactness_summary(records, "the measured rows")
    if args.exactness_prompts <= 0:
        return exactness_summary({}, "skipped: --exactness-prompts 0")
    first = next(iter(records.values()))["config"]
    target, _ = load_target(first["target"], dtype="fp32", device=args.device, chat=True)
    checks = {}
    for bench, rec in records.items():
        base = {**rec["config"], "dtype": "fp32", "num_prompts": args.exactness_prompts,
                "max_new_tokens": min(EXACTNESS_TOKENS, args.max_new_tokens), "baselines": ["engine"]}
        drafters = [d for d in rec["config"]["drafters"] if d not in ("ngram", "suffix")]
        if rec["config"]["trees"] != [AUTO]:
            configs = [EvalConfig(**{**base, "drafters": drafters})]
        else:  # each row in the shape it was measured in: tune's setting, spelled out (it was tuned in another dtype)
            configs = [EvalConfig(**{**base, "drafters": [d], "trees": [shapes[d]["tree"]], "k": int(shapes[d]["k"]),
                                     "draft_thresholds": [float(shapes[d]["draft_threshold"])],
                                     "datastore": base["datastore"] if d.endswith("+rest") else None})
                       for d in drafters]
        checks[bench] = merge_checks([evaluate(cfg, target=target, tok=tok, datastore=datastore) for cfg in configs])
    return exactness_summary(checks, SEPARATE_CHECK)


def record_decoding(ckpt: Path, records: dict, out: Path, threads: int | None = None,
                    shapes: dict | None = None) -> dict:
    """Write the eval's decoding settings into the drafter's folder (``decoding.json``, which
    ``drafterkit eval --drafter`` reads; after an ``--tree auto`` eval, the drafter's own tuned shape spelled
    out, ``shapes``: :func:`measured_shapes`, so that it holds on any machine) with the ``drafterkit eval``
    commands that reproduce each benchmark's rows (output ``<out>/eval-<benchmark>.json``); returns
    ``{"decoding_json", "commands"}``."""
    commands = [command_line(rec["config"], threads=threads, output=out / f"eval-{bench}.json")
                for bench, rec in records.items()]
    first = dict(next(iter(records.values())))
    own = (shapes or {}).get(str(ckpt))
    if first["config"]["trees"] == [AUTO] and own is not None:
        first["config"] = {**first["config"], "trees": [own["tree"]], "k": int(own["k"]),
                           "draft_thresholds": [float(own["draft_threshold"])]}
    folder = resolve_checkpoint(ckpt)[0]
    # the report's absolute path and the hash of the weights measured: `drafterkit export` finds the measured
    # numbers for its model card through them, and ignores them once the folder holds other weights
    path = write_decoding(folder, first["config"], written_by="drafterkit quickstart", machine=first["machine"],
                          report=str((out / "report.json").resolve()), weights_sha256=weights_sha256(folder),
                          commands=commands)
    return dict(decoding_json=str(path), commands=commands)


def tuned_summary(tuned: dict | None, note: str) -> dict | None:
    """What the report keeps of the tune stage: the winner, the search, the note on what the eval measured."""
    if tuned is None:
        return None
    return dict(winner=tuned["winners"].get("1"), search=tuned["search"], prompts=tuned["prompts"], note=note,
                file=tuned.get("file"), table=tuned["table"])


def stage_names(args) -> list[str]:
    """The stages this run goes through, in order (``datastore`` unless ``--no-hybrid``; ``exactness``
    unless the eval's rows are checked themselves (:func:`rows_checked`), or ``--exactness-prompts 0``)."""
    separate = not rows_checked(args) and args.exactness_prompts > 0
    return ["fetch", *([] if args.no_hybrid else ["datastore"]), *([] if args.no_train else ["train"]),
            *([] if args.no_tune else ["tune"]), "eval", *(["exactness"] if separate else []), "report"]


def eval_words(args) -> str:
    """What the eval stage measures, in words, for its header."""
    rows = ["the drafter alone", "prompt lookup alone"] + ([] if args.no_hybrid else [
        "suffix decoding alone", "the drafter + lookup + retrieval"])
    if args.trees == [AUTO]:
        shapes = "each row in its own tuned shape"
    else:
        shapes = f"draft shape {', '.join(args.trees or fixed_trees(args))}, threshold " \
                 f"{args.draft_thresholds or DEFAULT_THRESHOLD}"
    return (f"{', '.join(rows)} ({shapes}) vs {args.baselines.replace(',', ', ')} on {' and '.join(BENCHMARKS)}, "
            f"{plural(args.num_prompts, 'prompt')} x up to {args.max_new_tokens} new tokens each, {args.dtype}")
