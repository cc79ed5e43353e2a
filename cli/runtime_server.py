"""``trouper runtime-server``: host sessions' sandboxes for trouper on another machine.

The command checks its options and hands over to ``runtimes/remote_server/serve.py``
(imported only when it runs, so ``trouper --help`` never loads FastAPI). See
docs/runtimes.md (Remote) and docs/cli.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from .support import ENVIRONMENT, USAGE, CliError

file_path = click.Path(dir_okay=False, path_type=Path)


@click.command("runtime-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Beyond loopback it needs --tls-cert/--tls-key "
                   "(or --insecure).")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free one; server.json in the workdir says "
                   "which).")
@click.option("--workdir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the sessions' workspaces and journals "
                   "(<workdir>/<session id>/workspace and .../state).")
@click.option("--token-file", required=True, type=file_path,
              help="File holding the bearer token clients must send (not readable by other "
                   "users). The token is never taken on the command line.")
@click.option("--tls-cert", type=file_path, help="PEM certificate: serve HTTPS.")
@click.option("--tls-key", type=file_path, help="PEM private key of --tls-cert.")
@click.option("--insecure", is_flag=True,
              help="Allow plain HTTP beyond loopback (the token crosses the network in clear).")
@click.option("--idle-timeout-s", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Close a session's shell after this long without a request (0: never); "
                   "its journal stays.")
@click.option("--max-output-chars", default=10_000, show_default=True,
              type=click.IntRange(1), help="Default output kept per action (a client's "
                                           "session setting wins).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--max-body-bytes", default=64 * 1024 * 1024, show_default=True,
              type=click.IntRange(1024), help="Largest request body (an upload): a larger "
                                              "one is refused 413 unread.")
@click.option("--max-connections", default=512, show_default=True, type=click.IntRange(1),
              help="Connections open at once; more are answered 503 and closed.")
@click.option("--max-connections-per-client", default=256, show_default=True,
              type=click.IntRange(1), help="Connections open at once from one address.")
@click.option("--read-timeout-s", default=10.0, show_default=True,
              type=click.FloatRange(0, min_open=True, max=3600),
              help="A request's headers must arrive within this (its body too, plus a "
                   "second per 16 KiB): a client that trickles them is dropped.")
@click.option("--no-network", is_flag=True,
              help="The sessions' shells open no network socket (Unix sockets only).")
@click.option("--unreadable", multiple=True, type=click.Path(path_type=str),
              help="A path no shell may read (repeat it); beside the workdir, the token and "
                   "TLS key files and the usual credential stores.")
@click.option("--writable", multiple=True, type=click.Path(file_okay=False, path_type=str),
              help="A folder every shell may write (repeat it), beside its workspace and "
                   "the temporary folders.")
def runtime_server(host: str, port: int, workdir: Path, token_file: Path,
                   tls_cert: Path | None, tls_key: Path | None, insecure: bool,
                   idle_timeout_s: float, max_output_chars: int, log_level: str,
                   max_body_bytes: int, max_connections: int, max_connections_per_client: int,
                   read_timeout_s: float, no_network: bool, unreadable: tuple[str, ...],
                   writable: tuple[str, ...]) -> None:
    """Serve sandboxes for remote trouper sessions (FastAPI + uvicorn) until stopped.

    Each session gets a persistent shell in <workdir>/<session id>/workspace and an
    on-disk journal, so a restarted server reports finished actions truthfully and an
    interrupted one as unknown, and never runs an action twice. Shells are confined as
    the local runtime's (Landlock, seccomp) and never run as root: a server started as
    root runs them as the workspace's owner or TROUPER_SANDBOX_UID (65532).
    """
    from ..runtimes.remote_server.serve import ServeError, ServeOptions, serve

    options = ServeOptions(
        host=host, port=port, workdir=workdir, token_file=token_file, tls_cert=tls_cert,
        tls_key=tls_key, insecure=insecure, idle_timeout_s=idle_timeout_s,
        max_output_chars=max_output_chars, log_level=log_level,
        max_body_bytes=max_body_bytes, max_connections=max_connections,
        max_connections_per_client=max_connections_per_client, read_timeout_s=read_timeout_s,
        network=not no_network, unreadable=tuple(os.path.abspath(p) for p in unreadable),
        writable=tuple(os.path.abspath(p) for p in writable))
    try:
        serve(options)
    except ServeError as exc:
        code = ENVIRONMENT if "cannot listen" in str(exc) or "another runtime" in str(exc) \
            else USAGE
        raise CliError(str(exc), code) from None
