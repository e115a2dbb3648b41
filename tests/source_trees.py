"""Parse Python source for the tests that read the project's own code (import boundaries, layers).

CPython before 3.11.8 shares the AST constructor's recursion counter between threads
(python/cpython#106905): `ast.parse` in a test process whose earlier tests left threads running
(servers, engines) can fail with "SystemError: AST constructor recursion depth mismatch" although
the source is fine. Such a parse is tried again; any other error is raised as it is."""

from __future__ import annotations

import ast

ATTEMPTS = 5


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
