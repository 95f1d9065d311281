"""Source transform: route every ``for`` and ``while`` statement through ``instrument.loops``.

What is emitted is defined by ``loops``' docstring; in short, for a statement at LINE:COL::

    for T in E: B else: O        ->  for T in __gpusnap_loops__.for_loop("LINE:COL", E): B else: O
    for T in enumerate(a, s=1):  ->  for T in __gpusnap_loops__.for_loop_call("LINE:COL", enumerate, a, s=1):
    for T in enumerate(islice(a, n)):
                                 ->  for T in __gpusnap_loops__.for_loop_call("LINE:COL", enumerate,
                                              __gpusnap_loops__.deferred(islice, a, n)):
    while C: B else: O           ->  with __gpusnap_loops__.while_loop("LINE:COL") as __gpusnap_w_N:
                                         while __gpusnap_w_N.boundary() and (C): B else: O

``enumerate``, ``zip`` and ``islice`` (also ``itertools.islice``) get the deferred form only when
called by that name without ``*`` or ``**`` unpacking (``for_loop_call`` and ``deferred`` check
at run time that the name really is the builtin). Such calls nested as arguments of a deferred
call, or as the first argument of a ``tqdm(...)``/``trange``-style call in the header, are
deferred too: none of them has made an iterator of its source when the loop starts, so replay
can position the innermost source (``enumerate(islice(loader, n))``, ``tqdm(enumerate(loader))``).
``async for`` and comprehensions are left alone. ``N`` counts ``while`` statements per module.

A ``with`` statement whose body holds a loop keeps each context manager in a local of its own
while the body runs, where a snapshot finds it::

    with A as a, B: BODY         ->  try:
                                         with (_gpusnap_with_LINE_0 := A) as a, (_gpusnap_with_LINE_1 := B): BODY
                                     finally:
                                         _gpusnap_with_LINE_0 = _gpusnap_with_LINE_1 = None

Python keeps the object a ``with`` entered only on its frame's stack, which no snapshot reads; but
it often saved state at entry that its exit puts back (the rates a ``contextmanager`` saved in its
own frame, a class's flags on ``self``, ``torch.random.fork_rng``'s generator state). A loop's
boundary inside the body is a place a restart resumes at: the replay entered the ``with`` with its
own state, so the merge must give the entered object the run's. The names are not ``__gpusnap_``:
the snapshot keeps them. Cleared at exit, they never hold an object a finished ``with`` left.

Every function whose frame holds closure cells (variables a nested function refers to, or that it
refers to from an enclosing one) keeps them reachable from its frame::

    def main(): BODY            ->  def main():
                                        __gpusnap_cells__ = lambda: (scale, model)
                                        BODY

Python gives no way to reach a running frame's cells, only their contents; a function the run
made in a step the replay skipped (a hook registered at a phase change, closing over ``scale``)
must be made again over the replay's frame's cell, or it would read a copy that the loop never
updates. ``__gpusnap_cells__.__closure__`` is that cell. It goes after a docstring and carries
the location of the statement it precedes, so no line event is added.

Every node made here carries the location of the statement it replaces (its ``for T in E`` /
``while C`` header) and the ``for``/``while`` node keeps its own, so line numbers and tracebacks
stay the user's. ``__gpusnap_loops__`` is not
imported by the transformed code: the loader binds it in the module's globals before running it,
which keeps ``from __future__`` imports first.
"""

from __future__ import annotations

import ast
import sys
import types

# Enters the compiled-code cache key: bump on any change to what is emitted.
VERSION = 4

LOOPS_NAME = "__gpusnap_loops__"
WHILE_PREFIX = "__gpusnap_w_"
WITH_PREFIX = "_gpusnap_with_"
CELLS_NAME = "__gpusnap_cells__"
_DEFERRED_CALLS = frozenset({"enumerate", "zip", "islice"})
_WRAPPERS = frozenset({"tqdm"})  # calls whose first argument is the iterable they wrap
_ITER_AT_EXPR = sys.version_info >= (3, 13)


def _located(stmt: ast.AST, header_end: ast.expr, *nodes: ast.AST) -> None:
    """Give the nodes made here the location of the statement's header, ``for T in E`` or
    ``while C``. Not the whole statement: that spans the body, and a call whose method name
    ends on a later line is placed on that line by CPython, so the traceback would show the
    body's last line. User subtrees are not walked: they keep their own locations."""
    for node in nodes:
        node.lineno, node.col_offset = stmt.lineno, stmt.col_offset
        if isinstance(node, ast.Attribute):
            node.end_lineno, node.end_col_offset = stmt.lineno, stmt.col_offset
        else:
            node.end_lineno, node.end_col_offset = header_end.end_lineno, header_end.end_col_offset


def _loops_attr(attr: str) -> ast.Attribute:
    return ast.Attribute(value=ast.Name(id=LOOPS_NAME, ctx=ast.Load()), attr=attr, ctx=ast.Load())


def _loop_id(node: ast.stmt) -> ast.Constant:
    return ast.Constant(value=f"{node.lineno}:{node.col_offset}")


def _func_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id == "itertools" and func.attr == "islice":
            return "islice"
        return func.attr if func.attr in _WRAPPERS else None
    return None


def _plain_args(call: ast.Call) -> bool:
    return not any(isinstance(a, ast.Starred) for a in call.args) and all(k.arg is not None for k in call.keywords)


def _is_deferred(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and _func_name(node) in _DEFERRED_CALLS and _plain_args(node)


def _defer_nested(node: ast.expr) -> ast.expr:
    """``node`` with enumerate/zip/islice calls inside it (as a deferred call's arguments or a
    wrapper's first argument) routed through ``deferred``; anything else is left as written."""
    if not isinstance(node, ast.Call):
        return node
    if _is_deferred(node):
        func = _loops_attr("deferred")
        args = [node.func, *(_defer_nested(a) for a in node.args)]
        call = ast.Call(func=func, args=args, keywords=node.keywords)
        for made in (call, func, func.value):
            ast.copy_location(made, node)
        return call
    if _func_name(node) in _WRAPPERS and node.args and not isinstance(node.args[0], ast.Starred):
        node.args[0] = _defer_nested(node.args[0])
    return node


def _holds_loop(body: list) -> bool:
    """Whether a loop runs inside these statements (not inside a function or class they define)."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.For, ast.While)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


class LoopTransformer(ast.NodeTransformer):
    """Rewrites one module's tree in place; ``count`` is how many loops it instrumented."""

    def __init__(self):
        self.whiles = 0
        self.count = 0

    def visit_For(self, node: ast.For) -> ast.For:
        self.generic_visit(node)
        it = node.iter
        if _is_deferred(it):
            func = _loops_attr("for_loop_call")
            args = [_loop_id(node), it.func, *(_defer_nested(a) for a in it.args)]
            call = ast.Call(func=func, args=args, keywords=it.keywords)
        else:
            func = _loops_attr("for_loop")
            call = ast.Call(func=func, args=[_loop_id(node), _defer_nested(it)], keywords=[])
        # Where iter(E) fails: python <= 3.12 blames the `for` line, 3.13 blames E.
        _located(it if _ITER_AT_EXPR else node, it, call, func, func.value, call.args[0])
        node.iter = call
        self.count += 1
        return node

    def visit_With(self, node: ast.With) -> ast.stmt:
        self.generic_visit(node)
        if not _holds_loop(node.body):
            return node
        names = []
        for i, item in enumerate(node.items):
            name = f"{WITH_PREFIX}{node.lineno}_{i}"
            names.append(name)
            kept = ast.NamedExpr(target=ast.Name(id=name, ctx=ast.Store()), value=item.context_expr)
            for made in (kept, kept.target):
                ast.copy_location(made, item.context_expr)
            item.context_expr = kept
        clear = ast.Assign(targets=[ast.Name(id=n, ctx=ast.Store()) for n in names], value=ast.Constant(value=None))
        stmt = ast.Try(body=[node], handlers=[], orelse=[], finalbody=[clear])
        for made in (clear, *clear.targets, clear.value, stmt):
            ast.copy_location(made, node)
        return stmt

    def visit_While(self, node: ast.While) -> ast.With:
        self.generic_visit(node)
        name = f"{WHILE_PREFIX}{self.whiles}"
        self.whiles += 1
        self.count += 1
        w_load = ast.Name(id=name, ctx=ast.Load())
        method = ast.Attribute(value=w_load, attr="boundary", ctx=ast.Load())
        boundary = ast.Call(func=method, args=[], keywords=[])
        test = ast.BoolOp(op=ast.And(), values=[boundary, node.test])
        func = _loops_attr("while_loop")
        enter = ast.Call(func=func, args=[_loop_id(node)], keywords=[])
        w_store = ast.Name(id=name, ctx=ast.Store())
        stmt = ast.With(items=[ast.withitem(context_expr=enter, optional_vars=w_store)], body=[node])
        _located(node, node.test, w_load, method, boundary, test, func, func.value, enter, enter.args[0], w_store, stmt)
        node.test = test
        return stmt


def _closure_names(code: types.CodeType, found: dict) -> dict:
    """{(first line, name): the cell and free variables} of every function compiled in ``code``
    (its first line is its first decorator's, as the key ``_CellsBinder`` makes)."""
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            # (zero-argument super()'s __class__: the class, which every replay defines anew)
            names = tuple(n for n in (*const.co_cellvars, *const.co_freevars) if n != "__class__")
            if names:
                found[(const.co_firstlineno, const.co_name)] = names
            _closure_names(const, found)
    return found


class _CellsBinder(ast.NodeVisitor):
    """Puts ``__gpusnap_cells__ = lambda: (cells...)`` first in each function that has cells."""

    def __init__(self, closures: dict):
        self.closures = closures

    def visit_FunctionDef(self, node) -> None:
        self.generic_visit(node)
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        names = self.closures.get((first, node.name))
        if not names:
            return
        at = 1 if _is_docstring(node.body[0]) and len(node.body) > 1 else 0
        lam = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                         body=ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Load()) for n in names], ctx=ast.Load()))
        bind = ast.Assign(targets=[ast.Name(id=CELLS_NAME, ctx=ast.Store())], value=lam)
        for made in ast.walk(bind):
            ast.copy_location(made, node.body[at])
        node.body.insert(at, bind)

    visit_AsyncFunctionDef = visit_FunctionDef


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def transform_tree(tree: ast.Module) -> int:
    """Instrument ``tree`` in place; returns the number of loops rewritten."""
    transformer = LoopTransformer()
    transformer.visit(tree)
    ast.fix_missing_locations(tree)
    return transformer.count


def transform_source(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    tree = ast.parse(source, filename=filename)
    transform_tree(tree)
    return tree


def compile_instrumented(source: str | bytes, filename: str):
    """Code object of ``source`` with its loops instrumented and its functions' cells reachable
    (``exec`` mode, no inherited flags). Which variables are cells only the compiler knows: a
    module with any is compiled twice."""
    tree = transform_source(source, filename)
    code = compile(tree, filename, "exec", dont_inherit=True)
    closures = _closure_names(code, {})
    if not closures:
        return code
    _CellsBinder(closures).visit(tree)
    return compile(tree, filename, "exec", dont_inherit=True)
