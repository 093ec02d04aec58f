"""Starts and stops `twell serve` for the serving scripts and tests: loopback only, a free port.

    with TwellServer(twell, model, "--kv-tokens", "8192", env=env) as s:
        urllib.request.urlopen(s.url + "/health"); s.metric("twell_requests_running")

The server binds port 0 on its default host, 127.0.0.1, and prints the address it got; the start
waits (bounded by `timeout`) for that line, refusing any address but 127.0.0.1, then for /health to
answer 200 (503 while the model loads). Its log is drained on a thread (`lines` keeps it) so a
chatty server never blocks. On Linux the server gets SIGKILL if the process that started it dies
first (a test killed by its timeout leaves no server behind). `stop` sends SIGTERM and waits; past
its timeout it kills the server and returns None, else the exit status.
"""
import ctypes
import re
import signal
import subprocess
import threading
import time
import urllib.request


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: stop() and the callers' cleanup still apply


class TwellServer:
    def __init__(self, twell, model, *args, device="cpu", env=None, timeout=120):
        self.p = subprocess.Popen([twell, "serve", "--model", model, "--device", device, "--port", "0", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  preexec_fn=_die_with_parent)
        self.lines, self.url, self.port = [], None, None
        t0 = time.time()
        try:
            while self.url is None and time.time() - t0 < timeout:
                line = self.p.stdout.readline()  # the server prints its address before it loads
                if not line and self.p.poll() is not None:
                    raise RuntimeError("twell serve exited at start:\n" + "".join(self.lines[-10:]))
                self.lines.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    self.url = f"http://127.0.0.1:{self.port}"
            if self.url is None:
                raise RuntimeError(f"twell serve printed no loopback address within {timeout} s")
            threading.Thread(target=lambda: self.lines.extend(self.p.stdout), daemon=True).start()
            while time.time() - t0 < timeout:
                try:
                    if urllib.request.urlopen(self.url + "/health", timeout=5).status == 200:
                        return
                except OSError:  # 503 while loading (HTTPError), or not answering yet
                    pass
                if self.p.poll() is not None:
                    raise RuntimeError("twell serve exited while loading:\n" + "".join(self.lines[-10:]))
                time.sleep(0.1)
            raise RuntimeError(f"twell serve not healthy within {timeout} s")
        except BaseException:
            self.kill()
            raise

    def metric(self, name, headers=None):
        """A /metrics sample's value, or None when it is missing or the server does not answer."""
        req = urllib.request.Request(self.url + "/metrics", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return None
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)

    def stop(self, timeout=60):
        if self.p.poll() is not None:
            return self.p.returncode
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
