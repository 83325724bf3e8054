"""docs/architecture.md's claims about the code, checked on the code: the stages import one way, no module imports
one that imports it back, the core's parts stand in floors, the core imports no GUI or training-only library,
nothing installed imports code that is not installed, and the Slicer extension ships only what the module and its
self-test use.
``importlib.import_module("name")`` and ``__import__("name")`` count as imports of that name; one whose name is
computed at run time could hide any of these, so there is none."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each stage may import itself and the stages after it (docs/architecture.md, "The stages and their direction").
STAGES = ("Reporting", "Training", "Evaluation", "Datasets", "CalibSegLib")
ALLOWED = {stage: set(STAGES[index:]) for index, stage in enumerate(STAGES)} | {"CalibSeg": {"CalibSeg", "CalibSegLib"}}
COMPUTED = "<a name computed at run time>"  # what a dynamic import of a non-literal name imports, for the checks
# Libraries the core must not need: a Slicer-free user installs none of them (tqdm is the optional progress bar).
NOT_IN_CORE = ("slicer", "qt", "vtk", "ctk", "h5py", "tqdm", "tensorboard")
MODULE_DIR = ROOT / "CalibSeg"  # the Slicer module: what the extension ships beside CalibSegLib
TESTING_PACKAGE = "CalibSeg.CalibSegTesting"  # the checks CalibSegTest runs in Slicer (CHECKS)


def _modules() -> dict[str, Path]:
    """Every module of the stages, by dotted name."""
    modules = {}
    for stage in ALLOWED:
        for path in (ROOT / stage).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(path: Path, package: str, for_the_type_checker: bool = False) -> list[tuple[str, ast.AST, bool]]:
    """Every import in ``path`` as (dotted name, node, guarded: inside a try that catches ImportError); those for the
    type checker alone (under ``if TYPE_CHECKING:``), which never run, only with ``for_the_type_checker``."""
    tree = ast.parse(path.read_text())
    typing_only = {id(child) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for statement in node.body for child in ast.walk(statement)}
    guarded_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(handler.type, ast.Name) and handler.type.id in ("ImportError", "ModuleNotFoundError")
                for handler in node.handlers):
            guarded_nodes |= {id(child) for statement in node.body for child in ast.walk(statement)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only and not for_the_type_checker:
            continue
        if _is_dynamic_import(node):
            argument = node.args[0] if node.args else None
            literal = isinstance(argument, ast.Constant) and isinstance(argument.value, str)
            found.append((argument.value if literal else COMPUTED, node, id(node) in guarded_nodes))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node, id(node) in guarded_nodes) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module
            found += [(f"{name}.{alias.name}", node, id(node) in guarded_nodes) for alias in node.names]
    return found


def _is_dynamic_import(node: ast.AST) -> bool:
    """A call of ``importlib.import_module(...)`` or ``__import__(...)``."""
    if not isinstance(node, ast.Call):
        return False
    function = node.func
    return (isinstance(function, ast.Name) and function.id == "__import__") or (
        isinstance(function, ast.Attribute) and function.attr == "import_module"
        and isinstance(function.value, ast.Name) and function.value.id == "importlib")


def _package(name: str, path: Path) -> str:
    """The package that relative imports in module ``name`` (file ``path``) are resolved against."""
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _project_graph(for_the_type_checker: bool = False) -> dict[str, set[str]]:
    """Module → the project modules it imports (anywhere in the file, functions included; ``for_the_type_checker``:
    those under ``if TYPE_CHECKING:`` too)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported, _, _ in _imports(path, _package(name, path), for_the_type_checker):
            while imported and imported not in modules:  # "pkg.module.symbol" → "pkg.module"
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_stages_import_only_themselves_and_the_stages_below():
    wrong = [(module, target) for module, targets in _project_graph().items() for target in targets
             if target.split(".")[0] not in ALLOWED[module.split(".")[0]]]
    assert wrong == []


def test_no_module_imports_one_that_imports_it_back():
    graph = _project_graph()
    cycles = []

    def visit(module: str, path: list[str], on_path: set[str], done: set[str]) -> None:
        for target in sorted(graph.get(module, ())):
            # A package's __init__ re-exports its own modules: that is the package, not a circle.
            if target in on_path and not (target == path[0] and module.startswith(f"{target}.")):
                cycles.append(path[path.index(target):] + [target])
            elif target not in done and target not in on_path:
                visit(target, path + [target], on_path | {target}, done)
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module], {module}, done)
    real = [cycle for cycle in cycles
            if not all(later.startswith(f"{cycle[0]}.") or cycle[0].startswith(f"{later}.") for later in cycle[1:])]
    assert real == []


def _core_part(module: str) -> str:
    """The part of the core ``module`` belongs to: its folder right under CalibSegLib (``CalibSegLib.bundle`` for
    ``CalibSegLib.bundle.schema``), or the module itself beside those folders."""
    return ".".join(module.split(".")[:2])


def test_the_cores_parts_stand_in_floors():
    """docs/architecture.md, "The core's floors": each folder of CalibSegLib and each module beside them is one part,
    and a part imports only parts on the floors below it. The imports for the type checker count here: an annotation
    is a dependency of the design even where its import never runs. Floors are laid from the ground up, each part on
    the first floor above everything it imports; what is left unplaced imports, however far round, a part that
    imports it back."""
    graph: dict[str, set[str]] = {}
    for module, targets in _project_graph(for_the_type_checker=True).items():
        if module.split(".")[0] == "CalibSegLib":
            part = _core_part(module)
            graph.setdefault(part, set()).update(_core_part(target) for target in targets
                                                 if target.split(".")[0] == "CalibSegLib")
    placed: set[str] = set()
    while ground := {part for part, targets in graph.items() if part not in placed and targets - {part} <= placed}:
        placed |= ground
    assert sorted(set(graph) - placed) == []


def test_the_core_imports_no_gui_data_or_training_only_library():
    offending = []
    for name, path in _modules().items():
        if not name.startswith("CalibSegLib"):
            continue
        for imported, node, guarded in _imports(path, name):
            root = imported.split(".")[0]
            if root in NOT_IN_CORE and not (root == "tqdm" and guarded):
                offending.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {imported}")
    assert offending == []


def test_installed_packages_are_the_stages_and_import_nothing_else_of_the_repository():
    configuration = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = configuration["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(pattern.rstrip("*") for pattern in included) == sorted(STAGES)
    top_level = {path.name for path in ROOT.iterdir() if path.is_dir() and any(path.glob("*.py"))}
    not_installed = top_level - set(STAGES)
    assert {"Testing", "benchmarks", "scripts", "studies"} <= not_installed
    leaking = [(module, target) for module, targets in _project_graph().items()
               if module.split(".")[0] in STAGES for target in targets if target.split(".")[0] in not_installed]
    assert leaking == []


# What the project ships or runs from the repository: the installed stages, the Slicer module, benchmarks, scripts.
SHIPPED_FOLDERS = (*STAGES, "CalibSeg", "benchmarks", "scripts", "studies")
TESTING_HELPERS = frozenset(path.stem for path in (ROOT / "Testing").glob("*.py"))  # chromium, tiny_bundles, ...


def _reaches_into_testing(path: Path) -> list[str]:
    """Where ``path`` changes Python's module path (``sys.path.insert/append/extend``, an assignment to
    ``sys.path``, ``site.addsitedir``) or imports a module of Testing/ by its bare name, which only such a
    change makes importable: ``"line N: ..."`` each."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else None
        if isinstance(target, ast.Attribute) and (
                (target.attr in ("insert", "append", "extend") and ast.unparse(target.value) == "sys.path")
                or ast.unparse(target) == "site.addsitedir"):
            found.append(f"line {node.lineno}: {ast.unparse(target)}")
        elif isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                ast.unparse(item) == "sys.path" for item in (node.targets if isinstance(node, ast.Assign)
                                                            else [node.target])):
            found.append(f"line {node.lineno}: assigns sys.path")
    found += [f"line {node.lineno}: imports {name} from Testing/" for name, node, _ in _imports(path, "")
              if name.split(".")[0] in TESTING_HELPERS]
    return found


def test_shipped_code_never_changes_the_module_path_to_reach_testing():
    """A shipped module or script imports only installed packages (and its own folder): none puts Testing/ (or
    anything else) on ``sys.path``, and none imports a test helper by its bare name."""
    files = [path for folder in SHIPPED_FOLDERS for path in (ROOT / folder).rglob("*.py")
             if "__pycache__" not in path.parts]
    reaching = {str(path.relative_to(ROOT)): found for path in files if (found := _reaches_into_testing(path))}
    assert reaching == {}


@pytest.mark.parametrize("source", ["import sys\nsys.path.insert(0, 'Testing')\n",
                                    "import sys\nsys.path += ['Testing']\n", "import site\nsite.addsitedir('x')\n",
                                    "from tiny_bundles import make_test_bundle\n"])
def test_the_module_path_check_fails_on_a_script_that_reaches_into_testing(source, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(source)
    assert len(_reaches_into_testing(script)) == 1
    script.write_text("from Reporting.chromium import screenshot\nimport sys\nprint(sys.path)\n")
    assert _reaches_into_testing(script) == []


def test_no_module_imports_by_a_name_computed_at_run_time():
    computed = [f"{path.relative_to(ROOT)}:{node.lineno}" for name, path in _modules().items()
                for imported, node, _ in _imports(path, name) if imported == COMPUTED]
    assert computed == []


def test_a_dynamic_import_counts_as_an_import(tmp_path):
    """The checks see ``importlib.import_module``: the literal one as its module, the computed one as such."""
    module = tmp_path / "dynamic.py"
    module.write_text("import importlib\nimportlib.import_module('benchmarks.inference')\n"
                      "name = 'x'\nimportlib.import_module(f'benchmarks.{name}')\n__import__('scripts')\n")
    assert [imported for imported, _, _ in _imports(module, "Reporting")] == [
        "importlib", "benchmarks.inference", COMPUTED, "scripts"]


def _top_level_names(path: Path) -> set[str] | None:
    """The names ``path`` binds at module level (definitions, assignments, imports, also under ``if`` and ``try``:
    optional imports and their fallbacks), or None when a ``*`` import or a module ``__getattr__`` makes them
    unknowable from the text."""
    names: set[str] = set()
    statements = list(ast.parse(path.read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {child.id for target in targets for child in ast.walk(target) if isinstance(child, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If):
            statements += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            statements += [*node.body, *node.orelse, *node.finalbody,
                           *(statement for handler in node.handlers for statement in handler.body)]
    return names


def test_every_import_of_the_project_names_what_the_module_defines():
    """An import inside a function runs only when the function does, so a name moved to another module leaves
    it broken until a user reaches that path (the GPU benchmark's Dice comparison did, after ``Training/`` was
    split). The stages, benchmarks and scripts are read, each ``from project.module import name`` checked."""
    modules = _modules()
    files = {**modules, **{f"{folder}.{path.stem}": path for folder in ("benchmarks", "scripts", "studies")
                           for path in (ROOT / folder).glob("*.py")}}
    defined = {name: _top_level_names(path) for name, path in modules.items()}
    missing = []
    for name, path in files.items():
        for imported, node, _ in _imports(path, _package(name, path)):
            if not isinstance(node, ast.ImportFrom) or imported in modules:
                continue
            module, _, symbol = imported.rpartition(".")
            if module in modules and defined[module] is not None and symbol not in defined[module]:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {symbol} from {module}")
    assert missing == []


def test_the_training_stage_names_no_dataset():
    """What is one dataset's (ACDC's classes, their count, its normalisation) lives in Datasets/, where the
    dataset knowledge is; Training/ plans from the data and never names a dataset."""
    naming = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "Training").rglob("*.py"))
              for number, line in enumerate(path.read_text().splitlines(), start=1) if "ACDC" in line]
    assert naming == []


def _cmake_listed(cmake_file: Path, variable: str) -> list[str]:
    text = cmake_file.read_text()
    block = re.search(rf"set\({variable}\n(.*?)\n\s*\)", text, re.S)
    assert block, f"{cmake_file} has no set({variable} ...)"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_extension_ships_only_what_the_module_and_its_self_test_use():
    """CalibSeg/CMakeLists.txt lists every script and resource of the module, so a built extension is self-contained,
    and every module of CalibSegTesting is imported by its package (whose CHECKS CalibSegTest runs), so the extension
    ships no test code that only Testing/ uses."""
    cmake = MODULE_DIR / "CMakeLists.txt"
    python_files = {str(path.relative_to(MODULE_DIR)) for path in MODULE_DIR.rglob("*.py")
                    if "__pycache__" not in path.parts}
    resource_files = {str(path.relative_to(MODULE_DIR)) for path in (MODULE_DIR / "Resources").rglob("*")
                      if path.is_file()}
    assert set(_cmake_listed(cmake, "MODULE_PYTHON_SCRIPTS")) == python_files
    assert set(_cmake_listed(cmake, "MODULE_PYTHON_RESOURCES")) == resource_files
    graph = _project_graph()
    reached, waiting = set(), [TESTING_PACKAGE]
    while waiting:
        module = waiting.pop()
        if module not in reached:
            reached.add(module)
            waiting += graph[module]
    unused = sorted(name for name in graph if name.startswith(f"{TESTING_PACKAGE}.") and name not in reached)
    assert unused == []


@pytest.mark.parametrize("broken", ["upward", "circle", "core part upward", "unused"])
def test_the_checks_fail_on_a_broken_graph(broken, monkeypatch):
    """The graph checks can fail: an upward import, a circle, a part of the core importing one above it (for the type
    checker alone, say) and a testing module the package never imports are found."""
    graph = _project_graph()
    if broken == "upward":
        graph["CalibSegLib.io"] = graph["CalibSegLib.io"] | {"Training.trainer"}
        check = test_stages_import_only_themselves_and_the_stages_below
    elif broken == "circle":
        graph["CalibSegLib.metrics.segmentation"] = graph["CalibSegLib.metrics.segmentation"] | {"CalibSegLib.io"}
        graph["CalibSegLib.io"] = graph["CalibSegLib.io"] | {"CalibSegLib.metrics.segmentation"}
        check = test_no_module_imports_one_that_imports_it_back
    elif broken == "core part upward":  # the bundle reads quality's schema; quality naming the bundle runs back up
        graph["CalibSegLib.quality.summary"] = graph["CalibSegLib.quality.summary"] | {"CalibSegLib.bundle"}
        check = test_the_cores_parts_stand_in_floors
    else:
        graph[TESTING_PACKAGE] = graph[TESTING_PACKAGE] - {f"{TESTING_PACKAGE}.batch_checks"}
        check = test_the_extension_ships_only_what_the_module_and_its_self_test_use
    monkeypatch.setattr(__import__(__name__), "_project_graph", lambda for_the_type_checker=False: graph)
    with pytest.raises(AssertionError):
        check()
