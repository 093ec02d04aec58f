"""Starts and stops `twell serve` for the serving scripts and their test (loopback, a free port).

    with TwellServer(twell, model, "--kv-tokens", "8192", env=env) as s:
        urllib.request.urlopen(s.url + "/health")

The server binds port 0 and prints the port it got; the start waits (bounded) for that line and
then for /health to answer 200 (503 while the model loads). Its log is drained on a thread so a
chatty server never blocks; `lines` keeps it. Leaving the block sends SIGTERM and waits, then kills.
"""
import re
import subprocess
import threading
import time
import urllib.request


class TwellServer:
    def __init__(self, twell, model, *args, device="cpu", env=None, timeout=120):
        self.p = subprocess.Popen([twell, "serve", "--model", model, "--device", device, "--port", "0", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines, self.url = [], None
        t0 = time.time()
        try:
            while self.url is None and time.time() - t0 < timeout:
                line = self.p.stdout.readline()
                if not line and self.p.poll() is not None:
                    raise RuntimeError("twell serve exited at start:\n" + "".join(self.lines[-10:]))
                self.lines.append(line)
                m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
                if m:
                    self.url = m.group(1)
            if self.url is None:
                raise RuntimeError(f"twell serve printed no address within {timeout} s")
            threading.Thread(target=lambda: self.lines.extend(self.p.stdout), daemon=True).start()
            while time.time() - t0 < timeout:
                try:
                    if urllib.request.urlopen(self.url + "/health", timeout=5).status == 200:
                        return
                except Exception:  # noqa: BLE001 (503 while loading, or not yet listening)
                    pass
                if self.p.poll() is not None:
                    raise RuntimeError("twell serve exited while loading:\n" + "".join(self.lines[-10:]))
                time.sleep(0.2)
            raise RuntimeError(f"twell serve not healthy within {timeout} s")
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout=60):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
