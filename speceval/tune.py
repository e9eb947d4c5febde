"""``drafterkit tune CHECKPOINT``: choose a drafter's decoding shape by measurement and record it with
the drafter.

No chain length, tree or confidence threshold is best for every drafter, target and machine, so this
measures them: tokens/s of ``decode.generate`` with each candidate over plain decoding through the same
engine, on held-out prompts that are not the evaluation benchmarks (by default ShareGPT conversations
of the held-out split training never reads, past the ones ``drafterkit eval --benchmark sharegpt`` and
training's own evaluation draw), at batch size 1 and at one larger concurrency (``--concurrency``; on the command
line only with ``--thorough`` unless given). Candidates: chains of each K, static trees, EAGLE-2 dynamic trees
(``decode.dynamic_tree``), each at each confidence threshold the drafter supports. The command's default search
is the short one of :mod:`speceval.tune_args` (``QUICK_*``: a few minutes on a 2-core CPU); ``--thorough`` (and
:func:`tune`'s own defaults) is the full one (``DEFAULT_*``). The dtype, not given and not recorded by the
drafter's ``decoding.json``, is ``auto`` (:func:`assets.device.dtype_name`), recorded as what it chose.

The search (:mod:`speceval.tune_search`) is successive halving (Jamieson & Talwalkar 2016; the same idea as
Hyperband's inner loop): every candidate runs on a few prompts, the best ``1/eta`` by speedup go on to twice
the prompts, until one is left or the prompts run out. In every rung plain decoding runs on the same
prompts, interleaved with the candidates (order rotated per batch), and a candidate's speedup is its
tokens/s over plain decoding's in that rung: a ratio measured side by side.

The winner per concurrency, every rung's table, the machine, dtype and drafterkit version go into the
``tuned`` entry of the drafter folder's ``decoding.json`` (:func:`speceval.recorded.write_tuned`), which
``drafterkit eval`` and ``decode.generate(tree="auto")`` (through the loaded drafter) use when the
machine matches; a plot of the speedups goes beside it. The model-free proposers (``drafterkit tune ngram``,
``drafterkit tune suffix``) have no folder: their record goes under ``$DRAFTERKIT_HOME/tuned``, keyed by the
target's weights, its dtype and the proposer's knobs and corpus (:mod:`drafters.lookup.tuned_free`), and is used
under the same rules.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
import warnings
from pathlib import Path

import torch

from drafterkit.assets.console import disable_progress_bars, make_console
from drafterkit.assets.device import dtype_name, resolve_device
from drafterkit.assets.pinned import DEFAULT_TARGET_ALIAS
from drafterkit.assets.target import TargetLoadError, load_target
from drafterkit.decode.dynamic_tree import parse_tree
from drafterkit.decode.exact import exact_mode
from drafterkit.decode.recurrent import recurrent_problem
from drafterkit.drafters import DrafterLoadError, resolve_checkpoint
from drafterkit.drafters.base import weights_sha256
from drafterkit.drafters.lookup.hybrid import drafts_trees
from drafterkit.drafters.lookup.tuned_free import FREE_SPECS, record_path, write_free_tuned
from drafterkit.drafters.target.recurrent import recurrent_target_problem
from drafterkit.drafters.target.trained_for import target_from_records, trained_for_problem
from drafterkit.drafters.tuned import (
    DECODING_FILE,
    LOOKUP_SUFFIXES,
    SLOWER_NOT_USED,
    beats_plain,
    search_outcome,
    setting_label,
    tuned_key,
)
from drafterkit.speceval import report
from drafterkit.speceval.eval_args import DEFAULT_DATASTORE, k_refusal
from drafterkit.speceval.eval_run import datastore_loader
from drafterkit.speceval.harness import check_quiet, machine_info
from drafterkit.speceval.methods import build_drafter, check_drafter_spec, retrieval_info
from drafterkit.speceval.plots import pyplot, save_figure
from drafterkit.speceval.prompts import Prompt, select_prompts
from drafterkit.speceval.recorded import TUNE_PLOT, drafterkit_version, read_decoding, write_tuned
from drafterkit.speceval.shape_checks import check_tune_flags
from drafterkit.speceval.tune_args import (
    DEFAULT_DYNAMIC,
    DEFAULT_INCUMBENT,
    DEFAULT_KS,
    DEFAULT_THRESHOLDS,
    DEFAULT_TREES,
    FREE_INCUMBENT,
    QUICK_CONCURRENCY,
    QUICK_DYNAMIC,
    QUICK_KS,
    QUICK_THRESHOLDS,
    QUICK_TREES,
    THOROUGH_CONCURRENCY,
)
from drafterkit.speceval.tune_search import Candidate, candidates, halving

#: held-out ShareGPT prompts skipped before tune's own: ``drafterkit eval --benchmark sharegpt`` and training's
#: in-loop evaluation take theirs from the start of the same held-out split (16 or fewer by default)
HELDOUT_SKIP = 16


def tune(checkpoint: str, *, target_name: str = "smollm2-135m", dtype: str = "fp32", device: str = "auto",
         benchmark: str = "sharegpt", num_prompts: int = 8, max_new_tokens: int = 48, concurrency: int = 4,
         ks=DEFAULT_KS, trees=DEFAULT_TREES, dynamic=DEFAULT_DYNAMIC, thresholds=DEFAULT_THRESHOLDS,
         eta: int = 3, first: int = 2, seed: int = 0, target=None, tok=None, progress: bool = True,
         write: bool = True, incumbent: str | None = "auto", datastore=None, exact: bool = True) -> dict:
    """Tune ``checkpoint`` (a drafter folder or anything ``drafters.resolve_checkpoint`` takes) and return the
    ``tuned`` record (also written into the folder's ``decoding.json`` when ``write``; for the model-free
    ``ngram`` and ``suffix``, under ``$DRAFTERKIT_HOME/tuned`` for this target, dtype and corpus,
    ``drafters.lookup.tuned_free``, with ``record["file"]`` its path). ``PATH+rest`` /
    ``PATH+ngram`` / ``PATH+suffix`` tune the drafter behind lookup (+ retrieval) or suffix decoding, another
    proposer with its own best shape: its record goes under its own key (``tuned+rest``, ``tuned+suffix``,
    ``drafters.tuned.tuned_key``) beside the drafter's.

    Args:
        benchmark: ``sharegpt`` (held-out split, past the first :data:`HELDOUT_SKIP` held-out
            prompts) or a ``.jsonl`` prompt file; never MT-bench or HumanEval, which measure it.
        concurrency: the larger batch size tuned besides 1 (1: batch size 1 only).
        eta, first: successive halving's reduction factor and first rung's batches.
        incumbent: ``"TREE@THRESHOLD"`` (``chain:K@THRESHOLD`` for a chain), the shape kept unless a
            challenger is measurably faster (:func:`halving`); ``None``: the fastest candidate wins outright;
            ``"auto"``: :func:`default_incumbent` (a chain of K=5 for a model-free proposer, else the fixed tree).
            Ignored, with the reason in the record, where the drafter cannot decode it (a chain-only drafter
            and a tree incumbent).
        datastore: what ``PATH+rest`` retrieves from (and ``suffix`` / ``PATH+suffix`` index as their corpus): a
            ``drafters.lookup.datastore.Datastore``, a source name or file for
            ``drafters.lookup.datastore.cached_datastore`` (default ``sharegpt``, as ``drafterkit eval``).
        exact: measure in the decoder's exact mode (``decode.exact_mode``, as ``drafterkit eval`` measures by
            default, so the shape chosen is the fastest under the cost eval measures); the record's ``exact_mode``
            says which; the mode found before is restored on return.

    A target with recurrent layers (a hybrid whose chains the decoder verifies, ``decode.recurrent``) is tuned over
    chains only: ``trees`` and ``dynamic`` are not swept, a tree incumbent becomes :data:`FREE_INCUMBENT`, and the
    record's ``search.chains_only`` gives the reason (None for other targets).

    Raises:
        ValueError: an evaluation benchmark as ``benchmark``, a bad setting, no drafter at ``checkpoint``, or
            ``write`` for a spec with no folder to write into (``draft:N``): all before anything loads.
    """
    if benchmark in ("mt-bench", "humaneval"):
        raise ValueError(f"--benchmark {benchmark}: tune on prompts the evaluation never uses (sharegpt, the "
                         "held-out split, or a .jsonl file); MT-bench and HumanEval judge the tuned setting")
    if eta < 2 or first < 1 or num_prompts < 1 or concurrency < 1:
        raise ValueError(f"tune needs --eta >= 2, --first >= 1, --num-prompts >= 1 and --concurrency >= 1; got "
                         f"{eta}, {first}, {num_prompts}, {concurrency}")
    if datastore is not None and not checkpoint.endswith(("+rest", "+suffix")) and checkpoint not in ("rest", "suffix"):
        raise ValueError(f"--datastore is unused: only rest, suffix, PATH+rest and PATH+suffix read a datastore (tune "
                         f"{checkpoint}+rest, or drop --datastore)")
    if checkpoint == "none":
        raise ValueError("tune needs a drafter checkpoint, not 'none'")
    incumbent = default_incumbent(checkpoint) if incumbent == "auto" else incumbent
    parse_incumbent(incumbent, None)  # before anything loads: a malformed --incumbent, a path holding no drafter
    check_drafter_spec(checkpoint, flag="tune")
    folder, behind = _folder(checkpoint), _behind(checkpoint)
    if folder is None and write and checkpoint not in FREE_SPECS:
        raise ValueError(f"tune {checkpoint}: has no checkpoint folder for the tuned setting (decoding.json) to go "
                         "in; give --no-write to measure and print the chosen shape only, or tune a drafter folder "
                         f"(or a model-free proposer: {', '.join(FREE_SPECS)})")
    if folder is not None and (line := trained_for_problem(folder, target_name, label=f"tune {checkpoint}")):
        warnings.warn(line, UserWarning, stacklevel=2)  # a head trained for another target: tuned for this one
    if target is None:
        target, tok = load_target(target_name, dtype=dtype, device=device, chat=True)
    corpus = _datastore(datastore, tok) if behind in ("+rest", "+suffix") or checkpoint in ("rest", "suffix") else None
    spec = build_drafter(checkpoint, target, corpus, flag="tune")
    if spec.max_k is not None:  # Medusa / DFlash draft at most max_k tokens a round: a larger K is that one again
        ks = sorted({min(int(k), spec.max_k) for k in ks})
    chains_only = recurrent_problem(target.config, f"target {target_name}", for_trees=True)
    if chains_only:  # a hybrid target verifies chains only (decode.recurrent): the default trees are not swept
        trees, dynamic = (), ()
        incumbent = incumbent if incumbent is None or incumbent.startswith("chain:") else FREE_INCUMBENT
    cands = candidates(spec.drafter, ks, trees, dynamic, thresholds)
    incumbent, incumbent_note = parse_incumbent(incumbent, spec.drafter)
    prompts = _prompts(benchmark, tok, num_prompts)
    eos = _eos(target, tok)
    machine = machine_info(target, busy=check_quiet(target))
    t0 = time.perf_counter()
    winners, table = {}, []
    with exact_mode(exact):
        for c in sorted({1, concurrency}):
            best, rows = halving(target, spec.drafter, prompts, cands, c, eta=eta, first=first, max_new=max_new_tokens,
                                 eos=eos, seed=seed, progress=progress, incumbent=incumbent, what=searched(behind))
            winners[str(c)] = {k: best[k] for k in ("tree", "k", "draft_threshold", "speedup", "tokens_per_s", "tau",
                                                    "over_incumbent", "chosen") if k in best}
            table += rows
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    record = dict(written_by="drafterkit tune", created=created,
                  drafterkit=drafterkit_version(), drafter=spec.label, target=target_name, dtype=dtype,
                  exact_mode=exact, machine=machine,
                  prompts=dict(benchmark=benchmark, count=len(prompts), max_new_tokens=max_new_tokens,
                               ids=[p.id for p in prompts]),
                  search=dict(method="successive halving", eta=eta, first_batches=first, candidates=len(cands),
                              incumbent=incumbent.label if incumbent else None, incumbent_note=incumbent_note,
                              chains_only=chains_only,
                              seconds=round(time.perf_counter() - t0, 1)),
                  winners=winners, table=table)
    if behind == "+rest" or checkpoint == "rest":
        record["datastore"] = retrieval_info([spec])["datastore"]
    elif corpus is not None:  # suffix decoding's corpus, PATH+suffix's too
        record["datastore"] = corpus().describe()
    if write and folder is None:  # ngram, suffix: kept per target, dtype and corpus (drafters.lookup.tuned_free)
        path = record_path(target, spec.drafter)
        path.parent.mkdir(parents=True, exist_ok=True)
        record["plot"] = str(plot_tuning(table, winners, path.with_suffix(".png")))
        record["file"] = str(write_free_tuned(target, spec.drafter, record))
    elif write:
        record["weights_sha256"] = weights_sha256(folder)  # eval / tree='auto' use the winner only for these weights
        record["plot"] = str(plot_tuning(table, winners, folder / TUNE_PLOT.replace(".png", f"{behind}.png")))
        record["file"] = str(write_tuned(folder, record, behind))
    return record


def recorded_dtype(checkpoint: str) -> str:
    """The dtype ``checkpoint``'s ``decoding.json`` records (what ``drafterkit eval --drafter`` measures it in,
    so a tuned setting matches it), said on stdout; ``auto`` where none is recorded (bf16 where the device has bf16
    units, as ``drafterkit eval`` and ``quickstart`` pick, else fp32: :func:`assets.device.dtype_name`).

    Raises:
        ValueError: an unreadable ``decoding.json`` (``speceval.recorded.read_decoding``).
    """
    folder = _folder(checkpoint)
    path = folder / DECODING_FILE if folder is not None else None
    dtype = read_decoding(path).get("dtype") if path is not None and path.is_file() else None
    if dtype is None:
        return "auto"
    print(f"drafterkit tune: --dtype {dtype}, as {path} records it (the dtype drafterkit eval measures this drafter "
          "in); give --dtype to tune another")
    return dtype


def searched(behind: str) -> str:
    """What a search over ``PATH`` + ``behind`` (:func:`_behind`) tunes, in words for its progress bar."""
    return {"": "the drafter", "+ngram": "the drafter + prompt lookup",
            "+rest": "the drafter + lookup + retrieval"}.get(behind, f"the drafter{behind}")


def _behind(checkpoint: str) -> str:
    """``"+rest"`` / ``"+ngram"`` / ``"+suffix"`` for a drafter behind lookup or suffix decoding, else ``""``."""
    return next((s for s in LOOKUP_SUFFIXES if checkpoint.endswith(s)), "")


def _datastore(datastore, tok):
    """The zero-argument callable ``build_drafter`` takes for ``+rest``, from a Datastore or a source name."""
    if datastore is None or isinstance(datastore, str):
        return datastore_loader(datastore or DEFAULT_DATASTORE, tok)
    return lambda: datastore


def default_incumbent(checkpoint: str) -> str:
    """The shape tune keeps for ``checkpoint`` unless a challenger is faster beyond the noise: a chain of eval's
    default K (:data:`FREE_INCUMBENT`) for a model-free proposer (``ngram``, ``rest``, ``suffix``: what vLLM serves
    them as), else the quickstart's fixed tree (:data:`DEFAULT_INCUMBENT`)."""
    return FREE_INCUMBENT if checkpoint in FREE_SPECS else DEFAULT_INCUMBENT


def parse_incumbent(spec: str | None, drafter) -> tuple[Candidate | None, str]:
    """``"3,2,1,1,1@0.1"`` / ``"chain:5@0.1"`` / ``"dynamic:24:5:4@0.05"`` (``@THRESHOLD`` optional: 0) ->
    ``(Candidate, note)``; ``(None, why)`` for ``None`` / ``"none"`` or a shape the drafter cannot decode (a
    tree for a chain-only drafter), its threshold 0 where the drafter has no confidence threshold.
    ``drafter=None`` checks the spec's syntax only (before anything loads).

    Raises:
        ValueError: a malformed spec, naming the forms it takes.
    """
    if spec is None or spec == "none":
        return None, "no incumbent: the fastest candidate wins"
    shape, at, thr = spec.partition("@")
    try:
        if at and not thr.strip():
            raise ValueError("'@' without a threshold")  # 3,2,1@ is a typo, not threshold 0
        threshold = float(thr) if at else 0.0
        if shape.startswith("chain:"):
            cand = Candidate("chain", int(shape.split(":", 1)[1]), threshold)
        else:
            tree = parse_tree(shape)
            cand = Candidate(str(tree) if shape.startswith("dynamic") else shape, tree.max_depth, threshold)
    except ValueError:
        raise ValueError(f"--incumbent {spec!r}: expected TREE@THRESHOLD (3,2,1,1,1@0.1), chain:K@THRESHOLD "
                         "(chain:5@0.1), dynamic:TOTAL:DEPTH:TOPK@THRESHOLD or none") from None
    if cand.k < 1 or not 0.0 <= threshold < 1.0:
        raise ValueError(f"--incumbent {spec!r}: K >= 1 and a threshold in [0, 1)")
    if drafter is None:
        return cand, ""
    needs = None if cand.tree == "chain" else ("propose_dynamic_tree" if cand.tree.startswith("dynamic")
                                               else "propose_tree")
    if needs and not drafts_trees(drafter, needs):
        return None, f"incumbent {cand.label} not used: this drafter drafts chains only"
    if not getattr(drafter, "supports_draft_threshold", False):
        cand = Candidate(cand.tree, cand.k, 0.0)
    return cand, f"incumbent {cand.label}: replaced only by a challenger faster beyond the noise"


def _folder(checkpoint: str) -> Path | None:
    base = checkpoint.removesuffix(_behind(checkpoint))
    try:
        return resolve_checkpoint(base)[0]
    except DrafterLoadError:  # draft:N, ngram: no folder to write into
        return None


def _prompts(benchmark: str, tok, n: int) -> list[Prompt]:
    if benchmark != "sharegpt":
        return select_prompts(benchmark, tok, n).prompts
    chosen = select_prompts("sharegpt", tok, HELDOUT_SKIP + n).prompts  # in held-out file order
    return chosen[HELDOUT_SKIP:] or chosen[-n:]


def _eos(target, tok) -> list[int]:
    eos = getattr(target.generation_config, "eos_token_id", None) or tok.eos_token_id
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def plot_tuning(table: list[dict], winners: dict, path: Path) -> Path:
    """Speedup over plain decoding of every candidate at the last rung it reached, one panel per
    concurrency, the winner marked. Returns ``path`` (a PNG)."""
    plt = pyplot()
    levels = sorted({r["concurrency"] for r in table})
    fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 0.28 * len(table) / len(levels) + 2),
                             squeeze=False)
    for ax, c in zip(axes[0], levels):
        last: dict[str, dict] = {}
        for r in table:
            if r["concurrency"] == c:
                last[r["label"]] = r  # rows come rung by rung: the last one wins
        rows = sorted(last.values(), key=lambda r: (r["rung"], r["speedup"]))
        win = winners[str(c)]
        colors = ["tab:red" if (r["tree"], r["k"], r["draft_threshold"]) == (win["tree"], win["k"],
                                                                              win["draft_threshold"])
                  else "tab:blue" for r in rows]
        ax.barh([f"{r['label']} (rung {r['rung']})" for r in rows], [r["speedup"] for r in rows], color=colors)
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("tokens/s over plain decoding (same rung)")
        ax.set_title(f"concurrency {c}: kept {setting_label(win)}")  # a tree's depth is no K: its label names it
        ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# CLI


def check_settings(ks, trees, dynamic, max_new_tokens, thresholds=None) -> None:
    """Refuse bad search settings before anything loads.

    Raises:
        ValueError: a K below 1 or above ``speceval.eval_args.MAX_DRAFT_TOKENS``, a malformed static or dynamic
            tree, ``max_new_tokens`` below 1, or a confidence threshold outside [0, 1) (as ``drafterkit eval
            --draft-threshold``).
    """
    bad_t = [t for t in thresholds or [] if not 0.0 <= t < 1.0]
    if bad_t or thresholds == []:
        raise ValueError(f"--draft-threshold values must be in [0, 1), got {thresholds}")
    bad_k = [k for k in ks or [] if isinstance(k, bool) or not isinstance(k, int) or k < 1]
    if bad_k:
        raise ValueError(f"--k {bad_k[0]!r}: draft chains need K >= 1")
    if problem := next(filter(None, (k_refusal("--k", k) for k in ks or [])), None):  # above MAX_DRAFT_TOKENS
        raise ValueError(problem)
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens}: needs >= 1")
    for t in dynamic or []:
        if t != "dynamic" and not str(t).startswith("dynamic:"):
            raise ValueError(f"--dynamic {t!r}: dynamic trees are written dynamic:TOTAL[:DEPTH[:TOPK]] (e.g. "
                             f"{DEFAULT_DYNAMIC[1]}); static trees and chains go to --tree and --k")
    for t in list(trees or []) + list(dynamic or []):
        if t != "chain":
            parse_tree(t)  # ValueError naming the fix


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_progress:
        disable_progress_bars()
    full = args.thorough  # the full search; without it the short one (speceval.tune_args)
    trees = args.trees if args.trees else list(DEFAULT_TREES if full else QUICK_TREES)
    ks = args.k if args.k is not None else list(DEFAULT_KS if full else QUICK_KS)
    dynamic = args.dynamic if args.dynamic is not None else list(DEFAULT_DYNAMIC if full else QUICK_DYNAMIC)
    thresholds = args.thresholds if args.thresholds is not None else \
        list(DEFAULT_THRESHOLDS if full else QUICK_THRESHOLDS)
    if args.concurrency is None:
        args.concurrency = THOROUGH_CONCURRENCY if full else QUICK_CONCURRENCY
    try:
        resolve_device(args.device)  # an unknown or absent device, before anything loads
        check_settings(ks, trees, dynamic, args.max_new_tokens, thresholds)
        # the flags given that the drafter cannot take (its config.json read alone); defaults are cut to it
        check_tune_flags(args.checkpoint, args.k, args.trees, args.dynamic, args.thresholds, args.incumbent)
        if args.dtype is None:
            args.dtype = recorded_dtype(args.checkpoint)
        if str(args.dtype).lower() == "auto":  # recorded as what ran (eval matches a tuned setting by its dtype)
            args.dtype = dtype_name("auto", args.device)
            print(f"drafterkit tune: --dtype auto -> {args.dtype} on this device", flush=True)
        if args.target is None:  # the target the checkpoint was trained for, else the default one
            found = target_from_records({f"tune {args.checkpoint}": _folder(args.checkpoint)})
            args.target = found[0] if found else DEFAULT_TARGET_ALIAS
            if found:
                print(f"drafterkit tune: --target {args.target} (the target {args.checkpoint} was trained for, its "
                      "recipe.yaml)", flush=True)
        if problem := recurrent_target_problem(args.target):  # before the target and the drafter load
            raise ValueError(problem)
        shaped = [*(args.trees or []), *(args.dynamic or [])]  # trees asked for: a hybrid target verifies chains only
        if args.incumbent not in (None, "auto", "none") and not args.incumbent.startswith("chain:"):
            shaped.append(args.incumbent)
        if shaped and (problem := recurrent_target_problem(args.target, for_trees=True)):
            raise ValueError(f"{shaped[0]}: {problem}")
        rec = tune(args.checkpoint, target_name=args.target, dtype=args.dtype, device=args.device,
                   benchmark=args.benchmark, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
                   concurrency=args.concurrency, ks=ks, trees=trees, dynamic=dynamic,
                   thresholds=thresholds, eta=args.eta, first=args.first, seed=args.seed,
                   progress=not args.no_progress, write=not args.no_write,
                   incumbent="auto" if args.incumbent is None else args.incumbent,
                   datastore=args.datastore, exact=not args.no_exact)
    except (ValueError, DrafterLoadError, TargetLoadError, FileNotFoundError) as exc:
        print(f"drafterkit tune: error: {exc}", file=sys.stderr)
        return 2
    console = make_console()
    cols = [("conc", "concurrency", "{}"), ("rung", "rung", "{}"), ("batches", "batches", "{}"),
            ("setting", "label", "{}"), ("tau", "tau", "{:.2f}"), ("tok/s", "tokens_per_s", "{:.2f}"),
            ("plain tok/s", "plain_tokens_per_s", "{:.2f}"), ("speedup", "speedup", "{:.2f}x")]
    console.print(report.rich_table(f"drafterkit tune {rec['drafter']} ({rec['dtype']}"
                                    f"{report.mode_words(dict(exact=rec['exact_mode']))}, {rec['prompts']['count']} "
                                    f"{rec['prompts']['benchmark']} prompts, {rec['search']['seconds']:.0f} s)",
                                    rec["table"], cols))
    for c, w in rec["winners"].items():  # what was kept and why, never "the best" (a kept incumbent can be slower)
        print(f"concurrency {c}: {search_outcome(w)}" + ("" if beats_plain(w) else f"; {SLOWER_NOT_USED}"))
    if "file" in rec and args.checkpoint in FREE_SPECS:
        print(f"written to {rec['file']} (drafterkit eval --tree auto --drafter {args.checkpoint} uses it with this "
              f"target, dtype{'' if args.checkpoint == 'ngram' else ' and --datastore'}); plot {rec['plot']}")
    elif "file" in rec:
        print(f"written to {rec['file']} ({tuned_key(_behind(args.checkpoint))}); plot {rec['plot']}")
    return 0


__all__ = ["plot_tuning", "run", "tune"]
