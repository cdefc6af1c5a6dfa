"""The in-sandbox runner: a long-lived process that runs tests for the or1 host, one at a time, over a pipe.

Runs inside bubblewrap or a container, with the standard library only (the docker backend passes this file's
source with `python3 -c`). The runner is root inside its sandbox (a handful of capabilities); each test runs in a
freshly forked child that drops to an unprivileged test uid, gets rlimits, a private work directory and an empty
environment; afterwards every process running as a test uid is killed (by uid, never kill(-1)). Expected outputs
never enter the sandbox: the runner only returns what the program printed or returned, and the host compares.

Protocol (both directions): an 8-byte big-endian length, then that many bytes of UTF-8 JSON.
Request: {"kind": "stdin"|"call"|"assert", "program", "timeout", "limits", ...kind fields}; reply: see `_reply`.
Batch (all tests of one program in one visit): {"kind": "batch", "program", "limits", "budget", "tests": [test
fields without program and limits]}; one reply frame per test as it ends, then {"done": n}. Only the host can tell
a wrong output (it holds the expected ones), so it ends a batch early with a {"kind": "stop"} frame, which also
kills the test then running; the runner compiles the program once and each test costs one fork.
Assert-based tests run the trusted test code in a second child under another uid, which calls the candidate through
a pipe with plain data only, so a candidate cannot forge a pass, patch the asserts or return an object whose
`__eq__` lies.
"""

from __future__ import annotations

import fcntl
import gc
import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time
import traceback
import types

HEADER = struct.Struct(">Q")
MAX_FRAME = 1 << 30  # requests carry whole test inputs; a GiB is already far beyond any dataset
# Packages LeetCode's judge gives solutions (sortedcontainers), linked here by scripts/setup.sh and sandbox/Dockerfile;
# one folder of chosen packages, not the system's dist-packages (which may hold native modules tests must not load).
SANDBOX_PACKAGES = "/usr/lib/or1-sandbox/python"
CALL_PRELUDE = (
    "from typing import *\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
    "from heapq import *\nfrom bisect import *\nimport math, string, re, sys, collections, heapq, bisect\n"
)


# ---------------------------------------------------------------- framing (shared with the host-side client)
def read_frame(fd: int, limit: int = MAX_FRAME) -> dict | None:
    """Read one frame from a raw fd; None at a clean end of stream."""
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise ValueError(f"frame of {size} bytes exceeds {limit}")
    body = _read_exact(fd, size)
    if body is None:
        raise EOFError("stream ended inside a frame")
    return json.loads(body.decode("utf-8"))


def write_frame(fd: int, message: dict) -> None:
    """Write one frame to a raw fd."""
    body = json.dumps(message).encode("utf-8")
    _write_all(fd, HEADER.pack(len(body)) + body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------- plain-data codec for assert-based calls
def encode(value, classes: dict) -> object:
    """Turn a value into JSON-able tagged data: builtins and instances of the prefix's classes (graphs allowed)."""
    seen: dict[int, int] = {}

    def enc(v):
        t = type(v)
        if v is None or t is bool or t is str or t is int or t is float:
            return v if t is not float else {"f": repr(v)}
        if isinstance(v, bool | int):
            return int.__index__(v)
        if isinstance(v, str):
            return str.__str__(v)
        if isinstance(v, float):
            return {"f": float.__repr__(v)}
        if isinstance(v, list | tuple | set | frozenset):
            kind = (
                "l"
                if isinstance(v, list)
                else "t"
                if isinstance(v, tuple)
                else "s"
                if isinstance(v, set)
                else "z"
            )
            return {kind: [enc(e) for e in v]}
        if isinstance(v, dict):
            return {"d": [[enc(k), enc(x)] for k, x in dict.items(v)]}
        name = type(v).__name__
        if name in classes:
            if id(v) in seen:
                return {"r": seen[id(v)]}
            seen[id(v)] = len(seen)
            attrs = object.__getattribute__(v, "__dict__")
            return {"o": name, "i": seen[id(v)], "a": {str(k): enc(x) for k, x in dict.items(attrs)}}
        raise TypeError(f"cannot pass a {name} between candidate and checker")

    return enc(value)


def decode(data, classes: dict):
    """Inverse of `encode`, building only builtins and the given trusted classes; anything else is an error."""
    made: dict[int, object] = {}

    def dec(d):
        if d is None or type(d) in (bool, int, str):
            return d
        if type(d) is not dict or len(d) not in (1, 3):
            raise ValueError("malformed value from the other side")
        if "f" in d:
            return float(d["f"])
        if "l" in d:
            return [dec(e) for e in d["l"]]
        if "t" in d:
            return tuple(dec(e) for e in d["t"])
        if "s" in d or "z" in d:
            items = {dec(e) for e in d.get("s", d.get("z"))}
            return items if "s" in d else frozenset(items)
        if "d" in d:
            return {dec(k): dec(v) for k, v in d["d"]}
        if "r" in d:
            return made[int(d["r"])]
        cls = classes[str(d["o"])]
        obj = cls.__new__(cls)
        made[int(d["i"])] = obj
        for k, v in d["a"].items():
            object.__setattr__(obj, str(k), dec(v))
        return obj

    return dec(data)


def prefix_classes(namespace: dict) -> dict:
    """The classes a prefix defined, by name: the only objects allowed across the candidate/checker boundary."""
    return {k: v for k, v in namespace.items() if isinstance(v, type) and v.__module__ == "__or1_prefix__"}


# ---------------------------------------------------------------- inside a test child
def _limit(limits: dict, timeout: float) -> None:
    """Apply rlimits (soft = hard so the program cannot raise them back)."""
    cpu = int(timeout) + 2
    pairs = {
        resource.RLIMIT_CPU: cpu,
        resource.RLIMIT_AS: limits["memory_mb"] << 20,
        resource.RLIMIT_FSIZE: limits["file_mb"] << 20,
        resource.RLIMIT_NOFILE: limits["open_files"],
        resource.RLIMIT_NPROC: limits["processes"],
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_STACK: min(limits["memory_mb"] // 4, 64) << 20,
    }
    for which, value in pairs.items():
        resource.setrlimit(which, (value, value))


_STDIO: tuple = ()  # text streams on fds 0-2, built once by the runner and never used by it: a test's fork gets them


def _text_streams() -> tuple:
    """Fresh, empty text streams on fds 0, 1 and 2 for a test child (whose fds 0-2 are its own pipes by then)."""
    return (
        io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"),
        io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8"),
        io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8"),
    )


def _become(uid: int, workdir: str, fds: dict[int, int], limits: dict, timeout: float) -> None:
    """Turn the forked child into an unprivileged, limited process with only the given fds open."""
    os.setsid()
    high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 100) for target, source in fds.items()}
    for target, source in high.items():  # via high copies: a source number may equal another target
        os.dup2(source, target)
    start = 0
    for fd in sorted(fds) + [os.sysconf("SC_OPEN_MAX")]:
        if fd > start:  # closerange(a, b) with b <= a closes everything on some Pythons
            os.closerange(start, fd)
        start = fd + 1
    os.chdir(workdir)
    oom = os.open(
        "/proc/self/oom_score_adj", os.O_WRONLY
    )  # under memory pressure the kernel kills tests first
    os.write(oom, b"1000")
    os.close(oom)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # drops every capability: the test cannot signal, trace or read the runner
    _limit(limits, timeout)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir})
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.stdin, sys.stdout, sys.stderr = _STDIO
    sys.argv = ["solution.py"]
    sys.setrecursionlimit(20000)


def _module(*names: str) -> dict:
    """The namespace of a fresh module registered in sys.modules under `names` (the first is its __name__):
    @dataclass, pickle and typing look a class's module up there."""
    module = types.ModuleType(names[0])
    module.__dict__["__builtins__"] = __builtins__
    for name in names:
        sys.modules[name] = module
    return module.__dict__


_COMPILED: dict[str, types.CodeType] = {}  # the current batch's program, compiled before its tests fork
# the current batch's tests, whose secrets a candidate child scrubs (see `_fork`)
_BATCH_TESTS: list[dict] = []


def _compiled(source: str) -> types.CodeType:
    """The code object of `source`: compiled once by the runner for a batch, else here in the test child."""
    code = _COMPILED.get(source)
    return code if code is not None else compile(source, "<solution>", "exec")


def _precompile(program: str, kinds: set[str], limits: dict) -> None:
    """Compile the batch's program once, as each kind of test runs it, under the tests' memory limit (the runner
    is root and unlimited otherwise); a program that fails here fails the same way in each test child."""
    _COMPILED.clear()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] << 20, hard))
    try:
        for source in {CALL_PRELUDE + program if kind == "call" else program for kind in kinds}:
            _COMPILED[source] = compile(source, "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        _COMPILED.clear()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _run_program(source: str, name: str, prelude: str = "") -> dict:
    namespace = _module(name) if name != "__main__" else {"__name__": name, "__builtins__": __builtins__}
    exec(_compiled(prelude + source), namespace)
    return namespace


def _candidate_stdin(req: dict) -> None:
    _run_program(req["program"], "__main__")


def _candidate_call(req: dict) -> None:
    ns = _run_program(req["program"], "__or1_solution__", CALL_PRELUDE)
    fn_name = req["fn_name"]
    target = ns.get("Solution")
    fn = (
        getattr(target(), fn_name)
        if isinstance(target, type) and hasattr(target, fn_name)
        else ns.get(fn_name)
    )
    if not callable(fn):
        raise NameError(f"no method Solution.{fn_name} and no function {fn_name}")
    result = fn(*req["args"])
    text = json.dumps(result)  # serialised here, compared on the host: nothing the program returns is trusted
    sys.stdout.flush()
    _write_all(3, text.encode("utf-8"))


def _candidate_serve(req: dict) -> None:
    """Assert mode, untrusted side: run prefix + program, then answer calls from the checker on fds 3/4."""
    ns = _module("__or1_prefix__", "__or1_solution__")
    exec(compile(req["prefix"], "<prefix>", "exec"), ns)
    classes = prefix_classes(ns)
    ns["__name__"] = "__or1_solution__"
    exec(_compiled(req["program"]), ns)
    entry = eval(req["entry_point"], ns)
    while (call := read_frame(3)) is not None:
        try:
            args, kwargs = decode(call["args"], classes), decode(call["kwargs"], classes)
            reply = {"value": encode(entry(*args, **kwargs), classes)}
        except BaseException as exc:  # a failing call is an answer, not a crash of the protocol
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        sys.stdout.flush()
        write_frame(4, reply)


def _checker(req: dict) -> None:
    """Assert mode, trusted side: run prefix + test code and call check() with a proxy to the candidate."""
    ns = _module("__or1_prefix__", "__or1_test__")
    exec(compile(req["prefix"], "<prefix>", "exec"), ns)
    classes = prefix_classes(ns)

    def candidate(*args, **kwargs):
        write_frame(3, {"args": encode(list(args), classes), "kwargs": encode(kwargs, classes)})
        reply = read_frame(4, limit=256 << 20)
        if reply is None:
            raise RuntimeError("the candidate program exited")
        if "error" in reply:
            raise RuntimeError(f"candidate raised {reply['error']}")
        return decode(reply["value"], classes)

    ns["__name__"] = "__or1_test__"
    exec(compile(req["test_code"], "<test>", "exec"), ns)
    ns["check"](candidate)
    _write_all(5, b"PASS")  # fd 5 reaches only the runner; the candidate runs under another uid


def _child_main(body, req: dict) -> None:
    code = 0
    try:
        body(req)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        traceback.print_exception(exc, limit=-3)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


# ---------------------------------------------------------------- the runner's side of one test
class _Capture:
    """Reads a child's pipe into a capped buffer; `over` is set when the program wrote more than the cap."""

    def __init__(self, fd: int, cap: int, keep_tail: bool = False):
        self.fd, self.cap, self.keep_tail = fd, cap, keep_tail
        self.data, self.total, self.over, self.open = bytearray(), 0, False, True

    def pump(self) -> None:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self.open = False
            return
        self.total += len(chunk)
        self.over = self.total > self.cap
        self.data += chunk
        if self.keep_tail and len(self.data) > 4096:
            del self.data[:-4096]
        elif len(self.data) > self.cap:
            del self.data[self.cap :]


def _fork(body, req: dict, uid: int, workdir: str, fds: dict[int, int], hide: tuple[str, ...] = ()) -> int:
    """Start `body(req)` in a limited child; `hide` names request fields the child must not be able to read."""
    gc.freeze()  # the runner's objects stay out of the child's collections: fewer copied pages per fork
    pid = os.fork()
    if pid == 0:
        try:
            # the forked memory holds the whole request, and in a batch every test's: drop each reference to a secret
            for held in (req, *_BATCH_TESTS):
                for key in hide:
                    held[key] = ""
            try:
                _become(uid, workdir, fds, req["limits"], req["timeout"])
            except BaseException as exc:
                os.write(2, f"sandbox setup failed: {exc!r}".encode())
                os._exit(125)
            _child_main(body, req)
        finally:
            os._exit(125)  # a child must never fall back into the runner's code
    return pid


def _workdir(uid: int) -> str:
    path = f"/tmp/or1-{uid}-{time.monotonic_ns()}"
    os.mkdir(path, 0o700)
    os.chown(path, uid, uid)
    return path


class SweepFailed(RuntimeError):
    """Test processes could not be killed: the runner must exit so the host tears the whole sandbox down."""


def _proc_ids(pid: str) -> tuple[str, set[int]] | None:
    """(state, {real, effective, saved, fs uid}) of a process, or None once it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
        try:
            text = os.read(fd, 1 << 16).decode()
        finally:
            os.close(fd)
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return fields["State"].split()[0], {int(u) for u in fields["Uid"].split()}


def _test_processes(uids: set[int]) -> list[int]:
    """Live processes running as a test uid; only tests ever hold those uids, and they cannot change them."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _proc_ids(name)
            if info is not None and info[0] not in ("Z", "X") and info[1] & uids:
                found.append(int(name))
    return found


def _sweep(uids: set[int], children: list[int]) -> None:
    """Kill every process of the test's uids, daemons that escaped included, and reap our own children.

    Never kill(-1): that is contained only by a PID namespace, and run outside one as root it kills the whole
    machine. Each victim is pinned with a pidfd and re-checked before the signal, so a recycled pid is never hit.
    """
    if os.getuid() in uids or 0 in uids:
        raise RuntimeError("refusing to sweep the runner's own uid")
    deadline = time.monotonic() + 5
    while True:
        victims = _test_processes(uids)
        for pid in victims:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                info = _proc_ids(str(pid))
                if info is not None and info[1] & uids:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        for pid in children:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    # still running and not reaped, so the pid is ours: a test stopped or timed out before it changed
                    # uid is no victim by uid, and waiting for it alone could take as long as it likes
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        children = []
        _reap()
        if not victims:
            return
        if time.monotonic() > deadline:
            raise SweepFailed("test processes survived SIGKILL for 5 s")
        time.sleep(0.001)


def _reap() -> None:
    """Collect exited children of the runner (tests whose parent died are reaped by the sandbox's init)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _judge(req: dict, uid: int, checker_uid: int, abort: int | None = None) -> dict:
    """Run one test in fresh children and report what they printed or returned; `abort` readable ends it early."""
    kind, limits = req["kind"], req["limits"]
    stdin = os.memfd_create("stdin")
    _write_all(stdin, req.get("stdin", "").encode("utf-8"))
    os.lseek(stdin, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()  # call: the JSON result; assert: the checker's PASS
    dirs = [_workdir(uid)]
    extra = []
    if kind == "stdin":
        primary = _fork(_candidate_stdin, req, uid, dirs[0], {0: stdin, 1: out_w, 2: err_w})
        others = []
    elif kind == "call":
        primary = _fork(_candidate_call, req, uid, dirs[0], {0: stdin, 1: out_w, 2: err_w, 3: res_w})
        others = []
    elif kind == "assert":
        calls_r, calls_w = os.pipe()
        replies_r, replies_w = os.pipe()
        extra = [calls_r, calls_w, replies_r, replies_w]
        fds = {0: stdin, 1: out_w, 2: err_w, 3: calls_r, 4: replies_w}
        others = [_fork(_candidate_serve, req, uid, dirs[0], fds, hide=("test_code",))]
        dirs.append(_workdir(checker_uid))
        null = os.open("/dev/null", os.O_WRONLY)
        extra.append(null)
        fds = {0: stdin, 1: null, 2: err_w, 3: calls_w, 4: replies_r, 5: res_w}
        primary = _fork(_checker, req, checker_uid, dirs[1], fds)
    else:
        raise ValueError(f"unknown test kind {kind!r}")
    for fd in [stdin, out_w, err_w, res_w, *extra]:
        os.close(fd)
    try:
        return _watch(primary, others, req["timeout"], limits["output_bytes"], abort, out_r, err_r, res_r)
    finally:
        _sweep({uid, checker_uid}, [primary, *others])
        for fd in (out_r, err_r, res_r):
            os.close(fd)
        for path in dirs:
            try:
                os.rmdir(path)  # most tests leave their work directory empty
            except OSError:
                shutil.rmtree(path, ignore_errors=True)


def _watch(primary: int, others: list[int], timeout: float, cap: int, abort: int | None, *fds: int) -> dict:
    out, err, res = _Capture(fds[0], cap), _Capture(fds[1], cap, keep_tail=True), _Capture(fds[2], cap)
    for fd in fds:
        os.set_blocking(fd, False)
    exited = os.pidfd_open(primary)
    start = time.monotonic()
    status, code = None, None
    try:
        while status is None:
            left = start + timeout - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            watched = (
                [c.fd for c in (out, err, res) if c.open] + [exited] + ([abort] if abort is not None else [])
            )
            ready, _, _ = select.select(watched, [], [], left)
            if abort is not None and abort in ready:
                status = "stopped"
                break
            for cap_ in (out, err, res):
                if cap_.fd in ready:
                    cap_.pump()
            if out.over or err.over or res.over:
                status = "output_limit"
            elif exited in ready:
                _, raw = os.waitpid(primary, 0)
                code = os.waitstatus_to_exitcode(raw)
                for cap_ in (out, err, res):  # what the program wrote before exiting is already in the pipes
                    while cap_.open and not cap_.over:
                        before = cap_.total
                        cap_.pump()
                        if cap_.total == before:
                            break
                status = "output_limit" if (out.over or res.over) else "ok" if code == 0 else "runtime_error"
    finally:
        os.close(exited)
    return _reply(status, code, time.monotonic() - start, out, err, res)


def _reply(status: str, code: int | None, wall: float, out: _Capture, err: _Capture, res: _Capture) -> dict:
    """status: ok | runtime_error | timeout | output_limit | stopped (the host ended the batch); result: call mode's
    JSON, or "PASS" in assert mode."""
    decode_ = lambda c: bytes(c.data).decode("utf-8", "replace")  # noqa: E731
    stdout = decode_(out) if status == "ok" else ""  # only a clean run's output is ever compared
    return {
        "status": status,
        "exit_code": code,
        "wall": round(wall, 4),
        "stdout": stdout,
        "stderr": decode_(err)[-2000:],
        "result": decode_(res),
    }


def _serve(uid: int, checker_uid: int) -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if os.geteuid() != 0 or min(uid, checker_uid) < 1000 or uid == checker_uid:
        # tests must run under their own unprivileged uids: sweeping and privilege separation depend on it
        write_frame(1, {"ready": False, "error": "the runner needs root and two distinct test uids >= 1000"})
        return
    if os.path.isdir(SANDBOX_PACKAGES) and SANDBOX_PACKAGES not in sys.path:
        sys.path.append(SANDBOX_PACKAGES)  # the interpreter runs with -I -S: no site-packages otherwise
    global _STDIO
    _STDIO = _text_streams()
    write_frame(1, {"ready": True, "python": sys.version.split()[0]})
    while (req := read_frame(0)) is not None:
        if req.get("kind") == "stop":
            continue  # the host's stop crossed the end of a batch that had already finished
        try:
            if req.get("kind") == "batch":
                _batch(req, uid, checker_uid)
                continue
            reply = _judge(req, uid, checker_uid)
        except SweepFailed as exc:
            write_frame(1, {"status": "internal", "stderr": str(exc)})
            return  # exiting ends the sandbox (bwrap's namespace, or the host restarts the container)
        except EOFError:
            return  # the host went away in the middle of a batch
        except Exception as exc:  # a runner bug is reported to the host, which scores internal_error
            reply = {"status": "internal", "stderr": f"{type(exc).__name__}: {exc}"}
        write_frame(1, reply)


def _batch(req: dict, uid: int, checker_uid: int) -> None:
    """Run a program's tests one after another, each in fresh children with its own timeout, answering as each ends.

    `budget` caps the batch's wall time: a test gets at most what is left of it, and none starts once it is spent.
    A stop frame from the host ends the batch; it may arrive while a test runs (that test is killed, `stopped`).
    """
    start = time.monotonic()
    _precompile(req["program"], {test["kind"] for test in req["tests"]}, req["limits"])
    _BATCH_TESTS[:] = req["tests"]
    ran = 0
    try:
        for test in req["tests"]:
            left = req["budget"] - (time.monotonic() - start)
            if left <= 0 or _stop_waiting():
                break
            test = {
                **test,
                "program": req["program"],
                "limits": req["limits"],
                "timeout": min(test["timeout"], left),
            }
            try:
                reply = _judge(test, uid, checker_uid, abort=0)
            except SweepFailed:
                raise
            except Exception as exc:  # a runner bug: this test is internal, the batch goes on
                reply = {"status": "internal", "stderr": f"{type(exc).__name__}: {exc}"}
            write_frame(1, reply)
            ran += 1
            if reply["status"] == "stopped":
                _take_stop()
                break
    finally:
        _COMPILED.clear()
        _BATCH_TESTS.clear()
    write_frame(1, {"done": ran})


def _stop_waiting() -> bool:
    """Whether the host has sent its stop frame (consumed here); raises EOFError when the host is gone."""
    if not select.select([0], [], [], 0)[0]:
        return False
    _take_stop()
    return True


def _take_stop() -> None:
    """Read the stop frame that made stdin readable; during a batch the host sends nothing else."""
    if read_frame(0) is None:
        raise EOFError("the host closed the pipe")


def _init() -> None:
    """PID 1 of a pool container: close shared writable places to tests, reap orphans, exit on SIGTERM."""
    if os.getpid() != 1:
        sys.exit("--init only runs as PID 1 of a sandbox container")
    for path in ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"):  # engines mount these world-writable
        if os.path.isdir(path):
            os.chmod(path, 0o755)  # tests write only in their own work directories
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1)  # nothing to reap yet; an exec'd runner may start at any moment


if __name__ == "__main__":
    if "--init" in sys.argv:
        _init()
    else:
        # usage: runner.py --serve CANDIDATE_UID CHECKER_UID
        _serve(int(sys.argv[sys.argv.index("--serve") + 1]), int(sys.argv[sys.argv.index("--serve") + 2]))
