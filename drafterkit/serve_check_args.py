"""``drafterkit serve-check``'s flags, importable without torch: ``drafterkit serve-check --help`` and its usage
errors answer before anything heavy loads (the verb itself runs in :mod:`speceval.serve_parity`)."""

from __future__ import annotations

import argparse

from drafterkit.speceval.prompts import BENCHMARKS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export", help="a folder written by `drafterkit export` (vllm-eagle3, vllm-peagle, "
                                       "vllm-dflash, vllm-dspark, medusa or hf-assistant)")
    parser.add_argument("--target", default=None, help="the target the drafter was trained for (name or folder; "
                                                       "default: the one its training recipe records)")
    parser.add_argument("--drafter", default=None, metavar="CHECKPOINT",
                        help="the drafterkit checkpoint to compare the export with (default: the drafter folder an "
                             "export other than hf-assistant records in its config.json, checked by the sha256 of its "
                             "weights; an hf-assistant export runs in drafterkit as it is)")
    parser.add_argument("--benchmark", default="mt-bench", help=f"{', '.join(BENCHMARKS)} or a .jsonl file")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts decoded by both engines")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--k", type=int, default=None, help="draft tokens per step (default 5, cut to what the export "
                                                            "drafts: Medusa at most its heads, DFlash block_size - 1, "
                                                            "DSpark block_size)")
    parser.add_argument("--venv", default=None, help="the vLLM venv (default: $DRAFTERKIT_VLLM_VENV, else "
                                                     "$DRAFTERKIT_HOME/vllm-venv, made by scripts/vllm-venv.sh)")
    parser.add_argument("--device", default="cpu", help="drafterkit's device (vLLM picks its own)")
    parser.add_argument("--output", default=None, help="also write the report as JSON here")
    parser.add_argument("--no-speed", dest="speed", action="store_false",
                        help="skip the speed pass: tokens/s of vLLM (its defaults, compiled graphs) and of "
                             "drafterkit's engine, plain decoding and with the drafter as a chain of K, each engine's "
                             "speedup over its own plain decoding (batch size 1, the same prompts; minutes on a CPU)")
    parser.add_argument("--speed-dtype", default="auto",
                        help="the target's dtype in the speed pass: fp32 | bf16 | auto (bf16 where the CPU has bf16 "
                             "units; the exactness check stays fp32)")
