"""In-process simulation through Flower's own engine (`run_simulation`), for tests and scripted experiments.

`run_simulation` does not read pyproject.toml (context.run_config is empty), so the run config is injected into
both apps' contexts here; everything else is the same code path as `flwr run .`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, Callable

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from .inprocess import InProcessGrid, server_context
from .interruption import RunInterrupted, clear_interrupt, interrupt
from .protocols import register_client_handlers
from .server.app import run

STOP_GRACE_S = 4.0  # after a Ctrl-C, how long the ServerApp's thread may take to reach its next check and record it

log = logging.getLogger(__name__)


ClientHook = Callable[[Message, Context], None]
ReplyHook = Callable[[Message, Context, Message], Message]


def build_apps(run_config: dict[str, Any], client_hook: ClientHook | None = None,
               reply_hook: ReplyHook | None = None, settle_seconds: float = 1.0,
               server_done: threading.Event | None = None) -> tuple[ServerApp, ClientApp]:
    """Server and client apps whose contexts carry `run_config`. `client_hook(msg, context)` runs before each
    client message and `reply_hook(msg, context, reply)` may replace its reply (tests inject failures and hostile
    replies with them). `server_done` is set when the ServerApp's main returns or raises."""
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        context.run_config = {**context.run_config, **run_config}
        try:
            run(grid, context, settle_seconds=settle_seconds)
        except RunInterrupted:  # recorded as stopped; in Ray's ServerApp thread it would end in a thread traceback
            log.debug("the run stopped after a Ctrl-C")
        finally:
            if server_done is not None:
                server_done.set()

    def wrap(entry):
        def hooked(msg: Message, context: Context) -> Message:
            if client_hook is not None:
                client_hook(msg, context)
            reply = entry(msg, context)
            return reply_hook(msg, context, reply) if reply_hook is not None else reply

        return hooked

    client = register_client_handlers(ClientApp(), run_config, wrap if client_hook or reply_hook else None)
    return server, client


def simulate_in_process(run_config: dict[str, Any], num_nodes: int, *, client_hook: ClientHook | None = None,
                        reply_hook: ReplyHook | None = None, deliver=None) -> InProcessGrid:
    """Run one experiment without Ray: the same ServerApp and ClientApp code, nodes served one after another in
    this process (`InProcessGrid`). `deliver` may drop or rewrite a node's reply (see InProcessGrid)."""
    server, client = build_apps(run_config, client_hook, reply_hook, settle_seconds=0.0)
    grid = InProcessGrid(client, num_nodes, run_config, deliver=deliver)
    server(grid, server_context(grid))
    return grid


def check_ray_address(address: str) -> str:
    """`address` if it names a Ray cluster to join: `host:port` of its head node (`ray start --head --port`), or
    `auto` (the cluster `ray start` last started on this machine); a ValueError that says what is wrong otherwise.
    Ray Client (`ray://`) addresses are refused: the driver, which runs the ServerApp, must be a cluster node."""
    text = address.strip()
    if text == "auto":
        return text
    if "://" in text:
        raise ValueError(f"ray address {address!r} is a URL: give the head node's host:port (`ray start --head "
                         "--port`, default 6379) and run on a machine of the cluster; Ray Client (ray://) is not "
                         "supported")
    host, sep, port = text.rpartition(":")
    if not sep or not host or any(c.isspace() or c in "/@" for c in host) or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise ValueError(f"ray address {address!r} is not host:port (the head node's `ray start --head --port`) "
                         "or auto")
    return text


def reachable_ray_address(address: str, timeout_s: float = 5.0) -> str:
    """`address` checked (`check_ray_address`) and, for host:port, answering on that port: Ray waits without end
    for a cluster that is not there (the run would hang), so a closed port is an error that says how to start one."""
    address = check_ray_address(address)
    if address == "auto":
        return address
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ValueError(f"no Ray cluster answers at {address} ({err}); start its head node with `ray start --head "
                         f"--port={port}` (and the others with `ray start --address={address}`)") from err
    return address


def ray_backend_config(cpus_per_client: float = 1.0, gpus_per_client: float = 0.0, total_cpus: int | None = None,
                       verbose: bool = False, address: str | None = None) -> dict[str, Any]:
    """Flower's Ray backend config. Ray hides GPUs from actors that ask for none, so a client only sees a GPU (and
    `model.device = "auto"` only picks it) when `gpus_per_client` > 0; a fraction lets several clients share one.

    Without `address` the run starts its own Ray instance on this machine (`address = "local"`, so neither
    `RAY_ADDRESS` nor a cluster `ray start` left on this machine is joined by accident) with `total_cpus` CPUs and
    the GPUs torch sees. With `address` it joins that running cluster: Flower passes `init_args` to `ray.init` as
    they are, Ray refuses CPU or GPU counts when joining (the cluster's nodes declared theirs at `ray start`), and
    Flower sizes its actor pool from every node's resources, so clients run on all of them."""
    if cpus_per_client <= 0:
        raise ValueError(f"cpus per client must be > 0, got {cpus_per_client}")
    if gpus_per_client < 0:
        raise ValueError(f"gpus per client must be >= 0, got {gpus_per_client}")
    client_resources = {"num_cpus": cpus_per_client, "num_gpus": float(gpus_per_client)}
    logging_args = {"logging_level": logging.ERROR, "log_to_driver": verbose}
    if address is not None:
        if total_cpus is not None:
            raise ValueError("total cpus cannot be set when joining a Ray cluster: its nodes declared their CPUs "
                             "at `ray start`")
        return {"client_resources": client_resources,
                "init_args": {"address": check_ray_address(address), **logging_args}}
    gpus = 0
    if gpus_per_client > 0:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise ValueError(f"gpus per client = {gpus_per_client} but torch sees no CUDA device; leave it at 0 "
                             "to simulate on the CPU")
        if gpus_per_client > gpus:
            raise ValueError(f"gpus per client = {gpus_per_client} but only {gpus} GPU(s) are visible")
    return {"client_resources": client_resources,
            "init_args": {"address": "local", "num_cpus": total_cpus or os.cpu_count() or 2, "num_gpus": gpus,
                          "include_dashboard": False, **logging_args}}


# parameters: `pubswap simulate`'s options, keyword-only with their defaults
def simulate(run_config: dict[str, Any], num_nodes: int, *, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0,
             total_cpus: int | None = None, client_hook: ClientHook | None = None,
             reply_hook: ReplyHook | None = None, verbose: bool = False, ray_address: str | None = None) -> None:
    """Run one experiment in-process with `num_nodes` simulated SuperNodes (Ray backend): on a Ray instance of its
    own, or on the running cluster at `ray_address` (default: `$RAY_ADDRESS`, Ray's own variable, when set)."""
    from flwr.simulation import run_simulation

    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    address = ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        address = reachable_ray_address(address)
        log.info("joining the Ray cluster at %s", address)
    backend_config = ray_backend_config(cpus_per_client, gpus_per_client, total_cpus, verbose, address)
    server_done = threading.Event()
    server, client = build_apps(run_config, client_hook, reply_hook, server_done=server_done)
    clear_interrupt()  # an earlier run's Ctrl-C in this process (a notebook) is not this run's
    try:
        run_simulation(server_app=server, client_app=client, num_supernodes=num_nodes, backend_name="ray",
                       backend_config=backend_config, verbose_logging=verbose)
    except KeyboardInterrupt:
        stop_after_interrupt(server_done)
        raise


def stop_after_interrupt(server_done: threading.Event, grace_s: float = STOP_GRACE_S) -> bool:
    """After a Ctrl-C reached the main thread of a Ray simulation: Flower's engine stopped sending messages, but the
    ServerApp runs on in its own (non-daemon) thread, waiting for replies that will never come, and Python waits for
    it on exit (the hang; a second Ctrl-C then aborted with a C++ stack dump). Tell the run to stop (it records
    `stopped` at its next check), shut Ray down if Flower's engine did not (a Ctrl-C during ray.init), and wait up to
    `grace_s` for the ServerApp. Returns whether it ended; a second Ctrl-C stops waiting."""
    interrupt()
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        return server_done.wait(grace_s)
    except KeyboardInterrupt:
        return server_done.is_set()
