"""System descriptions are validated on load: bad values name the field instead of hanging or
crashing deep inside the simulator."""

import numpy as np
import pytest

from tilecomm.sim.maxmin import max_min_rates
from tilecomm.topology import Protocol, build, get_preset, spec_from_dict

H = "dgx-h100"
P = {"name": "Simple", "eff": 0.8, "step_intra_us": 3.4, "step_net_us": 14}


@pytest.mark.parametrize("changes, message", [
    ({"nic_GBps": -5}, "nic_GBps must be > 0, got -5"),
    ({"nic_GBps": 0}, "nic_GBps must be > 0, got 0"),
    ({"nic_GBps": "fast"}, "nic_GBps must be a finite number, got 'fast'"),
    ({"gpu_link_GBps": float("nan")}, "gpu_link_GBps must be a finite number"),
    ({"mem_GBps": 0}, "mem_GBps must be > 0"),
    ({"reduce_GBps": True}, "reduce_GBps must be a finite number"),
    ({"launch_us": -1}, "launch_us must be >= 0"),
    ({"nvls_alg_GBps": 0}, "nvls_alg_GBps must be > 0"),
    ({"gpus_per_node": 0}, "gpus_per_node must be >= 1"),
    ({"gpus_per_node": 2.5}, "gpus_per_node must be an integer"),
    ({"protocols": [{**P, "eff": 1.5}]}, r"protocols\[0\].*eff must be in \(0, 1\], got 1.5"),
    ({"protocols": [{**P, "eff": 0}]}, r"eff must be in \(0, 1\]"),
    ({"protocols": [{**P, "step_net_us": -1}]}, "step_net_us must be >= 0"),
    ({"protocols": [{"name": "Simple", "eff": 0.8}]}, r"protocols\[0\]: missing step_intra_us"),
    ({"protocols": [P, {**P, "bogus": 1}]}, r"protocols\[1\]: unknown keys \['bogus'\]"),
    ({"protocols": [P, P]}, "protocol names must be unique"),
    ({"protocols": {"name": "x"}}, "protocols: expected a list"),
    ({"fabric": {"oversubscription": 0}}, "fabric.oversubscription must be > 0"),
    ({"fabric": {"levels": "x"}}, "fabric.levels must be an integer"),
    ({"shm": {"call_us": 1.0}}, "shm: missing sync_us"),
])
def test_bad_values_raise_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        spec_from_dict({"base": H, **changes})


def test_full_description_names_missing_fields():
    with pytest.raises(ValueError, match="missing gpu, gpus_per_node"):
        spec_from_dict({"name": "x"})
    with pytest.raises(ValueError, match="JSON object"):
        spec_from_dict([1, 2])


def test_construction_validates_too():
    with pytest.raises(ValueError, match="nic_GBps must be > 0"):
        get_preset(H).with_(nic_GBps=-5)
    with pytest.raises(ValueError, match="eff"):
        Protocol("X", 2.0, 1.0, 1.0)
    # A node without NICs may leave nic_GBps at 0; it just cannot span nodes.
    s = get_preset(H).with_(nics_per_node=0, nic_GBps=0.0)
    with pytest.raises(ValueError, match="no NIC"):
        build(s, nodes=2)


def test_valid_overrides_still_load():
    s = spec_from_dict({"base": H, "nic_GBps": 30, "protocols": [P]})
    assert s.nic_GBps == 30 and s.protocol("simple").name == "Simple"


def test_gpus_zero_is_rejected_not_all():
    with pytest.raises(ValueError, match="gpus per node must be in 1..8, got 0"):
        build(H, nodes=1, gpus=0)
    assert build(H, nodes=1, gpus=None).world_size == 8


def test_max_min_rates_rejects_non_positive_capacity():
    paths = np.array([[0, 1], [1, -1]])
    for bad in (-5.0, 0.0, np.nan):
        with pytest.raises(ValueError, match="capacity must be > 0"):
            max_min_rates(paths, np.array([10.0, bad]))
    rates, _ = max_min_rates(paths, np.array([10.0, 4.0]))
    assert np.allclose(rates, [2.0, 2.0])


@pytest.mark.parametrize("name", ["hgx-h200", "dgx-b200", "gb200-nvl72"])
def test_derived_presets_cite_their_own_sources(name):
    src = get_preset(name).sources
    assert "H100 datasheet" not in src["gpu_link_GBps"]
    assert src["nvls_alg_GBps"] != "nccl-tests#212"
    if name != "hgx-h200":   # B200-class: the NVLS figure is scaled, not measured
        assert "2x" in src["nvls_alg_GBps"] and "not measured" in src["nvls_alg_GBps"]
        assert "NVLink5" in src["gpu_link_GBps"]


def test_pcie_preset_has_no_ll128():
    # NCCL enables LL128 by default only on NVLink paths (tuning.cc ncclTopoTuneModel).
    from tilecomm.sim.nccl import nccl_time
    s = get_preset("pcie-8gpu")
    assert [p.name for p in s.protocols] == ["LL", "Simple"]
    assert "LL128" in s.sources["protocols"]
    assert nccl_time(build(s, 1), "all_reduce", 1 << 20, "ring", "LL128") is None
    assert "LL128" in [p.name for p in get_preset("dgx-h100").protocols]
