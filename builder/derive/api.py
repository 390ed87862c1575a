"""A package's API read from its own published files: what a version imports from the other packages of the
stack when a training job loads it (consumer side), and which of those names each version of a provider has.

Consumer side (`uses`): an AST walk over the modules a fine-tuning job loads (data/knowledge/surface.yaml), and
every module of the same package they import at import time, transitively. A reference into another package is
recorded with the phase it runs in: "import" (module level, decorators, class bodies: the job fails at
`from transformers import Trainer`) or "call" (inside a function: it fails when that code runs). References
that the code itself guards are not recorded: under `if TYPE_CHECKING`, in a `try` that catches ImportError or
AttributeError, behind a version or `hasattr` test, or in the `else` of a presence test. A presence test of a
package of the stack (`if is_accelerate_available():`) guards nothing: that package is installed.

Provider side (`exports`): griffe visits one module file statically (no import, no execution) and lists what it
binds, following `from .x import *` into the target's `__all__` (or its public names). A module that computes
its namespace at run time (a module `__getattr__`, `globals()` writes, a star import griffe cannot follow) is
"open": absence there cannot be judged and is not claimed.
"""

from __future__ import annotations

import ast
import hashlib
import re
import tarfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# Exceptions whose handler makes a `try` body optional: the code expects the name may be missing.
_TOLERANT = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception", "BaseException", "TypeError",
             "RuntimeError", "OSError", "NameError"}
_ORDER = {".py": 0, ".pyi": 1, ".so": 2}  # the source a module's names are best read from first
_AVAILABLE = re.compile(r"^is_([a-z0-9_]+?)_available$")
MAX_FILE = 4 << 20  # a source file larger than this is generated data, not code a consumer imports from


@dataclass(frozen=True)
class Use:
    path: str  # dotted: provider module [+ name], e.g. accelerate.utils.DataLoaderConfiguration
    module: str  # the consumer module that holds the reference
    phase: str  # "import" or "call"


# --- reading an artifact ----------------------------------------------------------------------------------


@dataclass
class Package:
    """A distribution's Python sources (.py, .pyi) and compiled module names, read from its wheel or sdist into
    memory (nothing is unpacked or run): module -> (suffix, text), the best source first (.py, .pyi, compiled)."""

    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    stubs: dict[str, str] = field(default_factory=dict)  # module -> .pyi text, also where a .py or .so exists
    packages: set[str] = field(default_factory=set)  # modules that are packages (an __init__)

    @classmethod
    def read(cls, artifact: Path, tops: Iterable[str]) -> Package:
        pkg = cls()
        tops = set(tops)
        sdist = not artifact.name.endswith(".whl")
        for name, read in _members(artifact):
            rel = _site_path(name, sdist)
            if rel is not None and rel.parts[0].split(".")[0] in tops:
                pkg._add(rel, read)
        return pkg

    def _add(self, rel: PurePosixPath, read) -> None:
        suffix, stem = rel.suffix, rel.with_suffix("")
        parts = stem.parts[:-1] if stem.name == "__init__" else stem.parts
        if not parts or not all(p.isidentifier() for p in parts):
            return
        module = ".".join(parts)
        if stem.name == "__init__":
            self.packages.add(module)
        if suffix == ".pyi":
            self.stubs[module] = read().decode("utf-8", "replace")
        current = self.files.get(module)
        if current is None or _ORDER[suffix] < _ORDER[current[0]]:
            text = {".so": "", ".pyi": self.stubs.get(module, "")}.get(suffix)
            self.files[module] = (suffix, read().decode("utf-8", "replace") if text is None else text)

    def is_package(self, module: str) -> bool:
        return module in self.packages

    def source(self, module: str) -> tuple[str, str] | None:
        """(suffix, text) to read `module`'s names from: its .py, else its stub; None for a compiled module
        without a stub."""
        found = self.files.get(module)
        if found is None:
            return None
        if found[0] == ".so":
            return (".pyi", self.stubs[module]) if module in self.stubs else None
        return found


def _members(artifact: Path) -> Iterator[tuple[str, callable]]:
    wanted = (".py", ".pyi", ".so", ".pyd")
    if artifact.name.endswith(".whl"):
        with zipfile.ZipFile(artifact) as z:
            for info in z.infolist():
                if info.filename.endswith(wanted) and not info.is_dir() and info.file_size <= MAX_FILE:
                    yield info.filename, lambda i=info: z.read(i)
    else:
        with tarfile.open(artifact) as t:
            for member in t:
                if member.isfile() and member.name.endswith(wanted) and member.size <= MAX_FILE:
                    data = t.extractfile(member).read()
                    yield member.name, lambda d=data: d


def _site_path(name: str, sdist: bool) -> PurePosixPath | None:
    """Where a member lands in site-packages: a wheel's as it is, an sdist's without its NAME-VERSION/ folder
    (and a src/ layout); compiled modules by their module name (torch/_C.cpython-311-darwin.so -> torch/_C.so)."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return None
    parts = path.parts[1:] if sdist else path.parts
    if sdist and parts[:1] == ("src",):
        parts = parts[1:]
    if not parts or parts[0].endswith((".dist-info", ".data", ".egg-info")):
        return None
    last = parts[-1]
    if last.endswith((".so", ".pyd")):
        parts = (*parts[:-1], last.split(".", 1)[0] + ".so")
    return PurePosixPath(*parts)


# --- consumer side --------------------------------------------------------------------------------------


def uses(pkg: Package, top: str, surface: Iterable[str], stack: dict[str, str]) -> list[Use]:
    """Every reference from the training-surface modules of `top` (and what they import of their own package
    at import time) into the packages of `stack` ({import name: distribution}), unguarded, deduplicated."""
    seen: set[str] = set()
    queue = [m for m in surface if m in pkg.files]
    found: dict[str, Use] = {}
    while queue:
        module = queue.pop()
        if module in seen:
            continue
        seen.add(module)
        queue.extend(_parents(module))
        found_src = pkg.files.get(module)
        if found_src is None or found_src[0] != ".py":
            continue
        walked, internal = _walk(module, pkg.is_package(module), top, found_src[1], stack)
        queue.extend(n for m in internal if (n := _nearest(pkg, m)))
        for use in walked:
            old = found.get(use.path)
            if old is None or (old.phase == "call" and use.phase == "import"):
                found[use.path] = use
    return sorted(found.values(), key=lambda u: u.path)


# Most files are the same from one release to the next: what a file says is read once per distinct text.
_WALKED: dict[tuple, tuple[tuple[Use, ...], tuple[str, ...]]] = {}
_VISITED: dict[tuple, tuple] = {}


def _walk(module: str, is_package: bool, top: str, text: str, stack: dict[str, str]):
    key = (module, is_package, top, tuple(sorted(stack.items())), hashlib.sha1(text.encode()).digest())
    if key not in _WALKED:
        walker = _Walker(module, is_package, top, set(stack), stack)
        walker.run(text)
        _WALKED[key] = (tuple(walker.found), tuple(walker.internal))
    return _WALKED[key]


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _nearest(pkg: Package, dotted: str) -> str | None:
    """`from .x import y` names module x.y or name y of x: the longest prefix that is a module."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in pkg.files:
            return ".".join(parts[:i])
    return None


class _Walker:
    """One module's statements in execution order, with the guard and phase each runs under."""

    def __init__(self, module: str, is_package: bool, top: str, stack_names: set[str], stack: dict[str, str]):
        self.module, self.top, self.stack = module, top, stack
        self.package = module if is_package else module.rpartition(".")[0]
        # A presence test names the package (is_torch_available, is_peft_available); normalised spellings.
        self.present = {n.replace("-", "_").lower() for n in (*stack_names, *stack.values())}
        self.found: list[Use] = []
        self.internal: list[str] = []
        self.lazy_annotations = False
        # Which of this module's functions run at import time: called from module level (a logger made by
        # LoggerFactory.create_logger(), a class instantiated) or from such a function. Their uses are "import".
        self._owner: str | None = None  # the function whose body is being walked ("f", "Class.method")
        self._class: str | None = None
        self._owned: list[tuple[int, str]] = []  # (index into found, owner)
        self._calls: dict[str, set[str]] = defaultdict(set)  # caller ("" = import time) -> callees
        self._classes: set[str] = set()

    def run(self, text: str) -> None:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            return  # a file for another Python version; nothing it references can be judged
        self.lazy_annotations = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                                    any(a.name == "annotations" for a in n.names) for n in tree.body)
        self._block(tree.body, {}, guarded=False, phase="import")
        self._promote()

    def _promote(self) -> None:
        running, todo = set(), list(self._calls.get("", ()))
        while todo:
            callee = todo.pop()
            for name in (callee, f"{callee}.__init__", f"{callee}.__post_init__") if callee in self._classes \
                    else (callee,):
                if name not in running:
                    running.add(name)
                    todo.extend(self._calls.get(name, ()))
        for at, owner in self._owned:
            if owner in running and self.found[at].phase == "call":
                self.found[at] = Use(self.found[at].path, self.module, "import")

    # statements --------------------------------------------------------------------------------------
    def _block(self, body: list[ast.stmt], aliases: dict[str, str], guarded: bool, phase: str) -> None:
        for stmt in body:
            self._stmt(stmt, aliases, guarded, phase)

    def _stmt(self, node: ast.stmt, aliases: dict[str, str], guarded: bool, phase: str) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self._imported(a.name, node, aliases, guarded, phase)
                top = a.name.split(".")[0]
                aliases[a.asname or top] = a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = self._absolute(node)
            if base is None:
                return
            for a in node.names:
                target = base if a.name == "*" else f"{base}.{a.name}"
                self._imported(target, node, aliases, guarded, phase)
                if a.name != "*":
                    aliases[a.asname or a.name] = target
        elif isinstance(node, ast.If):
            kind = self._test(node.test)
            if kind == "type_checking":
                self._block(node.orelse, aliases, guarded, phase)
                return
            if kind == "main":
                return
            self._expr(node.test, aliases, guarded, phase)
            self._block(node.body, aliases, guarded or kind == "guard", phase)
            self._block(node.orelse, aliases, True, phase)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            tolerant = any(self._tolerant(h.type) for h in node.handlers)
            self._block(node.body, aliases, guarded or tolerant, phase)
            for h in node.handlers:
                self._block(h.body, aliases, True, phase)
            self._block(node.orelse, aliases, True, phase)
            self._block(node.finalbody, aliases, guarded, phase)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                self._expr(d, aliases, guarded, phase)
            self._arguments(node.args, node.returns, aliases, guarded, phase)
            outer = self._owner
            # Module functions and methods of module classes are named; nested ones share their parent's name.
            if outer is None:
                self._owner = f"{self._class}.{node.name}" if self._class else node.name
            self._block(node.body, dict(aliases), guarded, "call")
            self._owner = outer
        elif isinstance(node, ast.ClassDef):
            for e in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
                self._expr(e, aliases, guarded, phase)
            outer = self._class
            if self._owner is None and outer is None:
                self._class = node.name
                self._classes.add(node.name)
            self._block(node.body, dict(aliases), guarded, phase)
            self._class = outer
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self._expr(item.context_expr, aliases, guarded, phase)
            self._block(node.body, aliases, guarded, phase)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._expr(node.iter if isinstance(node, (ast.For, ast.AsyncFor)) else node.test, aliases, guarded, phase)
            self._block(node.body, aliases, guarded, phase)
            self._block(node.orelse, aliases, guarded, phase)
        elif type(node).__name__ == "Match":
            self._expr(node.subject, aliases, guarded, phase)
            for case in node.cases:
                self._block(case.body, aliases, True, phase)
        else:
            self._expr(node, aliases, guarded, phase)

    def _arguments(self, args: ast.arguments, returns, aliases, guarded: bool, phase: str) -> None:
        for d in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            self._expr(d, aliases, guarded, phase)
        if self.lazy_annotations:
            return
        every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
        for a in every:
            if a is not None and a.annotation is not None:
                self._expr(a.annotation, aliases, guarded, phase)
        if returns is not None:
            self._expr(returns, aliases, guarded, phase)

    # expressions -------------------------------------------------------------------------------------
    def _expr(self, node: ast.AST, aliases: dict[str, str], guarded: bool, phase: str) -> None:
        if isinstance(node, ast.Call) and not guarded:
            caller = "" if phase == "import" else self._owner
            callee = self._callee(node.func)
            if callee is not None and caller is not None:
                self._calls[caller].add(callee)
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is not None and chain[0] in aliases:
                self._ref(".".join([aliases[chain[0]], *chain[1:]]), guarded, phase)
                return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._stmt(node, aliases, guarded, phase)
            return
        if isinstance(node, ast.Lambda):
            self._expr(node.body, aliases, guarded, "call")
            return
        if isinstance(node, ast.BoolOp):
            # `hasattr(torch, "compiler") and torch.compiler.is_compiling()`: what follows a test is guarded.
            first, *rest = node.values
            self._expr(first, aliases, guarded, phase)
            for value in rest:
                self._expr(value, aliases, True, phase)
            return
        if isinstance(node, ast.IfExp):
            self._expr(node.test, aliases, guarded, phase)
            self._expr(node.body, aliases, True, phase)
            self._expr(node.orelse, aliases, True, phase)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self._stmt(child, aliases, guarded, phase)
            else:
                self._expr(child, aliases, guarded, phase)

    # helpers -----------------------------------------------------------------------------------------
    def _callee(self, func: ast.expr) -> str | None:
        """The module function or method a call names: f(), Class.method(), self.method() inside Class."""
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in ("self", "cls") and self._class:
                owner = self._class
            return f"{owner}.{func.attr}"
        return None

    def _absolute(self, node: ast.ImportFrom) -> str | None:
        if node.level == 0:
            return node.module
        base = self.package.split(".")
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        if not base or not base[0]:
            return None
        return ".".join([*base, *([node.module] if node.module else [])])

    def _imported(self, dotted: str, node: ast.AST, aliases, guarded: bool, phase: str) -> None:
        top = dotted.split(".")[0]
        if top == self.top:
            if phase == "import" and not guarded:
                self.internal.append(dotted)
            return
        self._ref(dotted, guarded, phase)

    def _ref(self, dotted: str, guarded: bool, phase: str) -> None:
        if not guarded and dotted.split(".")[0] in self.stack and dotted.split(".")[0] != self.top:
            if phase == "call" and self._owner is not None:
                self._owned.append((len(self.found), self._owner))
            self.found.append(Use(dotted, self.module, phase))

    def _test(self, test: ast.expr) -> str:
        """'type_checking', 'main', 'presence' (a stack package is installed: not a guard) or 'guard'."""
        names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
        if "TYPE_CHECKING" in names and not isinstance(test, ast.UnaryOp):
            return "type_checking"
        if "__name__" in names:
            return "main"
        calls = [test] if isinstance(test, ast.Call) else (
            test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [])
        if calls and all(self._presence(c) for c in calls):
            return "presence"
        return "guard"

    def _presence(self, node: ast.expr) -> bool:
        if not isinstance(node, ast.Call) or node.args or node.keywords:
            return False  # is_accelerate_available("0.28.0") is a version test
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        m = _AVAILABLE.match(name)
        return bool(m) and m.group(1) in self.present

    @staticmethod
    def _tolerant(handler_type: ast.expr | None) -> bool:
        if handler_type is None:
            return True
        types = handler_type.elts if isinstance(handler_type, ast.Tuple) else [handler_type]
        return any((t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")) in _TOLERANT for t in types)


def _chain(node: ast.Attribute) -> list[str] | None:
    parts = []
    cur: ast.AST = node
    while isinstance(cur, ast.Attribute):
        parts.append(cur.attr)
        cur = cur.value
    if not isinstance(cur, ast.Name):
        return None
    return [cur.id, *reversed(parts)]


# --- provider side --------------------------------------------------------------------------------------


def lookup(pkg: Package, module: str, name: str, memo: dict | None = None, _depth: int = 0) -> str | None:
    """None when `module` binds `name` at its top level (read statically by griffe, star imports followed only as
    far as needed); 'open: why' when the module makes names at run time, so absence cannot be claimed; else ''."""
    memo = {} if memo is None else memo
    key = (module, name)
    if key in memo:
        return memo[key]
    memo[key] = ""  # a star-import cycle finds nothing more
    if f"{module}.{name}" in pkg.files:  # a submodule is an attribute once imported, and importable by name
        memo[key] = None
        return None
    src = pkg.source(module) if module in pkg.files else None
    if src is None:
        memo[key] = "open: a compiled module without a stub" if module in pkg.files else ""
        return memo[key]
    own, stars, why = _visit(module, pkg.is_package(module), *src)
    if name in own:
        memo[key] = None
        return None
    found = f"open: {why}" if why else ""
    for target in stars:
        if target not in pkg.files and target.split(".")[0] == module.split(".")[0]:
            continue  # a module of its own package that does not exist (a stale TYPE_CHECKING line) binds nothing
        if _depth > 8 or target not in pkg.files:
            found = found or f"open: `from {target} import *` cannot be followed"
            continue
        declared = _declared_all(pkg, target)
        if declared is not None and name not in declared:
            continue  # `import *` takes only __all__
        if declared is None and name.startswith("_"):
            continue  # and without __all__, only public names
        inner = lookup(pkg, target, name, memo, _depth + 1)
        if inner is None:
            memo[key] = None
            return None
        if inner.startswith("open:"):
            found = found or f"open: `from {target} import *`: {inner[len('open: '):]}"
    memo[key] = found
    return found


def _declared_all(pkg: Package, module: str) -> frozenset[str] | None:
    src = pkg.source(module)
    if src is None:
        return None
    key = ("__all__", module, hashlib.sha1(src[1].encode()).digest())
    if key not in _VISITED:
        declared = _all_of(src[1])
        _VISITED[key] = None if declared is None else frozenset(declared)
    return _VISITED[key]


def _visit(module: str, is_package: bool, suffix: str, text: str) -> tuple[frozenset[str], tuple[str, ...], str]:
    """(names the file binds, modules it star-imports, why its namespace is dynamic or ''), by griffe."""
    key = (module, is_package, suffix, hashlib.sha1(text.encode()).digest())
    if key in _VISITED:
        return _VISITED[key]
    import griffe

    filepath = Path(*module.split("."), "__init__" + suffix) if is_package else \
        Path(*module.split(".")).with_suffix(suffix)
    try:
        visited = griffe.visit(module, filepath=filepath, code=text)
    except Exception as exc:  # griffe raises its own and AST errors on code for another Python
        found = (frozenset(), (), f"griffe could not read it ({type(exc).__name__})")
    else:
        own = frozenset(n for n in visited.members if not n.endswith("/*"))
        stars = tuple(getattr(m, "target_path", "") for n, m in visited.members.items() if n.endswith("/*"))
        # A star import written only for type checkers (lazy modules mirror their names so) never runs: one that
        # cannot be followed (a stale line naming a module that is not there) makes nothing.
        typing_only = _typing_only_stars(module, is_package, text)
        stars = tuple(t for t in stars if t not in typing_only or t.split(".")[0] == module.split(".")[0])
        found = (own, stars, _dynamic(text))
    _VISITED[key] = found
    return found


def _typing_only_stars(module: str, is_package: bool, text: str) -> set[str]:
    """Absolute targets of `from X import *` lines that appear under `if TYPE_CHECKING:` and nowhere else."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    package = module if is_package else module.rpartition(".")[0]
    typing, runtime = set(), set()

    def target(node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def visit(body, typed: bool) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                (typing if typed else runtime).add(target(node))
            elif isinstance(node, ast.If):
                checking = any(isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", ""))
                               == "TYPE_CHECKING" for n in ast.walk(node.test))
                visit(node.body, typed or checking)
                visit(node.orelse, typed)
            elif isinstance(node, ast.Try):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    visit(block, typed)

    visit(tree.body, False)
    return typing - runtime


def _all_of(text: str) -> list[str] | None:
    # Most modules that declare __all__ do it once, as a literal at the end (transformers' 1,000 modeling files):
    # parse that tail alone before the whole file.
    at = text.rfind("\n__all__ = ")
    if at >= 0 and text.count("__all__") == 1:
        try:
            tail = ast.parse(text[at + 1:])
            if len(tail.body) == 1 and isinstance(tail.body[0], ast.Assign):
                return list(ast.literal_eval(tail.body[0].value))
        except (SyntaxError, ValueError):
            pass
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    found = None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None  # built at run time: fall back to the public names
            found = (found or []) + list(value) if isinstance(node, ast.AugAssign) else list(value)
    return found


def _dynamic(text: str) -> str:
    """Why a module's namespace is made at run time, or '' when what griffe sees is all there is."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return "not parseable by this Python"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return "a module __getattr__ makes names on demand"
    for node in ast.walk(tree):
        # globals()[name] = …, globals().update(…): reading globals()["__file__"] makes nothing.
        if isinstance(node, ast.Subscript) and _is_globals(node.value) and isinstance(node.ctx, ast.Store):
            return "it writes globals()"
        if isinstance(node, ast.Attribute) and _is_globals(node.value) and node.attr in ("update", "setdefault"):
            return "it writes globals()"
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
                node.value.attr == "modules" and isinstance(node.ctx, ast.Store):
            if "TYPE_CHECKING" not in text:  # lazy modules that mirror their names for type checkers are closed
                return "it replaces itself in sys.modules"
    return ""


def _is_globals(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "globals"


def resolve(pkg: Package, dotted: str, cache: dict) -> str | None:
    """None when `dotted` (module, or module + name) exists in the package; else why not ('open: …' when the
    module makes its names at run time, so absence cannot be judged)."""
    parts = dotted.split(".")
    if dotted in pkg.files:
        return None
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        if module not in pkg.files:
            continue
        found = lookup(pkg, module, parts[i], cache)
        if found is None or found.startswith("open:"):
            return found if found is None else f"open: {module} ({found[len('open: '):]})"
        return f"{module} has no name {parts[i]}"
    return f"no module {parts[0] if len(parts) == 1 else '.'.join(parts[:-1])}"
