"""Hardware model: system descriptions (presets or JSON), topologies, paths between ranks."""

from .loader import load_system, spec_from_dict
from .model import Topology
from .presets import PRESETS, get_preset, preset_names
from .spec import Fabric, Protocol, ShmCost, SystemSpec


def build(system: "str | SystemSpec", nodes: int = 1, gpus: int | None = None) -> Topology:
    """Topology of ``nodes`` nodes of ``system`` (a preset name, a .json path, or a spec)."""
    spec = load_system(system) if isinstance(system, str) else system
    return Topology(spec, nodes, spec.gpus_per_node if gpus is None else gpus)


__all__ = ["Fabric", "PRESETS", "Protocol", "ShmCost", "SystemSpec", "Topology", "build", "get_preset",
           "load_system", "preset_names", "spec_from_dict"]
