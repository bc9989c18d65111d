"""benchutil.py -- small helpers shared by the bench/*.py scripts (they run as
`python3 bench/NAME.py`, so bench/ is on sys.path and `from benchutil import ...` works)."""
import contextlib
import os


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
