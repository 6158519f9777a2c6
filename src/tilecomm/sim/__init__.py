"""Cost models and the flow-level simulator: time tilecomm's schedules on a topology."""

from .api import Prediction, band, best, candidates, flow_schedule, predict, predict_nccl, why
from .engine import SimResult, simulate, simulate_events, simulate_phases
from .flowsched import FlowPhase, FlowSchedule, from_plans, from_registered, from_schedule

__all__ = ["FlowPhase", "FlowSchedule", "Prediction", "SimResult", "band", "best", "candidates",
           "flow_schedule", "from_plans", "from_registered", "from_schedule", "predict",
           "predict_nccl", "simulate", "simulate_events", "simulate_phases", "why"]
