"""The loop transform and the import hook, in process: instrumented code must behave exactly
like the original (outputs, results, exceptions, line numbers), and only the user's modules
may be instrumented."""

from __future__ import annotations

import ast
import contextlib
import sys
import textwrap
import threading
import traceback

import pytest
import xxhash

from gpusnap.instrument import cache, importer, loops, transform

# ---------------------------------------------------------------------------------------------
# Snippets: each runs with an `out` list in its globals and appends what it observes.

SNIPPETS = {
    "for_else": """
        for i in range(3):
            out.append(i)
        else:
            out.append("else")
        for i in range(5):
            if i == 2:
                break
        else:
            out.append("not reached")
        out.append(i)
        for i in []:
            pass
        else:
            out.append("empty-else")
    """,
    "while_else": """
        n = 0
        while n < 3:
            n += 1
        else:
            out.append(("else", n))
        while True:
            n += 1
            if n > 6:
                break
        else:
            out.append("not reached")
        out.append(n)
        while False:
            pass
        else:
            out.append("false-else")
    """,
    "continue": """
        for i in range(6):
            if i % 2:
                continue
            out.append(i)
        n = 0
        while n < 6:
            n += 1
            if n % 3:
                continue
            out.append(-n)
        else:
            out.append("done")
    """,
    "return_nested": """
        def find(grid, target):
            for r, row in enumerate(grid):
                for c, v in enumerate(row):
                    k = 0
                    while True:
                        k += 1
                        if v == target:
                            return (r, c, k)
                        break
            return None
        out.append(find([[1, 2], [3, 4]], 4))
        out.append(find([[1, 2], [3, 4]], 9))
    """,
    "generators": """
        def gen(n):
            for i in range(n):
                j = 0
                while j < i:
                    yield (i, j)
                    j += 1
        out.append(list(gen(4)))
        g = gen(10)
        out.append([next(g), next(g)])
        g.close()
        def take(it, n):
            for x in it:
                if n == 0:
                    return
                n -= 1
                yield x
        out.append(list(take(gen(5), 3)))
        out.append(sum(x for x in range(10)))
    """,
    "class_body": """
        class C:
            __private = 1
            items = []
            for __k in range(3):
                items.append(__k * __private)
            n = 0
            while n < 2:
                n += 1
            else:
                items.append("else")
            def method(self):
                acc = []
                i = 0
                while i < 2:
                    for __j in range(2):
                        acc.append((i, __j, self.__private))
                    i += 1
                return acc
        out.append(C.items)
        out.append(C().method())
        out.append(sorted(k for k in vars(C) if not k.startswith("__") and "gpusnap" not in k))
        class D:
            while True:
                break
            else:
                pass
            for x in "ab":
                pass
        out.append(D.x)
    """,
    "exceptions": """
        def bad():
            yield 1
            yield 2
            raise KeyError("from generator")
        try:
            for x in bad():
                out.append(x)
        except KeyError as e:
            out.append(repr(e))
        try:
            for x in 5:
                pass
        except TypeError as e:
            out.append(str(e))
        try:
            n = 0
            while n < 10:
                n += 1
                if n == 3:
                    raise ValueError(n)
        except ValueError as e:
            out.append(repr(e))
        def cond():
            raise OSError("in condition")
        try:
            while cond():
                pass
        except OSError as e:
            out.append(repr(e))
        d = {1: 1}
        try:
            for k in d:
                d[k + 1] = 0
        except RuntimeError as e:
            out.append(str(e))
        try:
            for i in range(3):
                try:
                    1 / (i - 1)
                finally:
                    out.append(("finally", i))
        except ZeroDivisionError:
            out.append("zde")
    """,
    "enumerate_zip": """
        for i, c in enumerate("abc", start=10):
            out.append((i, c))
        for i, c in enumerate("ab", 5):
            out.append((i, c))
        for a, b in zip([1, 2, 3], "xyz"):
            out.append((a, b))
        try:
            for a, b in zip([1, 2, 3], "xy", strict=True):
                out.append((a, b))
        except ValueError as e:
            out.append(str(e))
        pairs = [[1, 2], [3, 4]]
        for t in zip(*pairs):
            out.append(t)
        kw = {"start": 3}
        for t in enumerate("q", **kw):
            out.append(t)
        for t in enumerate(zip("ab", "cd")):
            out.append(t)
    """,
    "shadowed_enumerate": """
        def enumerate(x, start=0):
            return [("mine", x, start)]
        for t in enumerate("z", start=2):
            out.append(t)
        zip = lambda *a: iter([a])
        for t in zip(1, 2):
            out.append(t)
    """,
    "walrus": """
        data = [3, 2, 1, 0, 5]
        pos = 0
        while (v := data[pos]) != 0:
            out.append(v)
            pos += 1
        out.append(v)
        for w in (ys := [1, 2]):
            out.append(w)
        out.append(ys)
    """,
    "targets": """
        for a, (b, *c) in [(1, (2, 3, 4)), (5, (6,))]:
            out.append((a, b, c))
        obj = type("O", (), {})()
        store = {}
        for obj.attr in range(2):
            pass
        for store["k"] in "xy":
            pass
        out.append((obj.attr, store))
        for i in range(3):
            pass
        out.append(i)
    """,
    "nesting": """
        import contextlib
        with contextlib.suppress(ZeroDivisionError):
            for i in range(3):
                if i:
                    while i:
                        i -= 1
                        try:
                            out.append(i)
                        finally:
                            for j in range(1):
                                out.append(("f", j))
        def outer():
            total = 0
            def inner(k):
                nonlocal total
                for q in range(k):
                    total += q
                return total
            for k in range(4):
                inner(k)
            return total
        out.append(outer())
        fns = []
        for i in range(3):
            fns.append(lambda i=i: i)
        out.append([f() for f in fns])
        match [1, 2]:
            case [x, y]:
                for z in (x, y):
                    out.append(z)
    """,
    "async": """
        async def agen():
            for i in range(2):
                yield i
        async def co():
            acc = []
            async for v in agen():
                acc.append(v)
            n = 0
            while n < 2:
                n += 1
                for m in range(n):
                    acc.append((n, m))
            return acc
        c = co()
        try:
            c.send(None)
        except StopIteration as e:
            out.append(e.value)
    """,
    "threads": """
        import threading
        res = []
        def work():
            for i in range(100):
                res.append(i)
            n = 0
            while n < 10:
                n += 1
        ts = [threading.Thread(target=work) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out.append(len(res))
    """,
}

SNIPPETS["deferred_calls"] = """
    import itertools
    from itertools import islice

    def tqdm(iterable, **kwargs):  # a wrapper by that name: gets the deferred enumerate
        return list(iterable)

    def gen(n):
        for i in range(n):
            yield i * i

    for x in islice(gen(20), 2, 15, 4):
        out.append(x)
    for i, x in enumerate(itertools.islice("abcdefgh", 5), start=3):
        out.append((i, x))
    for a, b in zip(islice(gen(9), 1, None), islice(range(100), 3)):
        out.append((a, b))
    for i, x in tqdm(enumerate(islice(gen(6), 4)), total=4):
        out.append((i, x))
    for x in islice(gen(5), 0):
        out.append("not reached")
    try:
        for x in islice(gen(5), -1):
            pass
    except ValueError as exc:
        out.append(str(exc)[:20])
"""

SNIPPETS["with_loops"] = """
    import contextlib

    @contextlib.contextmanager
    def tag(name):
        out.append(("enter", name))
        try:
            yield name.upper()
        finally:
            out.append(("exit", name))

    with tag("a") as a, tag("b"):
        for i in range(2):
            out.append((a, i))
    def f():
        for k in range(3):
            with tag(str(k)) as t:
                while True:
                    if k == 1:
                        return t
                    break
    out.append(f())
    try:
        with tag("raises"):
            for i in range(1):
                raise KeyError(i)
    except KeyError as exc:
        out.append(repr(exc))
    with tag("no loop"):
        out.append("body")
"""


def test_a_with_around_a_loop_keeps_its_context_manager_in_a_local_while_the_body_runs():
    """A snapshot at a boundary inside the body finds the entered object (its exit puts back what
    it saved at entry); a finished ``with`` leaves nothing behind."""
    source = textwrap.dedent("""\
        import contextlib
        class Saves:
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return False
        def f():
            with contextlib.nullcontext(), Saves() as s:
                for i in range(1):
                    out.append(dict(locals()))
            out.append(dict(locals()))
        f()
    """)
    out, error = _run(source, instrumented=True)
    assert error is None, error
    inside, after = out
    assert type(inside["_gpusnap_with_8_0"]) is contextlib.nullcontext
    assert inside["_gpusnap_with_8_1"] is inside["s"]
    assert after["_gpusnap_with_8_0"] is None and after["_gpusnap_with_8_1"] is None
    assert "_gpusnap_with_" not in ast.unparse(transform.transform_source("with a:\n    pass\n"))


def test_a_function_s_cells_are_reachable_from_its_frame():
    """A function the run made in a step the replay skipped is made again over the replay's
    frame's cells (restore.functions): ``__gpusnap_cells__`` holds them, a decorated function's
    and a nested one's (its free variables too), after the docstring; a function without cells
    gets nothing."""
    source = textwrap.dedent("""\
        def deco(f):
            return f
        @deco
        def main():
            "doc"
            scale = 1.0
            hook = lambda out: out * scale
            def inner():
                nonlocal scale
                scale = 2.0
                out.append(dict(locals()))
            inner()
            out.append(dict(locals()))
            return hook
        def plain():
            out.append(dict(locals()))
        out.append(main.__doc__)
        out.append(main()(1.0))
        plain()
    """)
    out, error = _run(source, instrumented=True)
    assert error is None, error
    doc, in_inner, in_main, result, in_plain = out
    assert doc == "doc" and result == 2.0 and in_plain == {}
    keeper, hook = in_main["__gpusnap_cells__"], in_main["hook"]
    assert keeper.__code__.co_freevars == ("scale",) and keeper.__closure__[0] is hook.__closure__[0]
    assert in_inner["__gpusnap_cells__"].__closure__[0] is hook.__closure__[0]


FUTURE = """\
from __future__ import annotations
\"\"\"not the docstring: the future import comes first\"\"\"
def f(x: Undefined) -> Undefined:
    for i in range(2):
        pass
    return f.__annotations__
out.append(f(1))
"""


@pytest.fixture(autouse=True)
def clean_loops(monkeypatch, tmp_path):
    monkeypatch.setattr(loops, "pending", False)
    monkeypatch.setattr(loops, "on_boundary", None)
    monkeypatch.setattr(loops, "on_loop_start", None)
    monkeypatch.setattr(cache, "cache_dir", lambda: str(tmp_path / "code-cache"))
    loops.ACTIVE.clear()
    yield
    loops.ACTIVE.clear()


def _compile(source: str, filename: str, namespace: dict, instrumented: bool):
    """The code of a dedented snippet, instrumented (with the runtime bound into ``namespace``)
    or as plain python compiles it."""
    source = textwrap.dedent(source)
    if not instrumented:
        return compile(source, filename, "exec", dont_inherit=True)
    importer.bind_runtime(namespace)
    return transform.compile_instrumented(source, filename)


def _run(source: str, instrumented: bool):
    namespace = {"__name__": "snippet", "out": []}
    code = _compile(source, "<snippet>", namespace, instrumented)
    try:
        exec(code, namespace)
        error = None
    except Exception as exc:  # compared, not hidden
        error = repr(exc)
    return namespace["out"], error


@pytest.mark.parametrize("pending", [False, True], ids=["idle", "pending"])
@pytest.mark.parametrize("name", sorted(SNIPPETS) + ["future"])
def test_semantics_unchanged(name, pending):
    source = FUTURE if name == "future" else SNIPPETS[name]
    plain = _run(source, instrumented=False)
    seen = []
    loops.pending = pending
    loops.on_boundary = lambda loop: seen.append((loop.loop_id, loop.index))
    instrumented = _run(source, instrumented=True)
    assert instrumented == plain
    assert loops.ACTIVE == []
    if pending and name not in ("async",):
        assert seen, "no boundary was reported"


def test_emitted_code_is_the_documented_form():
    source = textwrap.dedent("""\
        for x in items:
            pass
        for i, x in enumerate(items, start=1):
            pass
        for p in zip(a, *b):
            pass
        while n:
            pass
        else:
            done()
        async def f():
            async for y in z:
                pass
            return [q for q in r]
    """)
    tree = transform.transform_source(source)
    assert ast.unparse(tree) == textwrap.dedent("""\
        for x in __gpusnap_loops__.for_loop('1:0', items):
            pass
        for i, x in __gpusnap_loops__.for_loop_call('3:0', enumerate, items, start=1):
            pass
        for p in __gpusnap_loops__.for_loop('5:0', zip(a, *b)):
            pass
        with __gpusnap_loops__.while_loop('7:0') as __gpusnap_w_0:
            while __gpusnap_w_0.boundary() and n:
                pass
            else:
                done()

        async def f():
            async for y in z:
                pass
            return [q for q in r]""")


def test_nested_enumerate_zip_islice_are_deferred():
    source = textwrap.dedent("""\
        for i, x in enumerate(islice(loader, 5), start=1):
            pass
        for x in tqdm(enumerate(loader), total=3):
            pass
        for x in itertools.islice(zip(a, b), 2, 8, 2):
            pass
        for x in f(enumerate(a)):
            pass
    """)
    assert ast.unparse(transform.transform_source(source)) == textwrap.dedent("""\
        for i, x in __gpusnap_loops__.for_loop_call('1:0', enumerate, __gpusnap_loops__.deferred(islice, loader, 5), start=1):
            pass
        for x in __gpusnap_loops__.for_loop('3:0', tqdm(__gpusnap_loops__.deferred(enumerate, loader), total=3)):
            pass
        for x in __gpusnap_loops__.for_loop_call('5:0', itertools.islice, __gpusnap_loops__.deferred(zip, a, b), 2, 8, 2):
            pass
        for x in __gpusnap_loops__.for_loop('7:0', f(enumerate(a))):
            pass""")


def test_generated_nodes_carry_the_statement_location():
    source = "def f():\n    x = 1\n    while (x :=\n           x - 1):\n        for i in g(\n                x):\n            pass\n"
    tree = transform.transform_source(source)
    loops_nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.With))]
    where = {type(n).__name__: (n.lineno, n.col_offset, n.end_lineno) for n in loops_nodes}
    original = {type(n).__name__: (n.lineno, n.col_offset, n.end_lineno) for n in ast.walk(ast.parse(source))
                if isinstance(n, (ast.For, ast.While))}
    assert where["For"] == original["For"] and where["While"] == original["While"]
    assert where["With"] == (3, 4, 4)  # the `while C` header, not the body
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id.startswith("__gpusnap"):
            assert node.lineno in (3, 5)
    # the user's expressions keep their own lines
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "g")
    assert call.lineno == 5 and call.args[0].lineno == 6


def _tb_lines(source: str, instrumented: bool):
    namespace = {"__name__": "tb"}
    code = _compile(source, "<tb>", namespace, instrumented)
    try:
        exec(code, namespace)
    except Exception as exc:
        return [(f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<tb>"]
    raise AssertionError("no exception")


@pytest.mark.parametrize("body", [
    "for i in range(3):\n    if i == 2:\n        raise ValueError(i)\n",
    "n = 0\nwhile n < 5:\n    n += 1\n    if n == 4:\n        {}[n]\n",
    "def c():\n    raise KeyError\nwhile (\n    c()):\n    pass\n",
    "def g():\n    yield 1\n    1/0\nfor x in g():\n    pass\n",
    "for x in (\n    None):\n    pass\n",
    "def f():\n    for i in range(2):\n        while True:\n            return 1/0\nf()\n",
    "class K:\n    while True:\n        for x in [1]:\n            raise RuntimeError\n",
])
def test_traceback_lines_unchanged(body):
    assert _tb_lines(body, True) == _tb_lines(body, False)


def test_boundaries_and_loop_ids():
    source = textwrap.dedent("""\
        def train():
            for epoch in range(2):
                step = 0
                while step < 3:
                    step += 1
        train()
    """)
    seen = []
    loops.pending = True
    loops.on_boundary = lambda loop: seen.append((loop.loop_id, loop.kind, loop.index, loop.code.co_name,
                                                  [a.loop_id for a in loops.ACTIVE]))
    namespace = {}
    importer.bind_runtime(namespace)
    exec(transform.compile_instrumented(source, "<b>"), namespace)
    assert seen[0] == ("2:4", "for", 0, "train", ["2:4"])
    assert ("4:8", "while", 3, "train", ["2:4", "4:8"]) in seen
    assert sum(1 for s in seen if s[0] == "2:4") == 3  # before each item and after the last body
    assert sum(1 for s in seen if s[0] == "4:8") == 8  # 4 condition checks per while, twice
    assert loops.ACTIVE == []


def test_loop_count_and_version():
    tree = ast.parse("for a in b:\n    while c:\n        pass\n[x for x in y]\n")
    assert transform.transform_tree(tree) == 2
    # The version is part of the cache key: code instrumented by an older transform is never reused.
    from gpusnap.instrument import cache

    assert cache.key("t.py", "d", transform.VERSION) != cache.key("t.py", "d", transform.VERSION + 1)


# ---------------------------------------------------------------------------------------------
# Import hook


@pytest.fixture
def hooked(tmp_path, monkeypatch):
    """A project dir (the root), a fake site-packages inside it and an outside dir, on sys.path."""
    project = tmp_path / "project"
    site = project / ".venv" / "lib" / "site-packages"
    outside = tmp_path / "outside"
    for d in (project / "pkg", site, outside):
        d.mkdir(parents=True)
    loop_src = "def run():\n    for i in range(2):\n        pass\n    return i\n"
    (project / "sibling_mod.py").write_text(loop_src)
    (project / "pkg" / "__init__.py").write_text("from . import inner\n")
    (project / "pkg" / "inner.py").write_text(loop_src)
    (site / "sitepkg_mod.py").write_text(loop_src)
    (outside / "outside_mod.py").write_text(loop_src)
    (outside / "named_mod.py").write_text(loop_src)
    names = ["sibling_mod", "pkg", "pkg.inner", "sitepkg_mod", "outside_mod", "named_mod"]
    for d in (project, site, outside):
        monkeypatch.syspath_prepend(str(d))
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    finder = importer.install(roots=[str(project)], instrument=["named_mod"])
    yield project
    importer.uninstall()
    for n in names:
        sys.modules.pop(n, None)
    sys.modules.update(saved)
    assert finder not in sys.meta_path


def _instrumented(module) -> bool:
    return transform.LOOPS_NAME in vars(module) and "__gpusnap_loops__" in module.run.__code__.co_names


def test_hook_instruments_only_user_modules(hooked):
    import importlib

    mods = {n: importlib.import_module(n) for n in
            ["sibling_mod", "pkg", "sitepkg_mod", "outside_mod", "named_mod"]}
    assert _instrumented(mods["sibling_mod"])
    assert _instrumented(sys.modules["pkg.inner"])
    assert transform.LOOPS_NAME in vars(mods["pkg"])
    assert _instrumented(mods["named_mod"])
    assert not _instrumented(mods["sitepkg_mod"])
    assert not _instrumented(mods["outside_mod"])
    for m in mods.values():
        if hasattr(m, "run"):
            assert m.run() == 1
    path = mods["sibling_mod"].__file__
    with open(path, "rb") as f:
        assert importer.SOURCES[path] == xxhash.xxh3_128_hexdigest(f.read())
    assert mods["sitepkg_mod"].__file__ not in importer.SOURCES
    # nothing instrumented lands in the user's __pycache__
    assert not (hooked / "__pycache__").exists()


def test_hook_sits_before_pathfinder(hooked):
    from importlib.machinery import BuiltinImporter, FrozenImporter, PathFinder

    kinds = [f for f in sys.meta_path if f in (BuiltinImporter, FrozenImporter, PathFinder)
             or isinstance(f, importer.InstrumentFinder)]
    assert isinstance(kinds[-2], importer.InstrumentFinder) and kinds[-1] is PathFinder


def test_framework_loop_modules_are_instrumented_by_default():
    from gpusnap import frameworks

    frameworks.load()
    finder = importer.install(roots=["/proj"], instrument=frameworks.loop_modules())  # as boot does
    try:
        assert finder.policy.wants("lightning.pytorch.loops.training_epoch_loop", "/v/site-packages/lightning/pytorch/loops/training_epoch_loop.py")
        assert not finder.policy.wants("lightning.pytorch.loops.utilities", "/v/site-packages/lightning/pytorch/loops/utilities.py")
    finally:
        importer.uninstall()


def test_policy():
    import os

    policy = importer.Policy.from_config(["/proj"], ["mylib", "/extra/dir", "rel/path.py", "top.py"])
    assert policy.names == ("mylib",)
    assert policy.wants("a", "/proj/a.py")
    assert policy.wants("mylib.sub", "/anywhere/site-packages/mylib/sub.py")
    assert not policy.wants("mylibx", "/anywhere/site-packages/mylibx.py")
    assert policy.wants("x", "/extra/dir/x.py")
    assert policy.wants("path", os.path.abspath("rel/path.py")) and policy.wants("top", os.path.abspath("top.py"))
    assert not policy.wants("a", "/proj/venv/lib/python3.11/site-packages/a.py")
    assert not policy.wants("a", "/proj/dist-packages/a.py")
    assert not policy.wants("a", "/other/a.py")
    assert not policy.wants("json", os.path.join(os.path.dirname(os.__file__), "json", "__init__.py"))
    import gpusnap

    here = importer.Policy([os.path.dirname(os.path.dirname(gpusnap.__file__))])
    assert not here.wants("gpusnap.boot", os.path.join(os.path.dirname(gpusnap.__file__), "boot.py"))
    assert importer.Policy([], names=["gpusnap"]).wants("gpusnap.boot", gpusnap.__file__)


def test_code_cache(tmp_path, monkeypatch):
    path = str(tmp_path / "m.py")
    data = b"for i in range(3):\n    pass\n"
    first = importer.compile_module(data, path)
    # a second compile of the same source comes from the cache, not the transform
    monkeypatch.setattr(transform, "compile_instrumented", lambda *a: pytest.fail("not cached"))
    second = importer.compile_module(data, path)
    assert second.co_code == first.co_code and second.co_filename == path
    monkeypatch.undo()
    monkeypatch.setattr(cache, "cache_dir", lambda: str(tmp_path / "code-cache"))
    # a damaged entry is recompiled, never loaded
    key = cache.key(path, xxhash.xxh3_128_hexdigest(data), transform.VERSION)
    entry = tmp_path / "code-cache" / key[:2] / key
    blob = bytearray(entry.read_bytes())
    blob[-3] ^= 0xFF
    entry.write_bytes(bytes(blob))
    assert cache.load(key) is None
    assert importer.compile_module(data, path).co_code == first.co_code
    assert cache.load(key) is not None
    # the key separates paths, sources and transform versions
    assert len({cache.key(path, "a", 1), cache.key(path + "x", "a", 1), cache.key(path, "b", 1),
                cache.key(path, "a", 2)}) == 4


def test_cache_failures_are_not_fatal(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(cache, "cache_dir", lambda: str(blocker / "sub"))
    code = importer.compile_module(b"while False:\n    pass\n", str(tmp_path / "n.py"))
    assert "__gpusnap_loops__" in code.co_names
    monkeypatch.setattr(cache, "cache_dir", lambda: None)
    assert cache.load("00" * 16) is None


def test_non_main_thread_loops_are_not_tracked():
    source = "for i in range(3):\n    seen.append(len(__gpusnap_loops__.ACTIVE))\n"
    seen = []
    namespace = {"seen": seen}
    importer.bind_runtime(namespace)
    code = transform.compile_instrumented(source, "<t>")
    t = threading.Thread(target=exec, args=(code, namespace))
    t.start()
    t.join()
    assert seen == [0, 0, 0]
    exec(code, namespace)
    assert seen[3:] == [1, 1, 1]
