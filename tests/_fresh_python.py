"""``python -c SCRIPT`` for the subprocess checks (the gate, the loader, the
switches), without paying torch's import in each one.

Those checks need a process where ``torch_aot_rt`` was never imported: each
ran ``subprocess.run([sys.executable, "-c", script], ...)``, and each spent
most of its 4 to 6 s importing torch and Dynamo again. Here one server
process per pytest process imports ``torch`` and ``torch._dynamo`` (what
every such script imports first, before anything it changes) and nothing
else, then forks a child per script. The child is what a fresh interpreter
would be at the script's first line, with those imports done:

- ``os.environ`` is the request's environment, the working directory its
  ``cwd``, ``sys.argv`` ``["-c"]``, ``sys.path`` what ``python -c`` builds
  from the request's ``PYTHONPATH`` (``""`` first), a new ``__main__``;
- stdout and stderr go to files the caller reads, stdin is /dev/null;
- the warning filters are those after the imports (the server ignores
  3.12's warning about forking a process with threads, OpenBLAS's, around
  the fork only);
- an uncaught exception prints its traceback and exits 1, ``SystemExit``
  exits with its code, and the exit runs threading's shutdown and the
  ``atexit`` functions, as the interpreter's does.

torch reads some environment variables when it is imported (``TORCH_TRACE``,
``TORCH_LOGS``, ...): a request whose environment differs from the server's
in anything but ``TORCH_AOT_RT*``, ``PYTHONPATH`` and ``PYTEST_*`` (read by
our import, emulated above, pytest's own) runs in a real subprocess, as does every request where
``TORCH_AOT_RT_TEST_FORK=0``.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading

# what a child's environment may differ in from the server's: ours, the
# path, pytest's (PYTEST_CURRENT_TEST names the running test)
_PER_SCRIPT = ("TORCH_AOT_RT", "PYTHONPATH", "PYTEST_")

_SERVER = r"""
import json, os, signal, sys, time, traceback, warnings
import torch, torch._dynamo
fresh_filters = list(warnings.filters)

requests = os.fdopen(os.dup(0), "r")
replies = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
inherited = os.environ.get("PYTHONPATH", "")
base_path = [p for p in sys.path[1:] if p not in inherited.split(os.pathsep)]


def child(req):
    requests.close()
    replies.close()
    out = os.open(req["stdout"], os.O_WRONLY | os.O_TRUNC)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [""] + extra + base_path
    import importlib, types
    importlib.invalidate_caches()
    sys.argv[:] = ["-c"]
    warnings.filters[:] = fresh_filters
    warnings._filters_mutated()
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(req["script"], "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        code = e.code
        if code is None:
            rc = 0
        elif isinstance(code, int):
            rc = code
        else:
            print(code, file=sys.stderr)
            rc = 1
    except BaseException as e:
        # the script's frames only, as the interpreter prints them
        traceback.print_exception(e.with_traceback(e.__traceback__.tb_next))
        rc = 1
    try:
        import threading, atexit
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        rc = rc or 1
    os._exit(rc)


for line in requests:
    req = json.loads(line)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads
        pid = os.fork()
    if pid == 0:
        try:
            child(req)
        finally:
            os._exit(70)
    deadline = time.monotonic() + req["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            rc = "timeout"
            break
        time.sleep(0.02)
    replies.write(json.dumps(rc) + "\n")
    replies.flush()
"""

_lock = threading.Lock()
_server: subprocess.Popen | None = None
_server_env: dict[str, str] = {}


def _start() -> subprocess.Popen:
    global _server, _server_env
    if _server is None or _server.poll() is not None:
        _server_env = {k: v for k, v in os.environ.items() if not k.startswith(_PER_SCRIPT)}
        if "PYTHONPATH" in os.environ:
            _server_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        _server = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=_server_env, text=True,
        )
        atexit.register(_server.stdin.close)
    return _server


def _forkable(env: dict[str, str]) -> bool:
    """The server's imports are what a fresh process's would be: no
    environment variable torch may read differs."""
    keys = set(env) | set(_server_env)
    return all(env.get(k) == _server_env.get(k) for k in keys if not k.startswith(_PER_SCRIPT))


def run(script: str, *, env: dict[str, str], cwd: str | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd,
    capture_output=True, text=True, timeout=timeout)``, forked from the
    server where the environment allows (module docstring)."""
    cwd = cwd or os.getcwd()
    args = [sys.executable, "-c", script]
    use_fork = os.environ.get("TORCH_AOT_RT_TEST_FORK") != "0" and hasattr(os, "fork")
    if use_fork:
        with _lock:
            _start()
            use_fork = _forkable(env)
    if not use_fork:
        return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    with tempfile.TemporaryDirectory() as tmp, _lock:
        paths = {k: os.path.join(tmp, k) for k in ("stdout", "stderr")}
        for p in paths.values():
            open(p, "w").close()
        server = _start()
        server.stdin.write(json.dumps(dict(script=script, env=env, cwd=cwd, timeout=timeout,
                                           **paths)) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        if not reply:
            raise RuntimeError("tests/_fresh_python.py: the fork server exited")
        rc = json.loads(reply)
        outs = {k: open(p).read() for k, p in paths.items()}
    if rc == "timeout":
        raise subprocess.TimeoutExpired(args, timeout, outs["stdout"], outs["stderr"])
    return subprocess.CompletedProcess(args, rc, outs["stdout"], outs["stderr"])
