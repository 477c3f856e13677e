"""Work that would stall the event loop on a large program, done in a worker thread.

The graph's layout and the step palette of a selected stage cost time in proportion to
the program (a 10,000-stage program: seconds each, docs/architecture.md, layer 9), and a
key waits for whatever the event loop is doing. Up to `INLINE_STAGES` stages they are
computed where they are asked for, so that a step's screen is drawn whole in one frame
(`bench/bench_tui.py`); above it a `LatestJob` computes them in a thread, and the pane
says what it is waiting for until the result is handed back.

A `LatestJob` runs one request at a time in one worker thread, and only the latest
request made while it works: moving the selection through ten stages of a huge program
computes the palette of the one the selection stopped at (and of the one being computed
when the keys were pressed), not of all ten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from textual.dom import DOMNode
from textual.worker import get_current_worker

INLINE_STAGES = 600
"""Programs of at most this many stages are laid out, and their palettes found, on the
event loop (the 24-layer GPT stack of `bench/bench_tui.py` has 504 stages); larger ones
in a worker thread."""

SWITCH_INTERVAL_S = 0.001
"""How long a worker thread may hold the GIL while the event loop waits for it, as long
as the app runs (`sys.setswitchinterval`; CPython's default is 5 ms). While a worker
computes, each turn of the event loop waits for the GIL once after polling for input, and
a key is answered in tens of turns: at 5 ms a turn a key took hundreds of ms."""

Req = TypeVar("Req")
Res = TypeVar("Res")


def inline(stages: int) -> bool:
    """Whether work on a program of `stages` stages is done on the event loop."""
    return stages <= INLINE_STAGES


class LatestJob(Generic[Req, Res]):
    """`compute(request)` in a worker thread of `node`, then `deliver(request, result)`
    on the event loop; a request made while one is computed replaces any other waiting.

    `compute` must be worker-safe (read only its argument and immutable state); the
    requests and the deliveries belong to the event loop's thread."""

    def __init__(
        self,
        node: DOMNode,
        name: str,
        compute: Callable[[Req], Res],
        deliver: Callable[[Req, Res], None],
    ) -> None:
        self._node = node
        self._name = name
        self._compute = compute
        self._deliver = deliver
        self._wanted: Req | None = None
        self._running = False
        self.working_on: Req | None = None
        """The request being computed now (None when idle)."""

    @property
    def busy(self) -> bool:
        """Whether a request is being computed or waits."""
        return self._running

    def request(self, req: Req) -> None:
        """Compute `req` next (replacing any request not started yet)."""
        self._wanted = req
        if not self._running:
            self._running = True
            self._node.run_worker(
                self._loop,
                thread=True,
                group=self._name,
                exit_on_error=False,
                description=self._name,
            )

    def forget(self) -> None:
        """Drop the request waiting (the one being computed is delivered)."""
        self._wanted = None

    def _take(self) -> Req | None:
        """The next request, on the event loop (None: the worker ends, and the next
        request starts another)."""
        req, self._wanted = self._wanted, None
        self.working_on = req
        if req is None:
            self._running = False
        return req

    def _failed(self) -> None:
        self._running = False
        self._wanted = self.working_on = None

    def _loop(self) -> None:
        worker = get_current_worker()
        app = self._node.app
        try:
            while not worker.is_cancelled:
                req = app.call_from_thread(self._take)
                if req is None:
                    return
                result = self._compute(req)
                if not worker.is_cancelled:
                    app.call_from_thread(self._deliver, req, result)
        except BaseException:
            # The error panel shows the exception (`exit_on_error=False`); a later
            # request starts a new worker.
            if app.is_running:
                app.call_from_thread(self._failed)
            raise
        finally:
            if worker.is_cancelled and app.is_running:
                app.call_from_thread(self._failed)
