"""Architecture guards: decode/ and drafters/ never import train/."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_decode_and_drafters_never_import_train():
    offenders = [str(p.relative_to(ROOT)) for pkg in ("decode", "drafters")
                 for p in (ROOT / pkg).rglob("*.py") if "train" in _imports(p)]
    assert not offenders, f"these modules import train/: {offenders}"


def test_cli_lists_all_verbs():
    from train.cli import VERBS

    assert set(VERBS) == {"train", "features", "eval", "export", "assets", "quickstart"}
