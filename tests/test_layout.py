"""Architecture guards, read from the source: the packages' rank order, no import cycles, imports of our
own packages at the top of modules, and module / function sizes.

Rank order (each package imports only packages of lower rank, and itself):

    0 assets    pinned assets, conversation and prompt readers, target loading
    1 decode    the decoder core: engine, cache, verification, sampling, trees, metrics, proposer protocol
    2 drafters  drafter kinds (one module each), save / load; subpackages: export formats and what vLLM serves
                (``export/``), model-free lookup support (``lookup/``), the target as a drafter reads it
                (``target/``), the heads' shared parts (``heads/``) (imports assets and decode)
    3 speceval  evaluation: benchmark prompts, methods, measurement, reports, plots, sweeps, serve-check
    4 train     data, features, losses, the training loop, recipes
    5 drafterkit the namespace root (``drafterkit/``), the CLI layer: the ``drafterkit`` command (``cli.py``), the
                verbs' front-ends that nothing below uses (``quickstart/``, ``assets_verb.py``, argument modules)

Installed, every package lives under the ``drafterkit`` namespace (``drafterkit.decode``, ...), each from
the repository folder of its name (pyproject.toml's package-dir).

The decoder core imports no other package of ours, not even assets.

String imports count as imports for the rank order: ``importlib.import_module("drafterkit.x.y")``, a
``"drafterkit.x.y:attr"`` table entry (the CLI's verbs), the constant head of an f-string naming a module.
They load lazily (an arguments module stays free of torch), so they may sit inside functions.
"""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "drafterkit"  # every package installs under it (pyproject.toml's package-dir)
RANKS = {"assets": 0, "decode": 1, "drafters": 2, "speceval": 3, "train": 4, NAMESPACE: 5}
ALLOWED = {pkg: {p for p, r in RANKS.items() if r < rank} | {pkg} for pkg, rank in RANKS.items()}
ALLOWED["decode"] = {"decode"}  # the decoder core stands alone
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80  # body lines, docstring excluded


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in RANKS:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()
#: the namespace root's own modules and subpackages (``cli``, ``quickstart``, ...), named ``drafterkit.<name>``
ROOT_NAMES = sorted({p.stem for p in (ROOT / NAMESPACE).glob("*.py") if p.stem != "__init__"}
                    | {p.name for p in (ROOT / NAMESPACE).iterdir() if (p / "__init__.py").exists()})
#: a string naming a module of ours, as ``importlib.import_module`` or a ``"module:attr"`` table takes it (a
#: trailing dot: the constant head of an f-string such as ``f"drafterkit.train.strategies.{kind}"``)
STRING_IMPORT = re.compile(rf"{NAMESPACE}\.(?:{'|'.join([*(p for p in RANKS if p != NAMESPACE), *ROOT_NAMES])})"
                           r"(?:\.[A-Za-z_]\w*)*\.?(?::[A-Za-z_]\w*)?")


def _installed(name: str) -> str:
    """``decode.x`` for the installed name ``drafterkit.decode.x``; ``drafterkit.cli`` stays (the namespace root's
    own modules are ``drafterkit.<module>``)."""
    parts = name.split(".")
    if parts[0] == NAMESPACE and len(parts) > 1 and parts[1] in RANKS:
        return ".".join(parts[1:])
    return name


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The modules of ours an import statement loads (a ``from pkg import sub`` names ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [_installed(a.name) for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = _installed(node.module or "")
        if origin == NAMESPACE:  # from drafterkit import decode
            names = [a.name if a.name in RANKS else f"{NAMESPACE}.{a.name}" for a in node.names]
        else:
            names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
    return [n for n in names if n.split(".")[0] in RANKS]


def string_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """``(module of ours, line)`` for every string constant that names one (:data:`STRING_IMPORT`):
    ``importlib.import_module("drafterkit.x.y")``, a ``"drafterkit.x.y:attr"`` entry of a table, the constant
    head of an f-string. Such imports load lazily, so they may sit inside functions, but they follow the rank
    order like any other."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and STRING_IMPORT.fullmatch(node.value):
            name = _installed(node.value.split(":")[0].rstrip("."))
            out.append((name, node.lineno))
    return out


def _imports(module: str, modules: dict[str, Path] = MODULES) -> list[tuple[str, int, bool, bool]]:
    """``(imported module, line, at top level, by string)`` for every import of ours in ``module``."""
    path = modules[module]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks at the top level count as top-level imports
        if isinstance(node, ast.If):
            top |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _resolve(module, node, path.name == "__init__.py", modules):
                out.append((name, node.lineno, id(node) in top, False))
    out += [(name, line, False, True) for name, line in string_imports(tree)]
    return out


def rank_offenders(root: Path = ROOT) -> list[str]:
    """Every import, statement or string, of a package of higher rank (or of another package, for decode)."""
    modules = MODULES if root == ROOT else _modules(root)
    return [f"{modules[m].relative_to(root)}:{line} imports {name}{' (by string)' if by_string else ''}"
            for m in modules for name, line, _, by_string in _imports(m, modules)
            if name.split(".")[0] not in ALLOWED[m.split(".")[0]]]


def test_every_import_follows_the_rank_order():
    offenders = rank_offenders()
    assert not offenders, "imports against the rank order (see this module's docstring):\n" + "\n".join(offenders)


def test_a_planted_upward_string_import_fails_the_rank_order(tmp_path):
    """The rank check reads string imports too: ``importlib.import_module("...")`` and ``"module:attr"``
    tables in a lower package, naming a higher one, are offenders, as an import statement would be."""
    for pkg in ("decode", "drafters", "train"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "decode" / "planted.py").write_text(
        "import importlib\n\n\ndef late():\n    return importlib.import_module('drafterkit.train.loop')\n")
    (tmp_path / "drafters" / "planted.py").write_text(
        'STRATEGY = "drafterkit.train.strategies.eagle3:Eagle3Strategy"\n'
        'LAZY = f"drafterkit.speceval.{1}"\nOWN = "drafterkit.drafters.eagle3:Eagle3Drafter"\n'
        'PROSE = "see drafterkit.train.loop for the loop"\n')
    (tmp_path / "train" / "planted.py").write_text('RUNNER = "drafterkit.drafters.export.writers:run"\n')
    assert rank_offenders(tmp_path) == [
        "decode/planted.py:5 imports train.loop (by string)",
        "drafters/planted.py:1 imports train.strategies.eagle3 (by string)",
        "drafters/planted.py:2 imports speceval (by string)",
    ]


def test_imports_of_our_packages_sit_at_the_top_of_modules():
    offenders = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {name} inside a function or class"
                 for m in MODULES for name, line, top, by_string in _imports(m) if not top and not by_string]
    assert not offenders, "\n".join(offenders)


def test_no_import_cycles():
    graph = {m: {n if n in MODULES else n.rsplit(".", 1)[0] for n, _, _, by_string in _imports(m) if not by_string}
             - {m} for m in MODULES}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    return 0 if not body else body[-1].end_lineno - body[0].lineno + 1


def test_no_function_is_too_long():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_body_lines(node)} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_ruff_passes():
    """ruff (``pip install -e ".[test]"``) with pyproject.toml's rules: pyflakes, pycodestyle errors and
    warnings, lines <= 120 characters, over the packages, tests, benchmarks and scripts."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "No module named ruff" not in proc.stderr, 'ruff is missing: pip install -e ".[test]"'
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "benchmarks").glob("*.md")), ids=lambda p: p.name)
def test_every_benchmark_page_gives_its_command_machine_and_date_and_is_listed(page):
    """docs/benchmarks/: one page per capability, each with the command that reproduces its figures (a code
    block) and, once it holds a table of figures, the machine they ran on and a date; the index links every
    page."""
    text = page.read_text()
    if page.name == "index.md":
        return
    assert "```" in text, f"{page.name}: no command (a code block) reproduces its figures"
    if "|---" in text:  # measured figures: where and when
        assert re.search(r"machine|CPU-[A-Z]|GPU|H100|H200|A100", text, re.I), f"{page.name}: no machine named"
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page.name}: no date (YYYY-MM-DD) for its figures"
    assert f"({page.name})" in (ROOT / "docs" / "benchmarks" / "index.md").read_text(), \
        f"docs/benchmarks/index.md does not link {page.name}"


@pytest.mark.parametrize("pkg", sorted(RANKS))
def test_tests_mirror_the_packages(pkg):
    """Each package has tests named after it (tests/test_<package>_*.py)."""
    assert list((ROOT / "tests").glob(f"test_{pkg}_*.py")) or (ROOT / "tests" / f"test_{pkg}.py").exists()


def test_cli_lists_all_verbs():
    from drafterkit.cli import VERBS

    assert set(VERBS) == {"train", "features", "eval", "export", "serve-check", "assets",
                          "quickstart", "tune"}


def test_installed_names_live_under_one_namespace(tmp_path):
    """Outside the checkout, the packages import as ``drafterkit.*`` and nothing generic is importable."""
    probe = ("import importlib, json\n"
             "ok = [importlib.import_module(f'drafterkit.{p}').__name__ for p in ('assets', 'decode', 'drafters',"
             " 'speceval', 'train', 'cli')]\n"
             "bare = []\n"
             "for p in ('assets', 'decode', 'drafters', 'speceval', 'train'):\n"
             "    try:\n"
             "        importlib.import_module(p)\n"
             "        bare.append(p)\n"
             "    except ModuleNotFoundError:\n"
             "        pass\n"
             "print(json.dumps([ok, bare]))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr
    ok, bare = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(ok) == 6 and bare == [], f"importable without the namespace: {bare}"
