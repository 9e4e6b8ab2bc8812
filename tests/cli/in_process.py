"""Running `runcrate` (and the server `runcrate mcp` serves) inside the test's own process, in a
thread, while the test's thread drives the simulated data center: no Python starts per call.

A subprocess has an environment and stdin, stdout and stderr of its own. A thread shares the
process's `os.environ` and `sys.std*` with everything else in it: pytest's capture, the live
server's thread, the thread that drives the data center. So while a CLI runs here they are
routed: `os.environ` and `sys.stdin`, `sys.stdout`, `sys.stderr` become proxies that answer from
the `Route` in the current context (contextvars), and from what they were everywhere else. A
thread starts in an empty context, so only the thread that entered `routed` sees the CLI's
environment and files, and what copies its context on: the tasks of an event loop started there,
anyio's worker threads (the MCP server's tools). The proxies are put in place while a route is
entered anywhere and taken away after the last one ends.

What stays a real process (docs/testing.md, "The CLI and the MCP server"): a terminal (a PTY is
a process's), Ctrl-C (a signal is a process's), `runcrate ssh` (it ends in exec), stdout of
`runcrate mcp` over stdio, and the installed package's smoke tests.
"""

from __future__ import annotations

import contextvars
import io
import os
import sys
import threading
import traceback
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass
class Route:
    """What a CLI running in this context sees as its environment and standard streams."""

    environ: dict[str, str]
    stdin: TextIO
    stdout: TextIO
    stderr: TextIO


_route: contextvars.ContextVar[Route | None] = contextvars.ContextVar("cli_route", default=None)


class RoutedEnviron(MutableMapping[str, str]):
    """`os.environ` for a routed context: the route's own mapping; the process's elsewhere."""

    def __init__(self, process: MutableMapping[str, str]) -> None:
        self.process = process

    def _current(self) -> MutableMapping[str, str]:
        route = _route.get()
        return route.environ if route is not None else self.process

    def __getitem__(self, key: str) -> str:
        return self._current()[key]

    def __setitem__(self, key: str, value: str) -> None:
        self._current()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._current()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._current()))

    def __len__(self) -> int:
        return len(self._current())

    def copy(self) -> dict[str, str]:
        return dict(self._current())


class RoutedStream:
    """`sys.stdin`, `sys.stdout` or `sys.stderr` for a routed context: the route's file;
    the process's elsewhere."""

    def __init__(self, name: str, process: Any) -> None:
        self._name = name
        self.process = process

    def _current(self) -> Any:
        route = _route.get()
        return getattr(route, self._name) if route is not None else self.process

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._current(), attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())


STREAMS = ("stdin", "stdout", "stderr")
_lock = threading.Lock()
_entered = 0


def _install() -> None:
    global _entered
    with _lock:
        if _entered == 0:
            os.environ = RoutedEnviron(os.environ)  # type: ignore[assignment]
            for name in STREAMS:
                setattr(sys, name, RoutedStream(name, getattr(sys, name)))
        _entered += 1


def _uninstall() -> None:
    global _entered
    with _lock:
        _entered -= 1
        if _entered == 0:
            if isinstance(os.environ, RoutedEnviron):
                os.environ = os.environ.process  # type: ignore[assignment]
            for name in STREAMS:
                stream = getattr(sys, name)
                if isinstance(stream, RoutedStream):  # else pytest has put its own there since
                    setattr(sys, name, stream.process)


@contextmanager
def routed(route: Route) -> Iterator[None]:
    """This context (and what copies it) sees `route`'s environment and streams."""
    _install()
    token = _route.set(route)
    try:
        yield
    finally:
        _route.reset(token)
        _uninstall()


class Running:
    """`runcrate ARGS` running in a thread of this process."""

    def __init__(self, args: Sequence[str], route: Route) -> None:
        self.code: int | None = None
        self._thread = threading.Thread(
            target=self._run, args=(list(args), route), name="runcrate", daemon=True
        )
        self._thread.start()

    def _run(self, args: list[str], route: Route) -> None:
        from runcrate_cli.cli import main

        with routed(route):
            try:
                main(args, prog_name="runcrate")
                code: Any = 0
            except SystemExit as ended:
                code = ended.code
            except BaseException:  # what the interpreter does with an exception main lets out
                traceback.print_exc(file=sys.stderr)
                code = 1
            if isinstance(code, str):  # sys.exit("message"): printed, exit 1
                sys.stderr.write(code + "\n")
                code = 1
            for stream in (route.stdout, route.stderr):
                stream.flush()
        self.code = 0 if code is None else code

    def wait(self, timeout: float) -> bool:
        """Whether it ended within `timeout` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def start(
    args: Sequence[str], *, environ: dict[str, str], stdin: str, stdout: TextIO, stderr: TextIO
) -> Running:
    """Start `runcrate ARGS` with exactly `environ` (nothing of the test process's own), `stdin`
    as its input, and output into the files given (which the caller may read meanwhile, as it
    reads a process's)."""
    return Running(args, Route(dict(environ), io.StringIO(stdin), stdout, stderr))
