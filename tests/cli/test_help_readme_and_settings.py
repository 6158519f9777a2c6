"""What a new user reads and sets first: help texts, the README quick start's sizes and its tour
(also under spawn), bench rows of equal sizes, a TILECOMM_SHM_DIR that does not exist, the
settings table of `tilecomm doctor`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tilecomm.bench.cases import bench_table
from tilecomm.cli import main
from tilecomm.heap.shm import create_segment_file
from tilecomm.units import format_size, parse_size, sizes

README = Path(__file__).resolve().parents[2] / "README.md"


def test_help_texts_have_no_markup_and_no_second_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "tilecomm: the command line." in out and "``" not in out
    with pytest.raises(SystemExit):
        main(["model", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: --nodes x node)" in out
    assert "(default: None)" not in out and "(default: False)" not in out
    assert "(default: dgx-h100)" in out           # real defaults are still shown


def test_the_quick_start_sentence_matches_the_sizes_it_runs():
    text = README.read_text()
    cmd = re.search(r"tilecomm bench all_reduce -n 2 -b (\S+) -e (\S+) -f (\d+)", text)
    got = sizes(parse_size(cmd[1]), parse_size(cmd[2]), int(cmd[3]))
    first, last = format_size(got[0]), format_size(got[-1])
    assert f"from {first} B to {last[:-1]} MB" in " ".join(text.split())
    assert got[-1] <= parse_size(cmd[2]) < got[-1] * int(cmd[3])   # nccl-tests: <= -e


def test_sizes_with_the_same_element_count_give_one_row():
    rows = bench_table("all_gather", ["ring", "direct"], [1, 2, 4, 8, 16, 32], "float32",
                       world=4)
    assert [(r.nbytes, r.algo) for r in rows] == [(1, "ring"), (1, "direct"), (32, "ring"),
                                                  (32, "direct")]
    assert [r.nbytes for r in bench_table("all_reduce", ["auto"], [1, 2, 4, 8])] == [1, 8]


def test_the_readme_tour_guards_its_launch():
    tour = README.read_text().split("## A tour", 1)[1].split("```python", 1)[1].split("```")[0]
    assert re.search(r'^if __name__ == "__main__":.*\n    print\(tilecomm\.launch\(work, 4\)\)',
                     tour, re.M), tour


@pytest.mark.slow
def test_an_unguarded_launch_under_spawn_says_why(tmp_path):
    prog = tmp_path / "unguarded.py"
    prog.write_text("import tilecomm\n\ndef work(comm):\n    return comm.rank\n\n"
                    "print(tilecomm.launch(work, 2))\n")
    env = dict(os.environ, TILECOMM_START_METHOD="spawn")
    p = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "exited with code 1 before returning (under the spawn start method every rank " \
           "imports the main module again" in p.stderr
    assert 'if __name__ == "__main__":' in p.stderr


def test_a_missing_shm_dir_names_the_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"TILECOMM_SHM_DIR\) does not exist"):
        create_segment_file(str(tmp_path / "nowhere"), 4096)


def test_doctor_prints_bracketed_text_in_a_settings_meaning(capsys, monkeypatch):
    """rich reads "[co-residency]" as markup and printed TILECOMM_GPU_COOPERATIVE's meaning as
    "... (NOTE );". The self-test's ranks are stubbed: the settings table is what is tested."""
    import tilecomm
    from tilecomm.backends.cpu.cma import SINGLE_COPY_YES
    from tilecomm.settings import describe

    meaning = {v: m for v, _, m in describe()}["TILECOMM_GPU_COOPERATIVE"]
    assert "NOTE [co-residency]" in meaning
    from tilecomm.bench import machine

    def launch(fn, n, **kw):
        if fn is machine.probe:
            return [{"rewrite_us": 60.0, "local_us": 30.0}] + [None] * (n - 1)
        return [(3.0, SINGLE_COPY_YES)] * n
    monkeypatch.setattr(tilecomm, "launch", launch)
    assert main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "[co-residency]" in out and "NOTE );" not in out
    assert "cross-core write probe" in out and "(x2.0; slow above x8): normal" in out
