"""scripts/pytest_shards.py: the regression's pytest bins (device_verify.sh OT_VERIFY_SHARDS):
every file in exactly one bin, the excluded one in none, bins balanced by the durations of a
pytest log when there is one (no GPU)."""
import os

from conftest import load_script

ps = load_script("pytest_shards")


def _tree(tmp_path, sizes):
    for name, n in sizes.items():
        (tmp_path / name).write_text("#" * n)
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "helper.py").write_text("")
    return str(tmp_path)


def _run(capsys, *args):
    assert ps.main(["pytest_shards.py", *map(str, args)]) == 0
    return [line.split() for line in capsys.readouterr().out.splitlines()]


def test_every_file_once_excluded_none(tmp_path, capsys):
    d = _tree(tmp_path, {"test_a.py": 10, "test_b.py": 20, "test_c.py": 30, "test_d.py": 40,
                         "test_mem.py": 5})
    bins = _run(capsys, 3, d, os.path.join(d, "test_mem.py"))
    files = [f for b in bins for f in b]
    assert sorted(os.path.basename(f) for f in files) == [
        "test_a.py", "test_b.py", "test_c.py", "test_d.py"]
    assert len(bins) == 3 and len(files) == len(set(files))


def test_durations_balance_the_bins(tmp_path, capsys):
    # by size test_big.py is the heaviest; by the log test_slow.py takes 100 s of 112
    d = _tree(tmp_path, {"test_big.py": 5000, "test_slow.py": 10, "test_x.py": 10,
                         "test_y.py": 10})
    log = tmp_path / "pytest.log"
    slow, x, y = (os.path.join(d, f) for f in ("test_slow.py", "test_x.py", "test_y.py"))
    log.write_text("=== slowest durations ===\n"
                   f"60.00s call     {slow}::test_one[1]\n"
                   f"40.00s call     {slow}::test_two\n"
                   f"5.00s setup    {x}::test_x\n"
                   f"4.00s call     {y}::test_y\n"
                   f"3.00s call     {os.path.join(d, 'test_big.py')}::test_b\n")
    bins = _run(capsys, 2, d, "", log)
    alone = [b for b in bins if slow in b]
    assert alone == [[slow]], bins


def test_more_bins_than_files(tmp_path, capsys):
    d = _tree(tmp_path, {"test_a.py": 1, "test_b.py": 2})
    assert len(_run(capsys, 8, d)) == 2
