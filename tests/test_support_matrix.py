"""scripts/support_matrix.py reads each matrix test's outcome into its cell (the vLLM columns, the hybrid and
2026 families' table and the hybrid targets' vLLM table included), and the committed docs/support-matrix.md is a
complete run: every family, every column, no cell left unrun or failed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from families import FAMILIES
from families_hybrid import HYBRID_FAMILIES, RECURRENT

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("support_matrix", ROOT / "scripts" / "support_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _case(name: str, cell: str | None = None, failure: str | None = None) -> str:
    props = f'<properties><property name="cell" value="{cell}"/></properties>' if cell else ""
    fail = f'<failure message="{failure}">trace</failure>' if failure else ""
    return f'<testcase classname="tests.x" name="{name}">{props}{fail}</testcase>'


def test_cells_from_junit_include_the_vllm_suffix_and_peagle_columns(tmp_path):
    sm = _script()
    (tmp_path / "a.xml").write_text("<testsuites><testsuite>" + "".join([
        _case("test_serves[gemma2-hf-assistant]", "pass (chains 20/20)"),
        _case("test_serves_refused[gemma3-vllm-eagle3]", "refused: vLLM 0.32.0 cannot serve"),
        _case("test_serves[qwen3-vllm-peagle]", failure="AssertionError: chains 3/20"),
        _case("test_suffix[qwen3_moe]", "pass"), _case("test_kind[qwen3-peagle]", "pass"),
        _case("test_export[qwen3-vllm-peagle]", "pass"), _case("test_kind_trains[qwen3_5-eagle3]", "trains"),
        _case("test_decodes_exactly_or_is_refused_up_front[lfm2]", "exact: 7 of 7 chains"),
        _case("test_serves_on_cpu_refused[nemotron_h]", "refused: vLLM's CPU build cannot decode it speculatively"),
        _case("test_serves_refused[qwen3-vllm-dspark]", "refused: vLLM 0.32 runs DSpark"),
        _case("test_kind[qwen3-dspark]", "pass (chains; trees refused: dspark proposes chains only)"),
        _case("test_export[qwen3-vllm-dspark]", "pass")])
        + "</testsuite></testsuites>")
    (tmp_path / "b.xml").write_text("<testsuites><testsuite>" + _case("test_serves[qwen3-vllm-peagle]", "pass (rerun)")
                                    + "</testsuite></testsuites>")
    cells = sm.read_cells([tmp_path / "a.xml"])
    assert cells["gemma2"]["vLLM hf-assistant"] == "pass (chains 20/20)"
    assert cells["gemma3"]["vLLM vllm-eagle3"].startswith("refused: vLLM 0.32.0")
    assert cells["qwen3"]["vLLM vllm-peagle"] == "FAIL: AssertionError: chains 3/20"
    assert cells["qwen3_moe"]["suffix"] == cells["qwen3"]["peagle"] == cells["qwen3"]["vllm-peagle"] == "pass"
    assert sm.read_cells([tmp_path / "a.xml", tmp_path / "b.xml"])["qwen3"]["vLLM vllm-peagle"] == "pass (rerun)"
    assert cells["qwen3_5"]["eagle3"] == "trains" and cells["lfm2"]["decodes"] == "exact: 7 of 7 chains"
    assert cells["nemotron_h"]["vLLM for CPU"].startswith("refused: vLLM's CPU build")
    assert cells["qwen3"]["vLLM vllm-dspark"] == "refused: vLLM 0.32 runs DSpark"
    assert cells["qwen3"]["vllm-dspark"] == "pass" and cells["qwen3"]["dspark"].endswith("proposes chains only)")
    page = sm.render(cells)
    assert "## Serves in vLLM" in page and "| gemma2 | pass (chains 20/20) |" in page
    assert "| lfm2 | " + "not run | " * len(sm.KINDS) + "exact: 7 of 7 chains | not run |" in page
    assert "| nemotron_h | refused: vLLM's CPU build cannot decode it speculatively |" in page
    assert "| lfm2 | not run |" in page  # the hybrid serving table's row


def test_the_committed_page_is_a_complete_run():
    sm = _script()
    page = (ROOT / "docs" / "support-matrix.md").read_text()
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in page.splitlines()
            if line.startswith("| ") and not line.startswith("| family")}
    assert set(FAMILIES) <= set(rows)
    for header in (sm.COLUMNS, sm.SERVED):
        assert "| family | " + " | ".join(header) + " |" in page, header
    table = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| family")]
    # the hybrid and 2026 families: one table; the hybrid families again in their vLLM table
    assert len(table) == 2 * len(FAMILIES) + len(HYBRID_FAMILIES) + len(RECURRENT)
    assert "| family | " + " | ".join(sm.HYBRID_COLUMNS) + " |" in page
    assert set(HYBRID_FAMILIES) <= set(rows)
    assert not [line for line in table if "not run" in line or "FAIL" in line], "regenerate: python " \
        "scripts/support_matrix.py"
