"""A warm launcher for the tests' `python -m lnjax...` command lines.

Every command line a test starts pays Python's start and the imports of jax, flax, optax,
orbax and tensorflow_datasets again: ~1.6 s of CPU of the LM smoke run's ~8 s (3 runs
forked from a process holding those imports against 3 fresh processes, 2026-12-05, 2-core
machine). `Popen` and `run` here take `subprocess`'s arguments; a command line
`[sys.executable, "-m", MODULE, ...]` run from the repository with the tests' environment
is forked from one server per test process that has imported them (and nothing that
defines a command's flags), so each child is still a process of its own: its pid for
signals, its session, its exit status, its stdin/stdout/stderr. Anything else (another
program, another folder, an environment that jax or the libraries read when imported)
goes to `subprocess` unchanged. LNJAX_TEST_FORK=0 sends everything there.
"""

import atexit
import gc
import io
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ("jax", "jax.numpy", "flax.linen", "optax", "orbax.checkpoint", "ml_collections",
           "absl.app", "absl.flags", "tensorflow_datasets", "grain", "lnjax.core.train",
           "lnjax.tasks")
# Read by jax and the libraries when imported: a child whose environment differs in one of
# these would run with the server's value, so it gets a fresh process instead.
_IMPORT_TIME_ENV = ("JAX_", "XLA_PYTHON", "TF_", "TFDS_", "GRAIN_", "ORBAX_", "PYTHON")
# ... but for PYTHONUNBUFFERED, which a child applies itself (its std streams, below): the
# command lines a test reads as they print set it (most of the stop and launcher tests).
_APPLIED_IN_CHILD = ("PYTHONUNBUFFERED",)


# ---- The server (run as a script: python tests/forkserver.py SOCKET). ------------------

def _child(conn: socket.socket, listener: socket.socket, request: dict, fds: list) -> None:
  """In the forked child: becomes `python -m MODULE ARGS` and exits with its status."""
  listener.close()
  conn.close()
  if request["new_session"]:
    os.setsid()
  for target, fd in zip((0, 1, 2), fds):
    os.dup2(fd, target)
  for fd in set(fds):
    if fd > 2:
      os.close(fd)
  os.environ.clear()
  os.environ.update(request["env"])
  for key, value in _imported_env.items():  # As the imports of a fresh process would set them.
    os.environ.setdefault(key, value)
  os.chdir(request["cwd"])
  unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
  sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
  # (As python -u builds them: text straight to the file, without a buffer between.)
  out = [io.FileIO(fd, "w", closefd=False) for fd in (1, 2)]
  out = out if unbuffered else [io.BufferedWriter(f) for f in out]
  sys.stdout = io.TextIOWrapper(out[0], line_buffering=os.isatty(1), write_through=unbuffered)
  sys.stderr = io.TextIOWrapper(out[1], errors="backslashreplace", line_buffering=True,
                                write_through=unbuffered)
  sys.path[0] = request["cwd"]
  sys.argv = [request["module"], *request["argv"]]
  import runpy
  runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
  # (A SystemExit propagates to the interpreter's own exit: threads joined, atexit run.)


_imported_env: dict = {}  # In the server: what its imports set in os.environ.


def serve(path: str) -> None:
  before = dict(os.environ)
  for name in PRELOAD:
    __import__(name)
  gc.freeze()  # The imports' objects: no child's collection walks them again (and their pages
  # stay shared with it: the gc module's advice before a fork).
  # jax's import sets TF_CPP_MIN_LOG_LEVEL=1 where unset: the clients compare their
  # environment with the server's as it was after these imports (written before the socket).
  _imported_env.update({k: v for k, v in os.environ.items() if before.get(k) != v})
  with open(path + ".env.json", "w") as f:
    json.dump(_imported_env, f)
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path)
  listener.listen(64)
  waiting: dict[int, socket.socket] = {}  # Child pid -> its client's connection.
  parent = os.getppid()
  while os.getppid() == parent:  # (A test process killed by a signal runs no atexit: its
    # server, reparented, ends here instead of outliving it.)
    readable, _, _ = select.select([listener], [], [], 0.05)
    if readable:
      conn, _ = listener.accept()
      message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
      request = json.loads(message)
      pid = os.fork()
      if pid == 0:
        _child(conn, listener, request, fds)
        return  # Only reached when the module returns without SystemExit.
      for fd in fds:
        os.close(fd)
      conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
      waiting[pid] = conn
    while waiting:
      pid, status = os.waitpid(-1, os.WNOHANG)
      if pid == 0:
        break
      conn = waiting.pop(pid, None)
      if conn is not None:
        try:
          conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode()
                       + b"\n")
        except OSError:
          pass
        conn.close()


# ---- The client (in the test process). ----------------------------------------------

_server: dict = {}
_ENV = dict(os.environ)  # The tests' environment (conftest imports this module after setting it).


def _address() -> str | None:
  """The server's socket, started on first use; None where forking is off."""
  if os.environ.get("LNJAX_TEST_FORK", "1") == "0" or not hasattr(socket, "send_fds"):
    return None
  if "path" not in _server:
    folder = tempfile.mkdtemp(prefix="lnjax_forkserver_")
    path = os.path.join(folder, "socket")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], cwd=REPO,
                            stdin=subprocess.DEVNULL, env=_ENV)
    deadline = time.time() + 120
    while not os.path.exists(path):
      if proc.poll() is not None or time.time() > deadline:
        raise RuntimeError(f"the tests' fork server did not start (exit {proc.poll()})")
      time.sleep(0.05)
    with open(path + ".env.json") as f:
      _server.update(path=path, proc=proc, imported_env=json.load(f))
    # Reaped, so that its CPU time (its children's too) counts in the test process's.
    atexit.register(lambda: (proc.kill(), proc.wait(), shutil.rmtree(folder, ignore_errors=True)))
  return _server["path"]


def start() -> None:
  """Starts the server now (it otherwise starts on the first command line forked), so
  that a test can overlap its imports with other waiting."""
  _address()


def _forkable(args, env, cwd) -> bool:
  if not (isinstance(args, (list, tuple)) and len(args) >= 3 and args[0] == sys.executable
          and args[1] == "-m" and str(args[2]).startswith("lnjax")):
    return False
  if cwd is not None and os.path.realpath(cwd) != REPO:
    return False
  if _address() is None:
    return False
  # The value each library read at import: in the server, its environment after its imports
  # (jax's sets TF_CPP_MIN_LOG_LEVEL where unset); in a fresh process, `env`'s, or where `env`
  # has none, what the same imports set. (Compared with _ENV alone, a test process that had
  # imported jax, so holding TF_CPP_MIN_LOG_LEVEL=1, never forked: every command line ran afresh.)
  imported = _server["imported_env"]
  server = {**_ENV, **imported}
  env = os.environ if env is None else env
  keys = {*import_time_variables(env), *import_time_variables(server)}
  return all(env.get(k, imported.get(k)) == server.get(k) for k in keys)


def import_time_variables(env) -> dict:
  """The variables of `env` that a command line forked from the server could not apply."""
  return {k: v for k, v in env.items()
          if k.startswith(_IMPORT_TIME_ENV) and k not in _APPLIED_IN_CHILD}


class Popen:
  """subprocess.Popen's interface for a command line forked from the server (or a
  subprocess.Popen where it cannot be)."""

  def __new__(cls, args, **kwargs):
    if (set(kwargs) - {"stdin", "stdout", "stderr", "env", "cwd", "text",
                       "universal_newlines", "start_new_session", "encoding"}
        or not _forkable(args, kwargs.get("env"), kwargs.get("cwd"))):
      return subprocess.Popen(args, **kwargs)
    return super().__new__(cls)

  def __init__(self, args, stdin=None, stdout=None, stderr=None, env=None, cwd=None,
               text=False, universal_newlines=False, start_new_session=False,
               encoding=None):
    self.args, self.returncode = args, None
    text = text or universal_newlines or encoding is not None
    self._close = []

    def end(spec, fd, write):
      if spec is None:
        return fd, None
      if spec == subprocess.DEVNULL:
        f = os.open(os.devnull, os.O_WRONLY if write else os.O_RDONLY)
        self._close.append(f)
        return f, None
      if spec == subprocess.PIPE:
        r, w = os.pipe()
        self._close.append(w if write else r)
        return (w, r) if write else (r, w)
      return (spec if isinstance(spec, int) else spec.fileno()), None

    in_fd, in_keep = end(stdin, 0, False)
    out_fd, out_keep = end(stdout, 1, True)
    if stderr == subprocess.STDOUT:
      err_fd, err_keep = out_fd, None
    else:
      err_fd, err_keep = end(stderr, 2, True)
    wrap = (lambda fd, mode: open(fd, mode + ("" if text else "b"),
                                  encoding=encoding if text else None))
    self.stdin = wrap(in_keep, "w") if in_keep is not None else None
    self.stdout = wrap(out_keep, "r") if out_keep is not None else None
    self.stderr = wrap(err_keep, "r") if err_keep is not None else None
    request = {"module": args[2], "argv": [str(a) for a in args[3:]],
               "env": dict(os.environ if env is None else env), "cwd": REPO,
               "new_session": bool(start_new_session)}
    self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    self._conn.connect(_server["path"])
    socket.send_fds(self._conn, [json.dumps(request).encode()], [in_fd, out_fd, err_fd])
    for fd in self._close:
      os.close(fd)
    self._buffer = b""
    self.pid = json.loads(self._line(None))["pid"]

  def _line(self, timeout):
    """The server's next message, or None if none came within `timeout` seconds."""
    deadline = None if timeout is None else time.time() + timeout
    while b"\n" not in self._buffer:
      left = None if deadline is None else max(0.0, deadline - time.time())
      if not select.select([self._conn], [], [], left)[0]:
        return None
      chunk = self._conn.recv(4096)
      if not chunk:  # The server went away: the child's status is lost.
        return json.dumps({"returncode": -9})
      self._buffer += chunk
    line, self._buffer = self._buffer.split(b"\n", 1)
    return line

  def poll(self):
    return self.wait(0, raise_timeout=False)

  def wait(self, timeout=None, raise_timeout=True):
    if self.returncode is None:
      line = self._line(timeout)
      if line is None:
        if raise_timeout:
          raise subprocess.TimeoutExpired(self.args, timeout)
        return None
      self.returncode = json.loads(line)["returncode"]
      self._conn.close()
    return self.returncode

  def communicate(self, input=None, timeout=None):
    results = {}

    def drain(name, f):
      results[name] = f.read()
      f.close()
    threads = [threading.Thread(target=drain, args=(n, f), daemon=True)
               for n, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
    for t in threads:
      t.start()
    if self.stdin is not None:
      if input:
        self.stdin.write(input)
      self.stdin.close()
    deadline = None if timeout is None else time.time() + timeout
    for t in threads:
      t.join(None if deadline is None else max(0, deadline - time.time()))
      if t.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(None if deadline is None else max(0, deadline - time.time()))
    return results.get("out"), results.get("err")

  def send_signal(self, sig):
    if self.returncode is None:
      os.kill(self.pid, sig)

  def terminate(self):
    self.send_signal(15)

  def kill(self):
    self.send_signal(9)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for f in (self.stdin, self.stdout, self.stderr):
      if f is not None:
        f.close()
    self.wait()


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
  """subprocess.run, through Popen above."""
  if input is not None:
    kwargs["stdin"] = subprocess.PIPE
  if capture_output:
    kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
  with Popen(args, **kwargs) as proc:
    try:
      out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      raise
  if check and proc.returncode:
    raise subprocess.CalledProcessError(proc.returncode, args, out, err)
  return subprocess.CompletedProcess(args, proc.returncode, out, err)


if __name__ == "__main__":
  sys.path[0] = REPO  # (As `python -m` run from the repository would have it.)
  serve(sys.argv[1])
