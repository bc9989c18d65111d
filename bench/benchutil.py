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
