"""`tilecomm tune` end to end on this machine: the one-host sweep fits, stores the file that
later runs use, and `--show` prints the choices from it (or, in a launch in the machine's slow
state, nothing is stored and it says why)."""

import json

from tilecomm.cli import main
from tilecomm.settings import settings
from tilecomm.tuning import store


def test_tune_stores_a_fit_that_later_runs_use(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILECOMM_TUNE_DIR", str(tmp_path))
    monkeypatch.setenv("TILECOMM_TUNE", "1")
    settings.cache_clear()
    store.current.cache_clear()
    try:
        rc = main(["tune", "-n", "2"])
        out = " ".join(capsys.readouterr().out.split())
        files = list(tmp_path.glob("tune-*.json"))
        if rc == 1:         # the sweep ran in the machine's slow state: refused, nothing kept
            assert "not fitted" in out and "slow state" in out and not files, out
            return
        assert rc == 0 and "held out (two_shot, 10 rows): median |error|" in out, out
        assert [p.name for p in files] == [f"tune-{store.fingerprint()}.json"]
        data = json.loads(files[0].read_text())
        assert set(data["shm"]) == {"2"} and data["runs"][0]["command"] == "tilecomm tune -n 2"
        assert store.current().source == f"tuned: {files[0]}"
        assert main(["tune", "--show", "-n", "2", "--collective", "all_reduce"]) == 0
        shown = " ".join(capsys.readouterr().out.split())
        assert "auto on 2 ranks, one host (tuned:" in shown and "one_shot" in shown, shown
    finally:
        settings.cache_clear()
        store.current.cache_clear()


def test_tune_says_what_is_wrong_with_its_arguments(capsys):
    assert main(["tune", "-n", "3", "--hosts", "2"]) == 2
    assert "multiple of it" in capsys.readouterr().err
    assert main(["tune", "-n", "1"]) == 2
