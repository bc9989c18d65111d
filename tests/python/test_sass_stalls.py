"""bench/sass_stalls.py: ncu's source-page CSV (per-SASS-instruction warp-state samples) summed
by opcode -- predicates and modifiers dropped, thousands separators read, ncu's lines before
the header skipped, the stall columns summed per opcode (no GPU)."""
from conftest import load_script

ss = load_script("sass_stalls", "bench")

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)",'
          '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed",'
          '"stall_wait","stall_mio","stall_wait (Not Issued)"')
ROWS = [
    ('0x10', 'MUFU.EX2 R24, R24', '1,200', '600', '200,704', '500', '100', '300'),
    ('0x20', '@P2   MUFU.EX2 R21, R17', '300', '150', '200,704', '70', '80', '40'),
    ('0x30', '@!P0  BRA 0x7f7a6b7af930', '400', '10', '3,118,795', '0', '0', '0'),
    ('0x40', 'FMNMX R22, R24, R17, !PT', '90', '30', '200,704', '40', '0', '20'),
    ('0x50', '@!UPT UISETP.GT.OR UP2, UPT, UR7, UR16, !UP3', '10', '0', '65,536', '5', '0', '1'),
]


def _csv(tmp_path, preamble=True):
    p = tmp_path / "sass.csv"
    lines = ["==PROF== Connected to process 1 (python3)"] if preamble else []
    lines.append(HEADER)
    lines += [",".join(f'"{v}"' for v in r) for r in ROWS]
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_opcode_drops_predicates_and_modifiers():
    assert ss._opcode("@P2   MUFU.EX2 R21, R17") == "MUFU"
    assert ss._opcode("@!P0  BRA 0x7f") == "BRA"
    assert ss._opcode("@!UPT UISETP.GT.OR UP2, UPT") == "UISETP"
    assert ss._opcode("  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20]") == "HGMMA"
    assert ss._opcode("") == ""


def test_rows_skip_the_preamble(tmp_path):
    cols, rows = ss._rows(_csv(tmp_path))
    assert cols[:2] == ["Address", "Source"] and len(rows) == len(ROWS)
    assert ss._num(rows[2]["Instructions Executed"]) == 3118795.0


def test_report_sums_by_opcode(tmp_path, capsys):
    ss.report(_csv(tmp_path))
    out = capsys.readouterr().out
    total = 1200 + 300 + 400 + 90 + 10
    assert f"samples: {total}" in out
    # MUFU's two sites: 1500 of 2000 samples, 401408 executed; the stall columns summed
    mufu = next(line for line in out.splitlines() if line.split()[:1] == ["MUFU"])
    assert mufu.split()[1] == "75.0%" and mufu.split()[3] == "2" and mufu.split()[4] == "401408"
    assert "stall_wait=570" in out and "stall_mio=180" in out
    # the "(Not Issued)" twin is not summed beside it
    stalls = out.split("stall columns by opcode")[1].split("top instructions:")[0]
    mufu_stalls = next(line for line in stalls.splitlines() if line.split()[:1] == ["MUFU"])
    assert mufu_stalls.count("stall_wait") == 1 and "Not Issued" not in stalls
    # the top instruction first
    top = out.split("top instructions:")[1].splitlines()[1]
    assert "MUFU.EX2 R24, R24" in top and "60.00%" in top


def test_no_csv_is_reported(tmp_path, capsys):
    p = tmp_path / "empty.csv"
    p.write_text("==ERROR== the report has no kernel\n")
    ss.report(str(p))
    assert "no CSV source rows" in capsys.readouterr().out
