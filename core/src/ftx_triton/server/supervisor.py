"""The process that owns one tritonserver: ``python -m ftx_triton.server.supervisor SPEC``.

:class:`~ftx_triton.server.tritonserver.TritonServer` starts this instead of tritonserver itself, in a session
of its own. It

* starts tritonserver as its child, which gets SIGKILL should the supervisor die (PDEATHSIG), and
  adopts orphaned Python-backend stubs (it is their subreaper), so no process outlives it;
* serves the HTTP shield (:mod:`ftx_triton.front.shield`) and the gRPC front (:mod:`ftx_triton.front.grpc_front`,
  a message size limit) when asked, on the ports users see;
* gives tritonserver a stack limit (``RLIMIT_STACK``, which sets its threads' stacks) of
  :func:`stack_for` the largest body it may receive: tritonserver 2.51 copies a request body onto the
  stack of its HTTP thread, so under the usual 8 MiB a body of about 4 MiB kills it with SIGSEGV. When
  the hard limit allows less, the front's body limit shrinks to what fits (and says so);
* watches the stubs: one that dies leaves its model "ready" while every request fails, so the
  supervisor says which one died and stops the server (exit code :data:`STUB_DIED`);
* watches the FTX_HOME it was started from: once that directory is deleted (or replaced), the server's
  record is gone and no ``ftx stop`` could find it, so it stops the server (exit code :data:`HOME_GONE`);
* on SIGTERM/SIGINT/SIGHUP (``ftx stop``, Ctrl-C, or ftx dying: it gets SIGTERM then) stops
  tritonserver, kills what is left of the process tree, removes the server's shared memory and
  exits; when tritonserver dies by itself it does the same and says how it died;
* with ``--leash`` (a server :mod:`ftx_triton.server.head_start` started before ftx knew it would serve it),
  does the same when its stdin ends before ftx wrote ``r`` (release) there: ftx ended, or dropped it.

Every line it writes starts with ``ftx-supervisor:`` and goes to the server's log. SPEC is JSON:
``command``, ``shm_prefix``, ``exit_timeout_s``, optional ``front`` (``host``, ``port``,
``upstream_port``, ``max_json_depth``, the fields of :class:`ftx_triton.front.limits.Limits` and optional ``gate``:
:func:`ftx_triton.front.model_gate.gate_spec`'s), optional
``grpc_front`` (``host``, ``port``, ``upstream_port``, ``max_message_bytes``), optional ``home`` (the
directory whose removal stops the server).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ftx_triton.server.home_watch import HomeWatch
from ftx_triton.server.launch import LEASH_FLAG, RELEASE

if TYPE_CHECKING:  # psutil is imported where used, once tritonserver runs: its start need not wait 0.05 s for it
    import psutil

    from ftx_triton.front.limits import Limits

PREFIX = "ftx-supervisor:"
STUB_DIED = 70
"""Exit code when a Python-backend stub died (the server could answer nothing that needs it)."""
FRONT_FAILED = 71
HOME_GONE = 72
"""Exit code when the FTX_HOME the server was started from was deleted (its record with it)."""
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.2
_STUB_CHECK_S = 0.5
"""How often the stubs seen alive are checked (a few /proc reads) and FTX_HOME is looked at."""
_SCAN_S = 5.0
"""How often, once started, tritonserver's children are listed anew (new stubs, dead ones never seen alive) and
adopted orphans are reaped: one read per tritonserver thread (over a hundred), so not at every check."""
_START_SCAN_S = 30.0
"""For this long after the start, the children are listed at every check: stubs start as models load."""
_STACK_MARGIN = 16 << 20
DEFAULT_BODY_BYTES = 64 << 20
"""tritonserver's own body limit (--http-max-input-size) when nothing in front of it sets one."""


def say(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _die_with_supervisor() -> None:
    """preexec_fn of tritonserver: SIGKILL when the supervisor goes (and it did not already)."""
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def stack_for(body_bytes: int) -> int:
    """The stack tritonserver's HTTP threads need for a body of ``body_bytes`` (it holds up to two copies
    of it there, measured: SIGSEGV at a 4.2 MB infer body under an 8 MiB stack)."""
    return 2 * body_bytes + _STACK_MARGIN


def make_room_for_bodies(body_bytes: int) -> int:
    """Raise this process's soft ``RLIMIT_STACK`` (tritonserver inherits it) to :func:`stack_for`
    ``body_bytes``; return the largest body the resulting limit holds (``body_bytes`` unless the hard
    limit is lower)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    need = stack_for(body_bytes)
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if soft == resource.RLIM_INFINITY or soft < target:  # unlimited gives threads a small default stack
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_STACK, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= need:
        return body_bytes
    return max(0, (soft - _STACK_MARGIN) // 2)


def signal_name(code: int) -> str:
    """``-11`` → ``SIGSEGV (signal 11)``; a non-negative exit code as ``exit code N``."""
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} (signal {-code})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def stub_model(process: psutil.Process) -> str:
    """The model instance a stub serves (its command line names it, e.g. ``fastertransformer_0_0``)."""
    import psutil

    try:
        args = process.cmdline()
    except psutil.Error:
        return "?"
    return args[8] if len(args) > 8 else (args[1] if len(args) > 1 else "?")


def zombie_status(pid: int) -> str | None:
    """How a zombie (dead, not yet reaped) process ended, unless it exited 0; None for a live one."""
    from ftx_triton.server.process_tree import stat_fields  # imported by now: the stub check uses it

    fields = stat_fields(pid)
    if fields is None or fields[0] != "Z" or len(fields) < 50:
        return None
    wait_status = int(fields[49])  # exit_code: the wait status, as waitpid would report it
    if os.WIFSIGNALED(wait_status):
        return f"killed by {signal_name(-os.WTERMSIG(wait_status))}"
    code = os.WEXITSTATUS(wait_status)
    return f"exit code {code}" if code else None


class Supervisor:
    def __init__(self, spec: dict[str, Any], *, leash: bool = False) -> None:
        self.spec = spec
        self.leash = leash
        self.stop_requested = threading.Event()
        self.triton: subprocess.Popen[bytes] | None = None
        self.front: Any = None
        self.grpc_front: Any = None
        self.home = HomeWatch(spec.get("home"))
        self.seen_stubs: dict[int, str] = {}
        self.exit_code = 0

    # ----------------------------------------------------------------- lifecycle

    def run(self) -> int:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: self.stop_requested.set())
        if self.leash:
            threading.Thread(target=self._hold_leash, name="leash", daemon=True).start()
        limits = self._size_stack()
        # With an HTTP front, tritonserver starts first: the fronts' imports (aiohttp, grpc: about half a second)
        # overlap its start. ftx sees the server ready only through that front, which listens last, once the
        # gRPC front does; a front that cannot bind its port ends tritonserver again at once. Without it, ftx
        # asks tritonserver itself, so a gRPC front must listen before tritonserver starts.
        grpc_first = limits is None and self.spec.get("grpc_front")
        if grpc_first and not self._start_grpc_front():
            return FRONT_FAILED
        self.triton = subprocess.Popen(self.spec["command"], stdin=subprocess.DEVNULL, preexec_fn=_die_with_supervisor)  # noqa: PLW1509 - prctl/getppid/kill only
        say(f"tritonserver started (pid {self.triton.pid})")
        try:
            _import_after_spawn()
            if limits is not None and not (
                (not self.spec.get("grpc_front") or self._start_grpc_front()) and self._start_front(limits)
            ):
                self.triton.kill()  # it serves nothing yet: no graceful stop to wait for
                self.triton.wait()
                return FRONT_FAILED
            self._watch()
        finally:
            self._shutdown()
        return self.exit_code

    def _hold_leash(self) -> None:
        """Stop the server when stdin ends before ftx releases it (``r``): ftx ended or did not take it."""
        try:
            released = sys.stdin.buffer.read(1) == RELEASE
        except (OSError, ValueError):
            released = False
        if not released:
            say("the ftx that started this server ahead of need ended or did not take it: stopping")
            self.stop_requested.set()

    def _size_stack(self) -> Limits | None:
        """Raise the stack limit tritonserver will inherit to what the HTTP front's body limit needs (lowering
        that limit to what the hard stack limit allows); the front's limits, None without a front."""
        from ftx_triton.front.limits import Limits

        if not self.spec.get("front"):
            if make_room_for_bodies(DEFAULT_BODY_BYTES) < DEFAULT_BODY_BYTES:
                say("the stack limit (ulimit -s) is below what tritonserver needs for 64 MiB request bodies")
            return None
        limits = Limits.from_spec(self.spec["front"])
        fits = make_room_for_bodies(limits.max_body_bytes)
        if fits < limits.max_body_bytes:
            say(
                f"the hard stack limit (ulimit -Hs) leaves tritonserver room for bodies up to {fits} bytes, "
                f"not {limits.max_body_bytes}: the front accepts at most {fits}"
            )
            limits = dataclasses.replace(limits, max_body_bytes=fits)
        return limits

    def _start_front(self, limits: Limits) -> bool:
        from ftx_triton.front.local_aiohttp import import_aiohttp

        import_aiohttp()  # before the front's modules import it: no CA certificates loaded for a plain-HTTP proxy
        from ftx_triton.front.model_gate import ModelGate
        from ftx_triton.front.server import Front
        from ftx_triton.front.shield import MAX_JSON_DEPTH, Shield

        front = self.spec["front"]
        host, port = front["host"], front["port"]
        gate = front.get("gate")
        shield = Shield(
            front["upstream_port"],
            max_json_depth=front.get("max_json_depth") or MAX_JSON_DEPTH,
            on_refused=lambda line: say(f"HTTP front refused {line}"),
            gate=ModelGate(gate["window_s"]) if gate else None,
            gated_models=gate["models"] if gate else (),
        )
        try:
            self.front = Front(shield.app(), host, port, limits)
        except OSError as exc:
            # worded like tritonserver's own message, which ftx recognises and answers with new ports
            say(f"failed to start HTTP service: Socket '{host}:{port}' already in use ({exc})")
            return False
        self.front.start()
        say(
            f"HTTP front on {host}:{port} -> tritonserver 127.0.0.1:{front['upstream_port']} "
            f"(bodies up to {limits.max_body_bytes} bytes decoded, JSON up to {shield.max_json_depth} deep, "
            f"headers within {limits.header_timeout_s:g} s, at most {limits.max_connections} connections)"
        )
        if gate:
            say(
                f"HTTP front holds requests for {', '.join(gate['models'])} while the model is busy "
                f"(window {gate['window_s'] * 1e3:g} ms)"
            )
        return True

    def _start_grpc_front(self) -> bool:
        from ftx_triton.front.grpc_front import DEFAULT_MAX_MESSAGE_BYTES, GrpcFront

        front = self.spec["grpc_front"]
        host, port = front["host"], front["port"]
        limit = int(front.get("max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)
        self.grpc_front = GrpcFront(host, port, front["upstream_port"], max_message_bytes=limit)
        try:
            self.grpc_front.start()
        except OSError as exc:
            self.grpc_front = None
            say(f"failed to start GRPC service: Socket '{host}:{port}' already in use ({exc})")
            return False
        say(
            f"gRPC front on {host}:{port} -> tritonserver 127.0.0.1:{front['upstream_port']} "
            f"(messages up to {limit} bytes decompressed)"
        )
        return True

    def _watch(self) -> None:
        assert self.triton is not None
        started = time.monotonic()
        next_check = next_scan = started + _STUB_CHECK_S
        while not self.stop_requested.wait(_POLL_S):
            code = self.triton.poll()
            if code is not None:
                say(f"tritonserver exited by itself: {signal_name(code)}")
                self.exit_code = 128 - code if code < 0 else code
                return
            now = time.monotonic()
            if now >= next_check:
                next_check = now + _STUB_CHECK_S
                scan = now >= next_scan
                if scan:
                    next_scan = now + (_STUB_CHECK_S if now - started < _START_SCAN_S else _SCAN_S)
                    self._reap_adopted()
                if self.home.gone():
                    say(
                        f"{self.home.path} (this server's FTX_HOME) was deleted: its record went with it and no "
                        "`ftx stop` could find the server, so it stops"
                    )
                    self.exit_code = HOME_GONE
                    return
                dead = self._dead_stub(scan=scan)
                if dead:
                    say(
                        f"the Python-backend stub of model instance {dead} died; every request to it would "
                        "fail, so the server stops"
                    )
                    self.exit_code = STUB_DIED
                    return
        say("stop requested")

    def _dead_stub(self, *, scan: bool = True) -> str | None:
        """A stub of a model instance that is now a zombie (tritonserver does not restart them).

        tritonserver also runs the stub program with no arguments, which exits 1 at once: a probe, not a model's
        stub. Between its exit and tritonserver reaping it, it is a zombie child like a dead stub, so a stub counts
        only if it was seen alive with a model's arguments, or, never seen alive, if a signal ended it. ``scan``:
        list tritonserver's children (new stubs, dead ones never seen); else only the stubs seen are looked at."""
        if not scan:
            for pid, model in self.seen_stubs.items():
                if status := zombie_status(pid):
                    return f"{model} ({status})"
            return None
        import psutil

        from ftx_triton.server.process_tree import STUB_NAME, children_of, cmdline, is_stub

        assert self.triton is not None
        children = children_of(self.triton.pid)
        for gone in self.seen_stubs.keys() - {c.pid for c in children}:
            del self.seen_stubs[gone]  # reaped (an unloaded model's stub exits 0): its pid may be another's now
        for process in children:
            pid = process.pid
            status = zombie_status(pid)
            if status is None:
                if is_stub(process) and len(cmdline(process)) > 1:  # a zombie's command line is empty
                    self.seen_stubs[pid] = stub_model(process)
                continue
            # an unloaded model's stub exits 0 and is reaped; a killed or crashed one lingers
            with contextlib.suppress(psutil.Error):
                if pid in self.seen_stubs or (status.startswith("killed") and process.name() == STUB_NAME[:15]):
                    return f"{self.seen_stubs.get(pid, f'(pid {pid})')} ({status})"
        return None

    def _reap_adopted(self) -> None:
        """Reap orphans re-parented to this subreaper (stubs of a tritonserver that died)."""
        import psutil

        from ftx_triton.server.process_tree import children_of

        for child in children_of(os.getpid()):
            if self.triton is not None and child.pid == self.triton.pid:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)

    def _shutdown(self) -> None:
        import psutil

        timeout = float(self.spec.get("exit_timeout_s", 10)) + 5
        if self.grpc_front is not None:
            self.grpc_front.stop()
        if self.front is not None:
            # first: the front's idle keep-alive connections to tritonserver count as open clients, and
            # tritonserver waits out its --exit-timeout-secs for them (every stop took 10 s more)
            self.front.stop()
        if self.triton is not None and self.triton.poll() is None:
            self.triton.send_signal(signal.SIGTERM)
            try:
                self.triton.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                say(f"tritonserver did not exit {timeout:.0f} s after SIGTERM: killing it")
                self.triton.kill()
                self.triton.wait()
        leftovers = psutil.Process().children(recursive=True)
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(leftovers, timeout=5)
        if leftovers:
            say(f"killed {len(leftovers)} leftover process(es): " + ", ".join(f"{p.pid}" for p in leftovers))
        from ftx_triton.server.process_tree import remove_shm  # psutil is imported by now

        removed = remove_shm(str(self.spec.get("shm_prefix") or ""))
        if removed:
            say(f"removed {len(removed)} shared-memory region(s)")


def _import_after_spawn() -> None:
    """structlog without rich (this process logs into the server log; its modules import structlog later), once
    tritonserver is spawned: the 0.05 s of its import are not spent before the models start loading."""
    from ftx_triton.plain_structlog import import_structlog

    import_structlog()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    leash = bool(args) and args[0] == LEASH_FLAG
    args = args[1:] if leash else args
    if len(args) != 1:
        print(f"usage: python -m ftx_triton.server.supervisor [{LEASH_FLAG}] SPEC_JSON", file=sys.stderr)
        return 2
    return Supervisor(json.loads(args[0]), leash=leash).run()


if __name__ == "__main__":
    sys.exit(main())
