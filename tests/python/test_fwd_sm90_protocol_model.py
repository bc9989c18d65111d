"""scripts/model_fwd_sm90_skip.py: the hand model of the Hopper forward's barrier protocol
(producer rings, Q stage, pingpong turns; kFlSkip, kFlShift, kFlStag, kFlDiag) holds on random CTAs,
and each of its mutations -- a protocol bug the kernel must not have -- is caught (no GPU)."""
import random

import pytest

from conftest import load_script

model = load_script("model_fwd_sm90_skip")


def _cases(n, seed):
    """n random CTAs as model.main draws them: (NC, BC, BR, sq, sk, wr, wl, tiles)"""
    rng = random.Random(seed)
    for _ in range(n):
        nc, bc = rng.choice([(2, 128), (3, 128), (2, 80), (2, 192), (2, 176)])
        br = 64 * nc
        sq = rng.choice([1, 17, 100, 300, 700, 1000, 1024, 1300])
        sk = rng.choice([1, 17, 100, 300, 700, 1000, 1024, 1100])
        wr, wl = rng.choice([-1, 0, 0, 0, 5]), rng.choice([-1, -1, 200])
        num_m = -(-sq // br)
        yield nc, bc, br, sq, sk, wr, wl, [rng.randrange(num_m) for _ in range(rng.randint(1, 6))]


@pytest.fixture
def bug(monkeypatch):
    def set_bug(name):
        monkeypatch.setattr(model, "BUG", name)
    return set_bug


def test_protocol_holds_default_skip_shift(bug):
    bug("")
    for trial, (nc, bc, br, sq, sk, wr, wl, tiles) in enumerate(_cases(400, 11)):
        for skip in (False, True):
            assert model.run(tiles, nc, bc, br, sq, sk, wr, wl, skip, trial)
        assert model.run(tiles, nc, bc, br, sq, sk, wr, wl, True, trial, shift=True)
        # kFlStag (its exponential turns), alone, with kFlSkip and with kFlSkip and kFlShift
        assert model.run(tiles, nc, bc, br, sq, sk, wr, wl, False, trial, stag=True)
        assert model.run(tiles, nc, bc, br, sq, sk, wr, wl, True, trial, stag=True)
        assert model.run(tiles, nc, bc, br, sq, sk, wr, wl, True, trial, shift=True, stag=True)
        # kFlDiag (2 consumers, 128-key tile), alone and with kFlStag (its default since
        # 2026-12-02)
        if nc == 2 and bc == 128:
            for stag in (False, True):
                assert model.run(tiles, nc, bc, br, sq, sk, wr, wl, False, trial, stag=stag,
                                 diag=True)


def _some_run_fails(kw, causal):
    """True when the mutated protocol fails (deadlock or hazard) on some random CTA (with the
    skip unless kw says skip=False)"""
    kw = dict(kw)
    skip = kw.pop("skip", True)
    for trial, (nc, bc, br, sq, sk, wr, wl, tiles) in enumerate(_cases(300, 5)):
        if kw.get("diag") and (nc, bc) != (2, 128):
            continue
        if causal:
            wr = 0
        try:
            model.run(tiles, nc, bc, br, sq, sk, wr, wl, skip, trial, **kw)
        except AssertionError:
            return True
    return False


@pytest.mark.parametrize("name,kw,causal", [
    ("noturn", {}, True),              # the skip loop without its turns
    ("nolast", {}, True),              # an all-skipping warpgroup without the last P V's turn
    ("earlyrel", {}, False),           # a V stage released before its use
    # the skip loop without its FULL waits: under kFlShift a warpgroup of rows before 0 skips
    # a whole tile and would release a stage the producer has not filled (without the shift
    # the pingpong order alone keeps it safe: BUG=nowait passes there)
    ("nowait", {"shift": True}, True),
    # kFlStag: a consumer without its exponential turn in a tile prologue
    ("stagskip", {"stag": True, "skip": False}, True),
    # kFlStag with kFlSkip: a skipped tile without its (empty) exponential turn
    ("stagskiploop", {"stag": True}, True),
    # kFlDiag: a consumer that took no narrow step while the other did, without its empty turn
    ("diagnoempty", {"diag": True, "skip": False}, True),
    # kFlDiag with kFlStag: the narrow step's softmax without its exponential turn
    ("diagstagskip", {"diag": True, "stag": True, "skip": False}, True),
])
def test_each_mutation_is_caught(bug, name, kw, causal):
    bug(name)
    assert _some_run_fails(kw, causal), f"mutation {name} was not caught"
