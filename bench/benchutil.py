"""benchutil.py -- small helpers shared by the bench/*.py scripts (they run as
`python3 bench/NAME.py`, so bench/ is on sys.path and `from benchutil import ...` works)."""
import contextlib
import importlib.util
import os
import pathlib
import sys


def engine_module():
    """python/ops_transformer/engine.py loaded from the source tree (no package install):
    the engine's ctypes binding (it finds libot_engine.so by $OT_ENGINE_LIB or the build
    folders)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "python" / "ops_transformer" / "engine.py"
    spec = importlib.util.spec_from_file_location("ot_engine_py", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ot_engine_py"] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def env_set(env):
    """The environment variables of `env` set for the block (the library reads its OT_*
    switches at each call), then the caller's own values -- or their absence -- put back, so
    a variable the caller set for a whole run (OT_LINEAR_PDL=0, say) stays set after it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def round_order(n, r):
    """Round r's order of n sides (indices): row r of a Williams Latin square. Over n rounds
    (2n for odd n: the rows mirrored in the second n) each side takes every position equally
    often and runs right after every other side equally often; a cyclic rotation keeps each
    side's predecessor (in attn_fwd_variants.py the default always followed the slow flash
    peer, whose calls let the clocks recover). Shared by attn_fwd_variants.py and
    ab_attention_bwd.py."""
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo)
        lo += 1
        if len(base) < n:
            base.append(hi)
            hi -= 1
    row = [(b + r) % n for b in base]
    return row[::-1] if n % 2 and (r // n) % 2 else row


class GpuSampler:
    """The SM clock (MHz) and board power (W) sampled by `nvidia-smi --loop-ms` in a
    background thread, each sample attributed to the named span (begin() .. end(name)) it
    falls in: what the chip ran at while each entry of an A/B was timed. Why: a form that
    keeps the tensor pipe busier can draw more power and run at a lower clock (the H200
    caps its board power), which the timings alone do not tell apart from a slower kernel.
    `cmd` replaces the nvidia-smi command (tests); a missing nvidia-smi leaves the summary
    empty. Samples lag the chip by up to a period plus nvidia-smi's own query time."""

    def __init__(self, period_ms=20, gpu=0, cmd=None):
        import subprocess
        import threading
        import time
        self._time = time.monotonic
        self.samples = []            # (t, sm_mhz, power_w)
        self.spans = []              # (name, t0, t1)
        self._t0 = None
        self._lock = threading.Lock()
        cmd = cmd or ["nvidia-smi", "-i", str(gpu), "--query-gpu=clocks.sm,power.draw",
                      "--format=csv,noheader,nounits", f"--loop-ms={int(period_ms)}"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True, bufsize=1)
        except OSError:
            self._proc = None
            return
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                mhz, watts = float(parts[0]), float(parts[1])
            except (ValueError, IndexError):
                continue
            with self._lock:
                self.samples.append((self._time(), mhz, watts))

    def begin(self):
        self._t0 = self._time()

    def end(self, name):
        if self._t0 is not None:
            self.spans.append((name, self._t0, self._time()))
        self._t0 = None

    @contextlib.contextmanager
    def span(self, name):
        self.begin()
        try:
            yield
        finally:
            self.end(name)

    def summary(self, names=None):
        """{name: {"sm_mhz": mean, "power_w": mean, "samples": n}} over the spans of each
        name (all names, or those given) that samples fell in; names without one left out."""
        with self._lock:
            samples = list(self.samples)
        acc = {}
        for name, t0, t1 in self.spans:
            if names is not None and name not in names:
                continue
            for t, mhz, watts in samples:
                if t0 <= t <= t1:
                    a = acc.setdefault(name, [0.0, 0.0, 0])
                    a[0] += mhz
                    a[1] += watts
                    a[2] += 1
        return {n: {"sm_mhz": round(a[0] / a[2], 1), "power_w": round(a[1] / a[2], 1),
                    "samples": a[2]} for n, a in acc.items()}

    def reset(self):
        """Forget the spans (the samples' times stay comparable)."""
        self.spans = []

    def close(self):
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except Exception:   # noqa: BLE001 -- a stuck nvidia-smi is killed
                self._proc.kill()
            self._proc = None
