"""The tensor-parallel process group: rendezvous over torch.distributed's TCPStore, and what every
rank must agree on before it builds its shard (sent by rank 0, so nodes cannot disagree)."""
from __future__ import annotations

import datetime
import fcntl
import logging
import os
import socket
import struct

import msgspec
import torch
import torch.distributed as dist

from rill.ipc.config import ModelConfig

log = logging.getLogger("rill.tp")

# An idle server's ranks wait in a collective (the step broadcast to other nodes) for as long as no
# request comes, so the group's timeout is no watchdog: a rank's death is (its peers' connections
# close, and each node's launcher watches its processes).
GROUP_TIMEOUT = datetime.timedelta(days=30)


class RankSetup(msgspec.Struct):
    """What a rank builds its runner from, decided once by rank 0: the model's slice of the config
    and the values rank 0 computed at start."""

    model: ModelConfig
    dtype: str  # the dtype rank 0 chose
    num_kv_blocks: int
    eos_token_ids: list[int]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def interface_toward(addr: str) -> str | None:
    """The name of the network interface this host reaches `addr` through (lo for 127.0.0.1), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))  # UDP: no packet is sent, the kernel only picks the route
            local = probe.getsockname()[0]
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    info = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
                except OSError:
                    continue  # no IPv4 address on it
            if socket.inet_ntoa(info[20:24]) == local:
                return name
    except OSError:
        pass
    return None


def init_group(rank: int, world_size: int, master_addr: str, master_port: int, device_type: str) -> None:
    """Join the group: rank 0 hosts the TCPStore at master_addr:master_port, the others connect.

    Gloo listens on the address of the host's name unless GLOO_SOCKET_IFNAME names an interface; on a
    machine with several (a container, a veth, a second NIC) that address may not reach the other
    nodes, so Rill picks the interface its route to --master-addr goes through, unless the user set one.
    """
    if device_type != "cuda" and "GLOO_SOCKET_IFNAME" not in os.environ:
        name = interface_toward(master_addr)
        if name is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = name
            log.debug("gloo on interface %s (the route to %s)", name, master_addr)
    if device_type == "cuda":  # one GPU per rank of a node; never run (one GPU was lent, never several)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend_for(device_type), init_method=f"tcp://{master_addr}:{master_port}",
                            world_size=world_size, rank=rank, timeout=GROUP_TIMEOUT)


def share_setup(setup: RankSetup | None) -> RankSetup:
    """Rank 0 passes its setup; every rank returns it."""
    box = [msgspec.msgpack.encode(setup) if setup is not None else None]
    dist.broadcast_object_list(box, src=0)
    return msgspec.msgpack.decode(box[0], type=RankSetup)


def remote_group(world_size: int, nnodes: int):
    """The group of rank 0 and the ranks of the other nodes, which the step reaches over the network
    (the ranks of rank 0's node read it from shared memory); None on one node. Every rank calls this."""
    if nnodes <= 1:
        return None
    per_node = world_size // nnodes
    return dist.new_group([0, *range(per_node, world_size)], timeout=GROUP_TIMEOUT)
