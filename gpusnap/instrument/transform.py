"""Source transform: route every ``for`` and ``while`` statement through ``instrument.loops``.

What is emitted is defined by ``loops``' docstring; in short, for a statement at LINE:COL::

    for T in E: B else: O        ->  for T in __gpusnap_loops__.for_loop("LINE:COL", E): B else: O
    for T in enumerate(a, s=1):  ->  for T in __gpusnap_loops__.for_loop_call("LINE:COL", enumerate, a, s=1):
    while C: B else: O           ->  with __gpusnap_loops__.while_loop("LINE:COL") as __gpusnap_w_N:
                                         while __gpusnap_w_N.boundary() and (C): B else: O

``enumerate``/``zip`` get the deferred form only when called by their bare name without ``*``
or ``**`` unpacking (``for_loop_call`` checks that the name really is the builtin at run time).
``async for`` and comprehensions are left alone. ``N`` counts ``while`` statements per module.
Every node made here carries the location of the statement it replaces (its ``for T in E`` /
``while C`` header) and the ``for``/``while`` node keeps its own, so line numbers and tracebacks
stay the user's. ``__gpusnap_loops__`` is not
imported by the transformed code: the loader binds it in the module's globals before running it,
which keeps ``from __future__`` imports first.
"""

from __future__ import annotations

import ast
import sys

# Enters the compiled-code cache key: bump on any change to what is emitted.
VERSION = 1

LOOPS_NAME = "__gpusnap_loops__"
WHILE_PREFIX = "__gpusnap_w_"
_DEFERRED_CALLS = frozenset({"enumerate", "zip"})
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


class LoopTransformer(ast.NodeTransformer):
    """Rewrites one module's tree in place; ``count`` is how many loops it instrumented."""

    def __init__(self):
        self.whiles = 0
        self.count = 0

    def visit_For(self, node: ast.For) -> ast.For:
        self.generic_visit(node)
        it = node.iter
        if (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and it.func.id in _DEFERRED_CALLS
            and not any(isinstance(a, ast.Starred) for a in it.args)
            and all(k.arg is not None for k in it.keywords)
        ):
            func = _loops_attr("for_loop_call")
            call = ast.Call(func=func, args=[_loop_id(node), it.func, *it.args], keywords=it.keywords)
        else:
            func = _loops_attr("for_loop")
            call = ast.Call(func=func, args=[_loop_id(node), it], keywords=[])
        # Where iter(E) fails: python <= 3.12 blames the `for` line, 3.13 blames E.
        _located(it if _ITER_AT_EXPR else node, it, call, func, func.value, call.args[0])
        node.iter = call
        self.count += 1
        return node

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
    """Code object of ``source`` with its loops instrumented (``exec`` mode, no inherited flags)."""
    return compile(transform_source(source, filename), filename, "exec", dont_inherit=True)
