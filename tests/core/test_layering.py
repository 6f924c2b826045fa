"""The package's layering, checked on the source: the core (every module under specdec_np/ outside
tools/, at any depth) imports no tool and reads no machine file or cost cache, and the package's
own imports form no cycle."""

import ast
from pathlib import Path

import pytest

import specdec_np

PACKAGE = Path(specdec_np.__file__).resolve().parent
LOADERS = ("files.py", "checkpoint.py", "models.py", "tokenizer.py", "ngram.py", "eagle.py")  # the core's only readers of files


def module_name(path: Path) -> str:
    """specdec_np/tools/cli.py -> "specdec_np.tools.cli"; a package's __init__.py -> the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The absolute names of the modules `path` imports, relative imports resolved against its
    package; `from package import name` counts as importing package.name where that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def internal_imports() -> dict[str, set[str]]:
    """{module: the package's modules it imports}."""
    known = modules()
    return {name: {m for m in imported(path) if m in known and m != name} for name, path in known.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle [a, b, ..., a] of `graph`, or None (a depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node))), None)


def test_the_core_imports_no_tool_and_reads_no_file():
    """No core module, at any depth, imports the tools, reads /proc/cpuinfo or a cost cache; only the
    loaders of models, vocabularies and n-grams open files."""
    core = [p for p in sorted(PACKAGE.rglob("*.py")) if "tools" not in p.relative_to(PACKAGE).parts]
    assert PACKAGE / "proofs" / "exact.py" in core  # the search reaches below the top level
    for path in core:
        text = path.read_text()
        if path.name != "__main__.py":  # the entry point hands over to the tools
            tools = [m for m in imported(path) if m == "specdec_np.tools" or m.startswith("specdec_np.tools.")]
            assert not tools, f"{path.relative_to(PACKAGE)} imports {tools}"
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
                    assert path.name in LOADERS, f"{path.relative_to(PACKAGE)} opens a file"
        assert "cpuinfo" not in text and "XDG" not in text and "profile.json" not in text, path.name


# What asks the operating system about the machine: a call, or a module of such calls.
MACHINE_CALLS = ("cpu_count", "process_cpu_count", "sched_getaffinity", "getloadavg", "sysconf", "getrlimit", "uname")
MACHINE_MODULES = ("resource", "platform", "psutil", "multiprocessing")


def machine_reads(text: str) -> list[str]:
    """What the source `text` reads of the machine: a /proc or /sys path, a call or module that asks the system
    about it, or an environment variable other than the weights directory's (WEIGHTS_ENV, documented in files.py)."""
    tree = ast.parse(text)

    def environ(node):
        return isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
            getattr(node.value, "id", None) == "os"
    allowed = set()  # os.environ in an expression that names WEIGHTS_ENV: the documented variable
    for node in ast.walk(tree):
        if isinstance(node, (ast.Subscript, ast.Compare, ast.Call)) and any(
                isinstance(n, ast.Name) and n.id == "WEIGHTS_ENV" for n in ast.walk(node)):
            allowed.update(id(n) for n in ast.walk(node) if environ(n))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(("/proc", "/sys")):
            found.append(node.value)
        elif isinstance(node, ast.Attribute) and node.attr in MACHINE_CALLS:
            found.append(node.attr)
        elif environ(node) and id(node) not in allowed:
            found.append(f"os.{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [n for n in names if n.split(".")[0] in MACHINE_MODULES]
    return found


def test_the_core_reads_nothing_of_the_machine():
    """The core is a function of its arguments: no module outside tools/ reads /proc or /sys, asks the system about
    the machine (cores, memory limits, its name) or reads an environment variable but the weights directory's."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "tools" not in path.relative_to(PACKAGE).parts:
            assert not machine_reads(path.read_text()), f"{path.relative_to(PACKAGE)} reads the machine"


def test_the_machine_read_search_finds_them():
    """The negative control: each kind of read is found, in the forms the core's own code would take."""
    assert machine_reads('open("/proc/meminfo")') == ["/proc/meminfo"]
    assert machine_reads("import os\nn = os.cpu_count()") == ["cpu_count"]
    assert machine_reads("import resource") == ["resource"]
    assert machine_reads('x = os.environ.get("HOME")') == ["os.environ"]
    assert machine_reads("x = os.environ[WEIGHTS_ENV] if WEIGHTS_ENV in os.environ else None") == []
    assert "checkpoint" in str([p for p in PACKAGE.glob("*.py") if "os.environ" in p.read_text()])  # it looks there


def test_the_packages_imports_have_no_cycle():
    graph = internal_imports()
    assert "specdec_np.tools.options" in graph["specdec_np.tools.cli"]  # relative imports are read
    assert "specdec_np.sampling" in graph["specdec_np.proofs.exact"]  # and from a subpackage (from ..sampling)
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_weights_scripts_imports_have_no_cycle():
    """weights/'s scripts import each other by their file names (sys.path holds weights/): no cycle among them
    (recipe.py and train_eagle.py share train_tiny.py's code instead of importing each other)."""
    scripts = {p.stem: p for p in (PACKAGE.parent / "weights").glob("*.py")}
    if not scripts:
        pytest.skip("no weights/ scripts here (an installed package)")
    graph = {name: {m.split(".")[0] for m in imported(path) if m.split(".")[0] in scripts} - {name}
             for name, path in scripts.items()}
    assert "train_tiny" in graph["recipe"]  # the graph is read
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_cycle_search_finds_a_cycle():
    """The negative control: an import cycle, direct or through other modules, is found."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"a"}}) == ["a", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    graph = internal_imports()
    graph["specdec_np.tree"] = graph["specdec_np.tree"] | {"specdec_np.decode"}  # the core's top imports its base
    assert cycle(graph) is not None
