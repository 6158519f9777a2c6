"""Inter-host curves ``auto`` uses where this machine has no tune file of its own.

``tilecomm tune --hosts H -n N --ship THIS_FILE`` writes measured curves here. None are
shipped: curves depend on the machine the simulated hosts share (loopback TCP on its cores),
so every layout is predicted by the hierarchical model until ``tilecomm tune --hosts`` runs.
"""

SOURCE = "shipped defaults"
CURVES: dict[str, list[list[float]]] = {}
