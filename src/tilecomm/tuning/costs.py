"""What ``auto`` predicts each candidate of a call costs, and its choice.

NOTE [auto by predicted cost]
    ``algo="auto"`` takes, among the candidates the backend offers for the call, the one with
    the lowest predicted time; candidates predicted within :data:`TIE` of each other go to the
    one with fewer synchronizations (then to the earlier registered). Every rank computes the
    same answer: the inputs are the call's arguments (equal on every rank, or the descriptor
    check raises ``CommMismatch``) and a :class:`CostModel` whose digest the ranks compared
    when the communicator was made. The predictions come from the same models the simulator
    uses, never from size thresholds:

    ============  ==============================================================================
    backend kind  prediction of a candidate
    ============  ==============================================================================
    ``cpu``       the shared-memory runtime's model (``sim/cpu_loop.py``, via ``sim.api``) with
                  this machine's :class:`~tilecomm.topology.spec.ShmCost` (``tilecomm tune``)
                  or the shipped one
    ``gpu``       the simulator's GPU preset (``TILECOMM_GPU_SYSTEM``), one node of ``W`` GPUs
    ``hier``      measured curves of this machine and layout (``tilecomm tune --hosts``) where
                  the tune sweep has them; else the hierarchical model (``sim/hosts.py``) for
                  ``hier_*`` and :func:`engine_model_us` for ``engine``
    ============  ==============================================================================

    Sizes are bucketed to :data:`GRID` steps per power of two (powers of two exactly), so a
    prediction is made once per (call shape, bucket) and cached: a few ms the first time, a
    dictionary lookup after.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from ..topology.spec import ShmCost
from .curves import Curve

#: the inter-host engine as a candidate: the call delegated to torch.distributed over all ranks
ENGINE = "engine"
#: size buckets per power of two
GRID = 4
#: relative difference under which two predictions tie (then fewer synchronizations win)
TIE = 0.01


def bucket(nbytes: int) -> int:
    """The size a prediction is made at: ``nbytes`` rounded to the :data:`GRID` grid (in log
    space; powers of two map to themselves)."""
    if nbytes <= 1:
        return 1
    return max(1, round(2 ** (round(math.log2(nbytes) * GRID) / GRID)))


def layout_key(layout) -> str:
    """``"2+2"``: ranks per host, in host order (the key of a layout's measured curves)."""
    return "+".join(str(len(h)) for h in layout.hosts)


def curve_key(layout, collective: str, algo: str) -> str:
    return f"{layout_key(layout)}|{collective}|{algo}"


@dataclass(frozen=True)
class Choice:
    """What ``auto`` chose and why: ``ranked`` is ``((algo, predicted us), ...)``, fastest
    first; ``source`` says where the costs came from."""

    algo: str
    ranked: tuple[tuple[str, float], ...]
    source: str

    def why(self) -> str:
        top = ", ".join(f"{a} {t:.1f} us" for a, t in self.ranked[:2])
        return f"predicted {top} ({self.source})"

    def to_json(self) -> dict:
        return {"algo": self.algo, "ranked": [list(x) for x in self.ranked],
                "source": self.source}


@dataclass(frozen=True)
class CostModel:
    """The costs ``auto`` ranks candidates by.

    ``shm``: ranks per host -> the shared-memory runtime's parameters on this machine
    (key 0: for any count without its own fit); ``curves``: :func:`curve_key` -> measured
    :class:`Curve`; ``gpu_system``: the simulator preset GPU calls are predicted on;
    ``source``: where it came from (a tune file, or the shipped defaults)."""

    shm: dict[int, ShmCost]
    curves: dict[str, Curve] = field(default_factory=dict)
    gpu_system: str = "dgx-h100"
    source: str = "shipped defaults"

    def __post_init__(self):
        # computed once: the predictions' caches hash the model on every call
        body = json.dumps({"shm": {str(k): asdict(v) for k, v in sorted(self.shm.items())},
                           "curves": {k: c.to_json() for k, c in sorted(self.curves.items())},
                           "gpu": self.gpu_system}, sort_keys=True)
        object.__setattr__(self, "_digest", hashlib.sha1(body.encode()).hexdigest()[:16])

    def __hash__(self) -> int:
        return hash(self._digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, CostModel) and self._digest == other.digest()

    def digest(self) -> str:
        """A hash of everything a prediction depends on (compared across ranks)."""
        return self._digest

    def shm_for(self, ranks: int) -> ShmCost:
        return self.shm.get(ranks) or self.shm[0]

    # ---- predictions ---------------------------------------------------------------------
    def predict(self, collective: str, algo: str, nbytes: int, world_size: int, *,
                kind: str, mem: str = "user", layout=None, root: int = 0) -> float:
        """Predicted time (us) of one call of ``algo`` (``nbytes``: the call's size as the
        bench reports it: all_gather's output, the input otherwise)."""
        return _predict(self, collective, algo, bucket(nbytes), world_size, kind, mem,
                        layout, root)

    def choose(self, collective: str, nbytes: int, world_size: int, candidates, *,
               kind: str, mem: str = "user", layout=None, root: int = 0) -> Choice:
        """The candidate with the lowest predicted time (NOTE [auto by predicted cost])."""
        return _choose(self, collective, bucket(nbytes), world_size, tuple(candidates), kind,
                       mem, layout, root)

    def with_source(self, source: str) -> "CostModel":
        return replace(self, source=source)


#: collectives the models time as another of the same bytes: all_to_all_v's counts are not
#: part of the call's size, so it is predicted as an even all_to_all
_AS = {"all_to_all_v": "all_to_all"}


@lru_cache(maxsize=8192)
def _predict(model: CostModel, collective, algo, n, w, kind, mem, layout, root) -> float:
    collective = _AS.get(collective, collective)
    if kind == "hier":
        c = model.curves.get(curve_key(layout, collective, algo))
        if c is not None:
            return c.at(n)
        per_host = max(len(h) for h in layout.hosts)
        if algo == ENGINE:
            return engine_model_us(collective, n, w, model.shm_for(per_host))
        from ..sim import hosts
        cost = replace(hosts.DEFAULT_COST, shm=model.shm_for(per_host))
        return hosts.predict_us(collective, algo, layout, n, cost, 4, root)
    from ..sim import api
    if kind == "cpu":
        from ..topology.presets import cpu_shm
        spec = replace(cpu_shm(), shm=model.shm_for(w))
        return api.predict(collective, n, system=spec, gpus=w, algo=algo, mem=mem)[0].time_us
    if kind == "gpu":
        return api.predict(collective, n, system=model.gpu_system, gpus=w, algo=algo,
                           mem=mem)[0].time_us
    raise ValueError(f"no cost model for backend kind {kind!r}")


def _syncs(collective: str, algo: str, n: int, w: int, kind: str, mem: str) -> float:
    """Synchronizations of one call (the tie-breaker): the lowered plan's, for flat
    algorithms; inter-host candidates count as one (their rounds are in their curves)."""
    if kind == "hier":
        return 1.0
    from ..sim.cpu_loop import work
    try:
        return work(_AS.get(collective, collective), algo, w, n, mem).syncs
    except (KeyError, ValueError):
        return math.inf


@lru_cache(maxsize=8192)
def _choose(model: CostModel, collective, n, w, candidates, kind, mem, layout,
            root) -> Choice:
    if not candidates:
        raise ValueError(f"{collective}: this backend has no algorithm for it")
    times = []
    for a in candidates:
        try:
            t = _predict(model, collective, a, n, w, kind, mem, layout, root)
        except (KeyError, ValueError):      # a candidate the model cannot time here
            t = math.inf
        times.append((a, float(t)))
    ranked = tuple(sorted(times, key=lambda x: x[1]))
    best_t = ranked[0][1]
    if not math.isfinite(best_t):       # nothing timed: the backend's first (its default)
        return Choice(candidates[0], ranked, model.source + "; no prediction")
    tied = [a for a, t in times if t <= best_t * (1 + TIE)]
    algo = min(tied, key=lambda a: (_syncs(collective, a, n, w, kind, mem),
                                    candidates.index(a))) if len(tied) > 1 else tied[0]
    return Choice(algo, ranked, model.source)


# ---- the engine without a measured curve -------------------------------------------------------

#: rounds of messages each collective costs on Gloo over W ranks (its ring algorithms on TCP,
#: pairwise all_to_all), and the bytes a rank receives, as multiples of the call size (the
#: nccl-tests bus factors)
_ENGINE_ROUNDS = {"all_reduce": lambda w: 2 * (w - 1), "all_gather": lambda w: w - 1,
                  "reduce_scatter": lambda w: w - 1, "broadcast": lambda w: math.ceil(
                      math.log2(max(w, 2))), "reduce": lambda w: math.ceil(math.log2(max(w, 2))),
                  "all_to_all": lambda w: 1, "all_to_all_v": lambda w: 1}
_ENGINE_BYTES = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
                 "reduce_scatter": lambda w: (w - 1) / w, "broadcast": lambda w: 1.0,
                 "reduce": lambda w: 1.0, "all_to_all": lambda w: (w - 1) / w,
                 "all_to_all_v": lambda w: (w - 1) / w}


def engine_model_us(collective: str, nbytes: int, world_size: int, shm: ShmCost) -> float:
    """The engine (Gloo over all ranks) where no curve was measured: its rounds at the
    inter-host link's round time (``sim/hosts.py`` :data:`DEFAULT_COST`, both rails busy:
    every rank is on the wire), plus the descriptor check (one round) and a Python call."""
    from ..sim import hosts
    link = hosts.DEFAULT_COST.both
    w = world_size
    rounds = _ENGINE_ROUNDS[collective](w) + 1
    return shm.call_us + rounds * link.alpha_us + \
        1e-3 * _ENGINE_BYTES[collective](w) * nbytes / link.beta_GBps
