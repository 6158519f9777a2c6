"""Which ranks share a host, decided by what they can map (not by hostname).

Each rank creates a small probe file in the shared-memory directory holding a random token and
publishes its path; every rank then tries to open every other rank's file and read the token.
Two ranks share a host when each can read the other's token: two containers with one hostname
but private /dev/shm cannot, two ranks with different hostnames that share a /dev/shm can.
"""

from __future__ import annotations

import os
import secrets
import socket

from ..errors import CommError
from .layout import HostLayout


def discover_hosts(store, rank: int, world_size: int, shm_dir: str) -> HostLayout:
    """The host layout of ``world_size`` ranks meeting through ``store`` (collective)."""
    token = secrets.token_hex(16)
    path = os.path.join(shm_dir, f"tilecomm-probe-{secrets.token_hex(12)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, token.encode())
        os.close(fd)
        store.set(f"probe/{rank}", f"{socket.gethostname()}|{path}|{token}")
        seen = []
        for r in range(world_size):
            _, p, tok = store.get(f"probe/{r}").decode().split("|", 2)
            seen.append("1" if r == rank or _reads(p, tok) else "0")
        store.set(f"probe-seen/{rank}", "".join(seen))
        rows = [store.get(f"probe-seen/{r}").decode() for r in range(world_size)]
    finally:
        try:
            os.unlink(path)     # every rank has read every file once all rows are in
        except FileNotFoundError:
            pass
    return layout_from_matrix(rows)


def _reads(path: str, token: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(64).decode(errors="replace") == token
    except OSError:
        return False


def layout_from_matrix(rows: list[str]) -> HostLayout:
    """Hosts from the "rank i can map rank j" matrix (rows of '0'/'1'); every host must be a
    clique of ranks that map each other."""
    w = len(rows)
    host_of = [-1] * w
    hosts: list[list[int]] = []
    for i in range(w):
        if host_of[i] >= 0:
            continue
        members = [j for j in range(w) if rows[i][j] == "1" and rows[j][i] == "1"]
        for j in members:
            if host_of[j] >= 0:
                raise CommError(f"tilecomm: ranks {i} and {j} see different sets of ranks in "
                                f"shared memory; cannot tell which ranks share a host")
            host_of[j] = len(hosts)
        hosts.append(members)
    for h in hosts:
        for a in h:
            for b in h:
                if rows[a][b] != "1":
                    raise CommError(f"tilecomm: rank {a} cannot map rank {b}'s memory though "
                                    f"both share memory with rank {h[0]}")
    return HostLayout(tuple(tuple(h) for h in hosts))
