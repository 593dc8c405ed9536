"""Multi-node serving: ``--hosts FILE`` -> the mpirun invocation FasterTransformer expects.

FasterTransformer runs **one MPI process per node** (the backend starts one thread per GPU), so
``tp x pp`` must equal ``GPUs per node x nodes``, the model has exactly one instance, and the model
store must be on storage every node sees at the same path. Rank 0's node receives the requests.

The hosts file lists one node per line, rank 0 first; ``#`` starts a comment; an optional
``gpus=N`` (or Open MPI's ``slots=N``, read as GPUs) gives the node's GPU count::

    node-a gpus=8
    node-b gpus=8

The native launcher (``--runtime fastertransformer-native``) also takes a machine on several adjacent
lines: each line is one FasterTransformer process (one MPI rank, a "node" to FasterTransformer), and
the processes of one machine split its GPUs (``localhost`` twice runs two ranks of one GPU each on a
two-GPU host, which is how multi-node serving is proven without a second machine).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ftx_triton.errors import CheckpointError, ConfigError
from ftx_triton.io.regular import read_regular

HOSTFILE_NAME = "ftx-hostfile"
FORWARDED_ENV = ("CUDA_VISIBLE_DEVICES", "NCCL_LAUNCH_MODE", "FT_LOG_LEVEL")


@dataclass(frozen=True)
class HostList:
    """Nodes from a hosts file, rank 0 first."""

    hosts: tuple[str, ...]
    gpus: tuple[int | None, ...]
    path: Path | None = None


@dataclass(frozen=True)
class NodeLayout:
    """How a model is laid out over nodes; ``hosts`` is empty for a single node."""

    nodes: int
    gpus_per_node: int
    hosts: tuple[str, ...] = ()
    ssh_port: int = 2222

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def machines(self) -> tuple[tuple[str, int], ...]:
        """(machine, processes on it), rank order: a machine listed on k adjacent lines runs k ranks."""
        out: list[tuple[str, int]] = []
        for host in self.hosts:
            if out and out[-1][0] == host:
                out[-1] = (host, out[-1][1] + 1)
            else:
                out.append((host, 1))
        return tuple(out)

    @property
    def ranks_per_machine(self) -> int:
        """The most ranks any one machine runs."""
        return max((count for _, count in self.machines), default=1)

    def hostfile_text(self) -> str:
        """Open MPI hostfile: a slot per process, so ``-n <nodes>`` fills each machine with its ranks."""
        return "".join(f"{host} slots={count}\n" for host, count in self.machines)


MAX_HOSTS_BYTES = 1 << 20
"""The largest hosts file read (a line per machine)."""
MAX_GPUS_PER_NODE = 64
"""The most GPUs a hosts-file line may declare (the largest machines hold 16)."""
_LINE = re.compile(r"^(?P<host>[A-Za-z0-9\[][A-Za-z0-9_.:\[\]-]*)(?:\s+(?P<opts>.*))?$")
"""A host name starts with a letter, digit or ``[`` (IPv6): never ``-``, which mpirun and ssh take as an option."""


def read_hosts(path: Path, *, repeats: bool = False) -> HostList:
    """Parse a hosts file (see the module docstring); ``repeats``: a machine may take adjacent lines."""
    try:
        text = read_regular(path, MAX_HOSTS_BYTES).decode("utf-8")
    except (OSError, ValueError, CheckpointError) as exc:  # a pipe or /dev/zero is refused, not read forever
        reason = exc.message if isinstance(exc, CheckpointError) else getattr(exc, "strerror", None) or exc
        raise ConfigError(
            f"cannot read the hosts file {path}: {reason}", hint="--hosts takes a text file with one node name per line"
        ) from None
    hosts: list[str] = []
    gpus: list[int | None] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise ConfigError(
                f"{path}:{number}: {raw.strip()[:80]!r} is not 'HOST [gpus=N]'",
                hint="one machine per line: a name or address starting with a letter, a digit or '[', "
                "then optionally gpus=N",
            )
        count: int | None = None
        for opt in (m.group("opts") or "").split():
            key, _, value = opt.partition("=")
            if key in ("gpus", "slots") and value.isdigit() and 0 < int(value) <= MAX_GPUS_PER_NODE:
                count = int(value)
            elif key in ("gpus", "slots"):
                raise ConfigError(
                    f"{path}:{number}: {opt!r} is not a GPU count of 1 to {MAX_GPUS_PER_NODE}",
                    hint="write the number of GPUs the machine has, e.g. 'HOST gpus=8'",
                )
            else:
                raise ConfigError(f"{path}:{number}: unknown option {opt!r}", hint="use 'HOST gpus=N'")
        if m.group("host") in hosts and not (repeats and hosts[-1] == m.group("host")):
            if repeats:
                raise ConfigError(
                    f"{path}:{number}: {m.group('host')} is listed again after another machine",
                    hint="put the lines of one machine next to each other (ranks are numbered in order)",
                )
            raise ConfigError(
                f"{path}:{number}: {m.group('host')} is listed twice",
                hint="FasterTransformer runs one process per node: list each node once",
            )
        hosts.append(m.group("host"))
        gpus.append(count)
    if not hosts:
        raise ConfigError(f"the hosts file {path} lists no node")
    return HostList(tuple(hosts), tuple(gpus), path)


def node_layout(hosts: HostList | None, *, tp: int, pp: int, instances: int = 1, ssh_port: int = 2222) -> NodeLayout:
    """Check ``tp x pp = GPUs per node x nodes`` (and one instance) and return the layout."""
    world = tp * pp
    if hosts is None or len(hosts.hosts) == 1:
        per_node = hosts.gpus[0] if hosts and hosts.gpus[0] else world
        if per_node < world:
            raise ConfigError(
                f"tp x pp = {world} GPUs do not fit on one node with {per_node} GPUs",
                hint="add nodes to the hosts file, or lower --tp/--pp",
            )
        check_instances_share_gpus(tp, pp, instances)
        return NodeLayout(1, world, hosts.hosts if hosts else (), ssh_port)
    nodes = len(hosts.hosts)
    if instances != 1:
        raise ConfigError(
            f"multi-node FasterTransformer serves exactly one model instance (got --instances {instances})",
            hint="use --instances 1 with --hosts",
        )
    declared = {g for g in hosts.gpus if g is not None}
    if len(declared) > 1:
        raise ConfigError(
            f"the nodes in {hosts.path} have different GPU counts {sorted(declared)}",
            hint="FasterTransformer needs the same number of GPUs on every node",
        )
    if declared:
        per_node = declared.pop()
        if per_node * nodes != world:
            raise ConfigError(
                f"tp x pp = {tp} x {pp} = {world} but {nodes} nodes x {per_node} GPUs = {per_node * nodes}",
                hint=f"FasterTransformer needs tp x pp = GPUs per node x nodes; e.g. --tp {per_node} --pp {nodes}",
            )
    else:
        if world % nodes:
            raise ConfigError(
                f"tp x pp = {world} GPUs cannot be split evenly over {nodes} nodes",
                hint=f"use a tp x pp that is a multiple of {nodes} (e.g. --tp <GPUs per node> --pp {nodes})",
            )
        per_node = world // nodes
    return NodeLayout(nodes, per_node, hosts.hosts, ssh_port)


def check_instances_share_gpus(tp: int, pp: int, instances: int) -> None:
    """Several instances of a model that spans several GPUs are refused: the server gets tp x pp GPUs, so every
    instance runs on the same ones, each with its own NCCL communicator and custom all-reduce buffers, and the
    backend runs the instances at once. Two instances' all-reduce kernels spin on the same GPUs waiting for
    their peers, in whichever order each GPU took them, and can wait on each other for ever (the OpenAI and
    text paths hung at 64 clients with --tp 4 --instances 2). One-GPU instances have no collective to wait on."""
    if instances > 1 and tp * pp > 1:
        raise ConfigError(
            f"--instances {instances} with tp x pp = {tp} x {pp}: every instance would run on the same "
            f"{tp * pp} GPUs with its own NCCL communicator and all-reduce buffers, and two instances' "
            "all-reduces on one GPU can wait on each other for ever (the server hung under load)",
            hint="use --instances 1 (its dynamic batcher batches every request), or --tp 1 --instances N "
            "for a model that fits one GPU",
        )


def check_hosts_resolve(layout: NodeLayout) -> None:
    """Every machine of the hosts file has an address: a misspelt or unknown name is a ConfigError in
    seconds, before anything is fetched (the Docker launcher's other nodes start their containers only
    when told, so their ssh port cannot be checked this early; the native launcher also dials it)."""
    import socket

    for host, _ in layout.machines:
        try:
            socket.getaddrinfo(host, None)
        except OSError as exc:
            raise ConfigError(
                f"the hosts file names {host}, which does not resolve to an address: {exc.strerror or exc}",
                hint="check the name (it must resolve on this machine: DNS or /etc/hosts), or remove the line",
            ) from None


def mpirun_argv(layout: NodeLayout, hostfile: str | None = None, forward: Sequence[str] = FORWARDED_ENV) -> list[str]:
    """``mpirun -n <nodes> --allow-run-as-root`` (+ hostfile, env forwarding and ssh port for several nodes)."""
    argv = ["mpirun", "-n", str(layout.nodes), "--allow-run-as-root"]
    if layout.multi_node:
        if hostfile is None:
            raise ValueError("a multi-node layout needs the hostfile path")
        argv += ["--hostfile", hostfile, "--map-by", "ppr:1:node"]
        for name in forward:
            argv += ["-x", name]
        argv += ["--mca", "plm_rsh_args", f"-p {layout.ssh_port} -o StrictHostKeyChecking=no"]
    return argv
