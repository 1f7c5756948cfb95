"""The code's shape, checked: every module imports on its own in a fresh interpreter; no two modules
and no two packages import each other, directly or around a loop, whether the import is at the top, inside a function
(an import inside a function hides a cycle from the interpreter, not from the reader) or for types only
(under TYPE_CHECKING); each of diffnet's subpackages imports only the floors below it; no engine
function takes more than eight parameters (training state travels as one TrainingContext)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

PACKAGES = ("deepfusion", "diffnet")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports anywhere in its text (the package a submodule
    lives in excepted: importing a package's own ``__init__`` from inside it is not a loop)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(tree):  # type-only imports (under TYPE_CHECKING) count: a reader follows them too
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = owner(name)
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_project_modules():
    graph = import_graph()
    assert len(graph) > 70 and graph["deepfusion.analysis.evaluate"] >= {"deepfusion.analysis.diagnostics", "deepfusion.analysis.inference"}
    assert cycles(graph) == []


def test_diffnet_never_imports_deepfusion():
    graph = import_graph()
    offenders = {m: sorted(t for t in targets if t.startswith("deepfusion"))
                 for m, targets in graph.items() if m.startswith("diffnet")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_every_module_imports_alone_in_a_fresh_interpreter():
    # One interpreter per module would cost a torch import each (~2 s); a module that needs another
    # imported first fails here too, since each import below starts from the modules already loaded
    # by nothing but itself: sys.modules is cleared of the project's modules between them.
    script = (
        "import importlib, sys\n"
        f"names = {sorted(_modules())!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in ('deepfusion', 'diffnet')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {exc!r}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


MAX_PARAMETERS = 8


def _parameter_counts(package: str) -> dict[str, int]:
    counts = {}
    for module, path in _modules().items():
        if not module.startswith(package):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [
                    x.arg for x in (a.vararg, a.kwarg) if x is not None]
                if names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                counts[f"{module}.{node.name}:{node.lineno}"] = len(names)
    return counts


def test_no_engine_function_takes_more_than_eight_parameters():
    counts = _parameter_counts("deepfusion")
    assert counts["deepfusion.training.trainer.train:" + next(k.split(":")[1] for k in counts
                                                     if k.startswith("deepfusion.training.trainer.train:"))] == 5  # run, model, ctx; resume, clock
    assert {k: n for k, n in counts.items() if n > MAX_PARAMETERS} == {}


def package_graph() -> dict[str, set[str]]:
    """Package -> the project's packages its modules import: a module of a subpackage counts as that
    subpackage (``diffnet.multigrid``), a top-level module as itself (``deepfusion.surrogate``)."""

    def package(module: str) -> str:
        parts = module.split(".")
        path = ROOT.joinpath(*parts[:2])
        return ".".join(parts[:2]) if path.is_dir() or len(parts) <= 2 else module

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        graph.setdefault(package(module), set()).update(package(t) for t in targets)
    return {p: {t for t in targets if t != p} for p, targets in graph.items()}


def test_no_import_cycle_among_the_packages():
    graph = package_graph()
    assert {"diffnet.protocol", "diffnet.multigrid", "deepfusion.training", "deepfusion.files"} <= set(graph)
    assert cycles(graph) == []


def _design_table(heading: str) -> dict[str, tuple[set[str], set[str] | None]]:
    """The table under ``heading`` in docs/design.md: package -> (its modules, the packages it imports or may
    import; None for "all of the above")."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index(heading):]
    section = section[:section.index("\n\n", section.index("|---"))]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells[0].startswith("`") or not cells[0].endswith("/`"):
            continue
        modules = {m.strip() for m in cells[1].split(",")}
        last = cells[-1]
        imports = None if last == "all of the above" else set(re.findall(r"`(\w+)`", last))
        rows[cells[0].strip("`/")] = (modules, imports)
    return rows


def _as_designed(top: str, heading: str) -> dict[str, tuple[set[str], set[str] | None]]:
    """docs/design.md's table under ``heading``, once the packages of ``top`` and their modules are checked to be
    the table's."""
    table = _design_table(heading)
    packages = {p.name for p in (ROOT / top).iterdir() if (p / "__init__.py").exists()}
    assert packages == set(table)
    modules = {name: {p.stem for p in (ROOT / top / name).glob("*.py") if p.stem != "__init__"} for name in table}
    assert modules == {name: row[0] for name, row in table.items()}
    return table


def test_each_diffnet_subpackage_imports_only_the_floors_below_it():
    # docs/design.md, "diffnet: the science": the modules of each subpackage and the floors it may import.
    table = _as_designed("diffnet", "### diffnet: the science")
    graph = package_graph()
    beyond = {name: sorted(t.split(".", 1)[1] for t in graph[f"diffnet.{name}"] if t.startswith("diffnet.")
                           and allowed is not None and t.split(".", 1)[1] not in allowed)
              for name, (_, allowed) in table.items()}
    assert {name: found for name, found in beyond.items() if found} == {}


def test_the_engine_is_laid_out_as_docs_design_says():
    # docs/design.md, "deepfusion: the engine": each package's modules, and the engine's packages it imports.
    table = _as_designed("deepfusion", "### deepfusion: the engine")
    graph = package_graph()
    actual = {name: {t.split(".")[1] for t in graph[f"deepfusion.{name}"] if t.startswith("deepfusion.")}
              for name in table}
    assert actual == {name: row[1] for name, row in table.items()}


def test_docs_design_names_every_built_in_family():
    from deepfusion.configuration.registry import builtin_families

    text = (ROOT / "docs" / "design.md").read_text()
    line = text[text.index("The built-in families, by the name a config gives"):].split(": ", 1)[1]
    listed = {name.strip() for name in line[:line.index(".")].replace("\n", " ").split(",")}
    assert listed == set(builtin_families())



def test_importing_diffnet_installs_nothing_and_names_its_public_surface():
    # No import hook (the old module paths' finder is retired: diffnet.protocol.moved names the moves in a message).
    script = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "hooks = list(sys.meta_path)\n"
        "import diffnet\n"
        "assert sys.meta_path == hooks, sys.meta_path\n"
        "missing = [n for n in diffnet.__all__ if getattr(diffnet, n, None) is None]\n"
        "assert not missing and len(diffnet.__all__) >= 29, missing  # the documented top-level names\n"
        "try:\n"
        "    import diffnet.family\n"
        "except ModuleNotFoundError as e:\n"
        "    assert e.name == 'diffnet.family'\n"
        "else:\n"
        "    raise AssertionError('diffnet.family imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_public_name_has_one_import_path():
    # A module's __all__ lists what it defines: no module hands on another's names (the packages' faces,
    # `diffnet` and `deepfusion`, are the public surface and name the defining modules).
    faces = {"diffnet", "deepfusion"}
    foreign = {}
    for module, path in _modules().items():
        if module in faces:
            continue
        tree = ast.parse(path.read_text())
        defined, listed = set(), []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                defined |= names
                if "__all__" in names:
                    listed = list(ast.literal_eval(node.value))
        if set(listed) - defined:
            foreign[module] = sorted(set(listed) - defined)
    assert foreign == {}


def test_the_test_folders_hold_what_their_conftest_says():
    # tests/science is diffnet alone (tests/science/conftest.py): no file there imports the engine, runs its command
    # line or starts mpiexec; those runs of a family or a method are in tests/methods.
    engine = ("import deepfusion", "from deepfusion", "run_cli", "needs_mpiexec", "mpiexec")
    found = {path.name: [word for word in engine if word in path.read_text()]
             for path in sorted((ROOT / "tests" / "science").glob("test_*.py"))}
    assert {name: words for name, words in found.items() if words} == {}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and (p / "conftest.py").is_file()}
    assert folders == {"science", "methods", "engine", "end_to_end"}


def _wrapper_class_names() -> set[str]:
    """The classes that wrap a family (diffnet.protocol.wrapper.Wrapper's subclasses, found in the source) and the
    two-stage generator: what only diffnet's product module may look inside."""
    names = {"Wrapper", "TwoStage"}
    for path in (ROOT / "diffnet").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Wrapper" for b in node.bases):
                names.add(node.name)
    return names


def test_only_diffnet_product_looks_inside_the_products_layers():
    # The product is built in one place (diffnet/product/product.py): no caller peels a wrapper or the two-stage
    # generator by its class.
    wrappers = _wrapper_class_names()
    assert {"CoarseCorrected", "Polished", "SecondStage", "PreconditionedLoss", "GalerkinLoss"} <= wrappers
    found = []
    for folder in ("deepfusion", "diffnet", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.parent == ROOT / "diffnet" / "product":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                    classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                    named = {getattr(c, "id", getattr(c, "attr", None)) for c in classes}
                    if named & wrappers:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: isinstance(..., {sorted(named & wrappers)})")
    assert found == []


def test_no_field_carries_an_attribute_of_its_own():
    # Where fields flow as tensors (the losses, the multigrid, the generators, the product), nothing is set on an object
    # but self's own (a side channel on a tensor made a loss a function of more than its field and instance).
    found = []
    for package in ("discretisation", "multigrid", "generators", "product"):
        for path in sorted((ROOT / "diffnet" / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                            if isinstance(t, ast.Attribute) and getattr(t.value, "id", "self") not in ("self", "cls", "ctx"):
                                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)} = ...")
    assert found == []


def test_every_module_has_its_tests_in_the_map_and_each_names_it():
    # tests/map.toml: where a newcomer finds a module's tests. Every module of deepfusion/ and diffnet/ is listed; each
    # test file listed exists and names the module (an import of it, its dotted name or its path).
    import tomllib

    listed = tomllib.loads((ROOT / "tests" / "map.toml").read_text())
    modules = {m: p for m, p in _modules().items() if not m.endswith("__init__") and (ROOT / p).name != "__init__.py"}
    assert set(listed) == set(modules), (sorted(set(modules) - set(listed)), sorted(set(listed) - set(modules)))
    unnamed = []
    for module, files in listed.items():
        assert files, module
        path = str(modules[module].relative_to(ROOT))
        for name in files:
            text = (ROOT / name).read_text()
            imported = any(module == target or f"{module}." in target
                           for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom))
                           for target in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                                          [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]))
            if not (imported or module in text or path in text):
                unnamed.append(f"{name} does not name {module}")
    assert unnamed == []
