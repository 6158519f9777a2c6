"""`tilecomm topo` on this machine: says when there is no GPU, and shows the CPU caches the
cpu-shm cost model depends on."""

from tilecomm.sim.cli import main
from tilecomm.topology import detect


def _index(root, i, level, kind, size, shared):
    d = root / f"index{i}"
    d.mkdir()
    for name, v in (("level", level), ("type", kind), ("size", size),
                    ("shared_cpu_list", shared)):
        (d / name).write_text(v + "\n")


def test_cpu_caches_from_sysfs(tmp_path):
    _index(tmp_path, 0, "1", "Data", "48K", "0")
    _index(tmp_path, 2, "2", "Unified", "1024K", "0")
    _index(tmp_path, 3, "3", "Unified", "32768K", "0-1,4")
    assert detect.cpu_caches(str(tmp_path)) == {
        "L1d": "48K per 1 CPU", "L2": "1024K per 1 CPU", "L3": "32768K per 3 CPUs"}


def test_no_gpu_is_said(monkeypatch, capsys):
    monkeypatch.setattr(detect.shutil, "which", lambda name: None)
    assert detect.gpus() == {"gpus": "none found (nvidia-smi not present)"}
    assert main(["topo", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "none found (nvidia-smi not present)" in out
