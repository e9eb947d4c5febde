"""benchmarks/gpu_check.py (the decoder's GPU check) in its dry mode on this CPU, end to end, so the script
cannot rot between GPU runs: every section runs, exactness holds, the chi-square p-value is reported, and
each timing row carries measured seconds."""

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import gpu_check
    import gpu_timing
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def test_dry_run_covers_every_section_and_exactness_holds(tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry-run", "--device", "cpu", "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the dry mode's one thread does not leak into the caller
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["dry_run"] and {r["section"] for r in rows} == set(gpu_check.SECTIONS)
    order = [gpu_check.SECTIONS.index(r["section"]) for r in rows]
    assert order == sorted(order) and gpu_check.SECTIONS[-1] == "speed"  # --max-minutes cuts speed, not the rest

    exact = [r for r in rows if r["section"] == "exact" and "identical" in r]
    assert len(exact) == 5 and all(r["status"] == "ran" and r["identical"] for r in exact), exact
    self_draft = next(r for r in exact if r["case"].endswith("self-draft K=5"))
    assert self_draft["acceptance_rate"] == 1.0  # the target drafting for itself is always accepted at greedy
    assert any("tree 3,2,1" in r["case"] for r in exact) and any("EAGLE-3" in r["case"] for r in exact)
    chi = [r for r in rows if "p_value" in r]
    assert len(chi) == 2 and all(0.0 <= r["p_value"] <= 1.0 and r["passed"] for r in chi), chi

    speed = {(r["model"], r["batch"], r["method"] if "method" in r else r["case"].split()[-1]): r
             for r in rows if r["section"] == "speed"}
    for model in ("llama-3.1-8b", "smollm2-135m"):
        for b in (1, 8):
            for m in ("engine", "transformers"):
                r = speed[(model, b, m)]
                assert r["status"] == "ran" and r["emitted_per_row"] == [8], r  # the same count from both
                assert r["seconds"] and r["ms_per_token"] > 0 and 0 < r["floor_fraction"]
            static = speed[(model, b, "transformers_static_compile")]
            assert static["status"] == ("ran" if b == 1 else "skipped")  # --compile-batches defaults to 1
    assert speed[("llama-3.1-8b", 1, "engine")]["same_tokens_as_engine"] == 1.0
    assert report["copy_bandwidth_gbps"] > 0

    cost = [r for r in rows if r["section"] == "cost"]
    assert [r.get("K") for r in cost[:8]] == list(range(1, 9)) and 30 <= cost[8]["tree_nodes"] <= 60
    ratio = cost[-1]
    assert ratio["status"] == "ran" and ratio["acceptance_rate"] == 1.0 and ratio["same_tokens"]
    assert ratio["ideal_speedup"] > 0 and ratio["measured_speedup"] > 0

    (train,) = [r for r in rows if r["section"] == "train"]
    assert train["status"] == "ran" and train["finite"] and train["steps_per_s"] > 0 and train["peak_memory_gib"] > 0
    assert all(math.isfinite(x) for x in train["losses"])
    table = capsys.readouterr().out
    assert "| section | case | result |" in table and "| train | llama-3.1-8b eagle3 step" in table


def test_sections_are_selectable_and_unknown_ones_refused(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert gpu_check.main(["--dry-run", "--device", "cpu", "--sections", "cost", "--json", str(out)]) == 0
    assert {r["section"] for r in json.loads(out.read_text())["rows"]} == {"cost"}
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--sections", "exact,sped"])
    assert "unknown sections ['sped']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--models", "llama-3.1-7b"])
    assert "unknown target shapes ['llama-3.1-7b']" in capsys.readouterr().err


def test_real_shapes_are_the_named_models_and_the_floor_counts_their_bytes():
    """The full-size configs (built on the meta device: no memory) have the parameter counts of SmolLM2-135M
    and Llama-3.1-8B, and a step's weight bytes leave out only an untied input embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    counts = {"smollm2-135m": 134_515_008, "llama-3.1-8b": 8_030_261_248}
    for name, shape in gpu_check.SHAPES.items():
        with torch.device("meta"):
            model = LlamaForCausalLM._from_config(LlamaConfig(**shape), dtype=torch.bfloat16)
        assert sum(p.numel() for p in model.parameters()) == counts[name]
        embed = 0 if shape["tie_word_embeddings"] else shape["vocab_size"] * shape["hidden_size"]
        assert gpu_timing.weight_bytes(model) == 2 * (counts[name] - embed)
        head_dim = shape["hidden_size"] // shape["num_attention_heads"]
        assert gpu_timing.kv_bytes(model, 8, 100) == 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] \
            * head_dim * 100 * 8 * 2


def _probe_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel (``gpu_run_probe`` 1.0), built here: the offline install needs no index."""
    name = "gpu_run_probe-1.0"
    files = {"gpu_run_probe.py": "VALUE = 1\n",
             f"{name}.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpu_run_probe\nVersion: 1.0\n",
             f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                         "Tag: py3-none-any\n"}
    path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
        z.writestr(f"{name}.dist-info/RECORD", "".join(f"{m},,\n" for m in files) + f"{name}.dist-info/RECORD,,\n")
    return path


@pytest.mark.slow
def test_the_gpu_run_script_runs_offline_in_its_dry_mode(tmp_path):
    """scripts/gpu-run.sh, the one command of a lent GPU machine, in its dry mode on this CPU: the carried wheels
    install offline and resolve from its scratch folder, drafterkit is imported from this checkout through its
    link folder (no install, no build), gpu_check.py's exactness passes and scale_check.py runs, and $OUT holds
    the four files (no folder), the scratch folder removed."""
    from drafterkit.assets.pinned import default_target_dir

    wheels, out = tmp_path / "wheels", tmp_path / "out"
    wheels.mkdir()
    _probe_wheel(wheels)
    env = dict(os.environ, DRY="1", OUT=str(out), PYTHON=sys.executable, WHEELS_DIR=str(wheels), TMPDIR=str(tmp_path),
               TOKENIZER=str(default_target_dir()), GPU_CHECK_ARGS="--sections exact", PIP_NO_INDEX="1")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-run.sh")], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-run.log", "gpu_check.json", "scale_check.json",
                                                       "versions.json"]
    versions = json.loads((out / "versions.json").read_text())
    assert versions["failed"] == [] and versions["carried"] == {"gpu_run_probe": "1.0"}
    assert set(versions["imported"].values()) == {"ok"}
    linked = Path(versions["drafterkit_from"])
    assert linked.name == "__init__.py" and linked.parent.name == "decode" and linked.parents[2].name == "path"
    assert versions["drafterkit_resolved"] == str(ROOT / "decode" / "__init__.py")  # this checkout's, through it
    exact = [r for r in json.loads((out / "gpu_check.json").read_text())["rows"] if r["section"] == "exact"]
    assert len(exact) == 7 and all(r["status"] == "ran" for r in exact)
    (one,) = json.loads((out / "scale_check.json").read_text())["rows"]
    assert one["engine"] == "one" and one["status"] == "ran" and one["agrees"]
    log = (out / "gpu-run.log").read_text()
    assert "exactness: passed" in log and "exit 0" in log and "gpu_check: exit 0" in log
    assert not list(tmp_path.glob("drafterkit-gpu-run.*"))
