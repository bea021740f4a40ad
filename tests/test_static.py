"""The page's script, checked like the Python: small ES modules whose imports resolve, served as JavaScript.

``streamlab/static/`` is loaded by the browser as it is, with no bundler and
no build step, so nothing else would notice a module that grew past the size
cap, an import of a file that is not there or of a name its module does not
export, or a module the server sends with a type a browser refuses to run
(a module script must come as JavaScript). The browser tests
(tests/test_browser.py) drive the page itself; these are the quick checks.

The imports are read with regular expressions, which is enough for how the
page writes them: top-level ``import {a, b} from "./x.js";`` and
``export function/const/class name`` (or ``export {a, b}``), each starting a
line. Any other statement starting a line with ``import`` or ``export``
fails the check rather than being skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

STATIC = Path(__file__).resolve().parent.parent / "streamlab" / "static"
VENDOR = STATIC / "vendor"  # third-party files, copied as published (static/vendor/README.md)
MAX_LINES = 600  # the size cap, as for the Python modules

IDENT = r"[A-Za-z_$][\w$]*"
SPEC = r"""(?P<q>["'])(?P<spec>[^"'\n]+)(?P=q)"""
IMPORT = re.compile(rf"import\s+(?:(?P<what>[^;\"']*?)\s+from\s+)?{SPEC}\s*;?")
REEXPORT = re.compile(rf"export\s+(?P<what>\{{[^}}]*\}}|\*(?:\s+as\s+{IDENT})?)\s+from\s+{SPEC}\s*;?")
DECLARED = re.compile(rf"export\s+(?:async\s+)?(?:function\s*\*?|class|const|let|var)\s*(?P<name>{IDENT})")
LISTED = re.compile(r"export\s*\{(?P<names>[^}]*)\}\s*;?")
DEFAULT = re.compile(r"export\s+default\b")
STATEMENT = re.compile(r"^(?:import|export)\b", re.M)
MODULE_SCRIPT = re.compile(r"""<script\b[^>]*\btype=["']module["'][^>]*\bsrc=["'](?P<src>[^"']+)["']""")
SCRIPT_SRC = re.compile(r"""<script\b[^>]*\bsrc=["'](?P<src>[^"']+)["']""")


def own_files() -> list[Path]:
    """Every file of the page that is the project's own (not vendored)."""
    return sorted(p for p in STATIC.rglob("*") if p.is_file() and VENDOR not in p.parents)


def modules() -> list[Path]:
    return [p for p in own_files() if p.suffix == ".js"]


def braced(what: str) -> list[tuple[str, str]]:
    """``{a, b as c}`` → ``[("a", "a"), ("b", "c")]``: (the name in the module, the name here)."""
    pairs = []
    for item in what.strip().strip("{}").split(","):
        item = item.strip()
        if item:
            name, _, local = (part.strip() for part in item.partition(" as "))
            pairs.append((name, local or name))
    return pairs


class Module:
    """What one module imports (``[(file, names or None for all)]``) and exports, read from its text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.imports: list[tuple[Path, list[str] | None, str]] = []  # (file, names wanted, as written)
        self.exports: set[str] = set()
        self.unread: list[str] = []  # statements none of the patterns reads
        text = path.read_text(encoding="utf-8")
        for start in STATEMENT.finditer(text):
            pos = start.start()
            if m := IMPORT.match(text, pos):
                self.imports.append((self.resolve(m["spec"]), self.names(m["what"] or ""), m["spec"]))
            elif m := REEXPORT.match(text, pos):
                names = None if m["what"].startswith("*") else [n for n, _ in braced(m["what"])]
                self.imports.append((self.resolve(m["spec"]), names, m["spec"]))
                if m["what"].startswith("{"):
                    self.exports.update(local for _, local in braced(m["what"]))
            elif m := DECLARED.match(text, pos):
                self.exports.add(m["name"])
            elif m := LISTED.match(text, pos):
                self.exports.update(local for _, local in braced(m["names"]))
            elif DEFAULT.match(text, pos):
                self.exports.add("default")
            else:
                self.unread.append(text[pos:].split("\n", 1)[0])

    def resolve(self, spec: str) -> Path:
        if not spec.startswith(("./", "../")):
            raise AssertionError(f"{self.name}: import {spec!r} is not a relative path (there is no bundler)")
        return (self.path.parent / spec).resolve()

    @staticmethod
    def names(what: str) -> list[str] | None:
        """The names an import clause wants: ``x`` is ``default``, ``* as x`` everything, ``{a, b}`` those."""
        wanted: list[str] = []
        for part in re.findall(r"\{[^}]*\}|\*\s+as\s+" + IDENT + "|" + IDENT, what):
            if part.startswith("{"):
                wanted += [name for name, _ in braced(part)]
            elif part.startswith("*"):
                return None
            else:
                wanted.append("default")
        return wanted

    @property
    def name(self) -> str:
        return self.path.relative_to(STATIC).as_posix()


def read_modules() -> dict[Path, Module]:
    return {p.resolve(): Module(p) for p in modules()}


def entry_points() -> list[Path]:
    """The module scripts ``index.html`` loads (its URLs are relative to ``/``, where it is served)."""
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    return [(STATIC.parent / src).resolve() for src in MODULE_SCRIPT.findall(html)]


def test_no_file_of_the_page_reaches_the_size_cap():
    sizes = {p.relative_to(STATIC).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in own_files()}
    assert "app.js" in sizes and len(modules()) > 1, sizes
    assert {name: n for name, n in sizes.items() if n >= MAX_LINES} == {}


def test_the_page_loads_its_script_as_modules_and_every_script_is_there():
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert entry_points() == [(STATIC / "app.js").resolve()]
    for src in SCRIPT_SRC.findall(html):
        assert src.startswith("static/") and (STATIC.parent / src).is_file(), src


def test_every_import_resolves_to_a_module_that_exports_the_name():
    found = read_modules()
    problems = []
    for module in found.values():
        problems += [f"{module.name}: a statement this check cannot read: {line}" for line in module.unread]
        for target, names, spec in module.imports:
            if target not in found:
                problems.append(f"{module.name}: imports {spec!r}, which is no module of the page")
                continue
            missing = sorted(set(names or ()) - found[target].exports)
            if missing:
                problems.append(f"{module.name}: imports {missing} from {spec!r}, which does not export them")
    assert problems == []
    # The patterns read something: every module exports or imports, and the entry imports others.
    assert all(m.imports or m.exports for m in found.values())


def test_the_modules_import_one_way_and_each_is_loaded_by_the_page():
    found = read_modules()
    graph = {path: [target for target, _, _ in m.imports if target in found] for path, m in found.items()}
    state: dict[Path, str] = {}
    cycles = []

    def visit(path: Path, trail: list[Path]) -> None:
        if state.get(path) == "done":
            return
        if state.get(path) == "open":
            cycles.append(" → ".join(found[p].name for p in [*trail[trail.index(path):], path]))
            return
        state[path] = "open"
        for target in graph[path]:
            visit(target, [*trail, path])
        state[path] = "done"

    for entry in entry_points():
        visit(entry, [])
    assert cycles == [], "the modules import in a circle"
    unloaded = sorted(found[p].name for p in found if p not in state)
    assert unloaded == [], "modules no page loads (nothing imports them)"


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to parse the modules with")
def test_every_module_parses_as_an_es_module():
    def check(source: bytes) -> subprocess.CompletedProcess:
        # --input-type applies to standard input: a module's grammar, strict mode included, whatever the suffix.
        return subprocess.run(["node", "--input-type=module", "--check"], input=source, capture_output=True, timeout=60)

    assert check(b"export const x = 1;\nwith (x) {}\n").returncode != 0, "node did not check as a module"
    failures = {}
    for path in modules():
        done = check(path.read_bytes())
        if done.returncode != 0:
            failures[path.relative_to(STATIC).as_posix()] = done.stderr.decode(errors="replace")[-2000:]
    assert failures == {}


def test_the_server_serves_every_module_as_javascript(app):
    with httpx.Client(base_url=app.url, timeout=10) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert '<script type="module" src="static/app.js">' in page.text
        for path in [*modules(), *sorted(VENDOR.glob("*.js"))]:
            url = "/static/" + path.relative_to(STATIC).as_posix()
            reply = http.get(url)
            assert reply.status_code == 200, url
            assert reply.headers["content-type"].split(";")[0].strip() == "text/javascript", (url, reply.headers)
            assert reply.headers.get("x-content-type-options") == "nosniff", url
            assert reply.content == path.read_bytes(), url


def test_the_wheel_takes_every_file_of_the_page():
    tomllib = pytest.importorskip("tomllib")
    with open(STATIC.parent.parent / "pyproject.toml", "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["streamlab"]
    package = STATIC.parent
    taken = {p for pattern in globs for p in package.glob(pattern) if p.is_file()}
    files = [p for p in STATIC.rglob("*") if p.is_file()]
    assert [p.relative_to(package).as_posix() for p in files if p not in taken] == []
