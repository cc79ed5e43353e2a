"""``DockerSandbox``: the session's shell in a container, one container per session.

The container is the isolation; the sandbox server stays on this machine. It is the local
runtime's server (journal, epochs, timeouts, output truncation, masking, file actions)
whose shell is ``sh -i`` inside the container, reached through ``docker exec``
(``sandbox/container.py``). So the journal lives on the host (the state folder): a
restarted proxy finds the server through ``server.json`` and the container by its labels,
re-attaches to both and reads each action's real outcome. Nothing is needed in the image
but a POSIX ``sh``; on the host, the docker CLI and the ``docker`` Python SDK.

The container: labelled ``trouper.client.session``, ``trouper.owner`` (this trouper home) and
``trouper.epoch``; ``--init``; never root: ``config.user``, else the caller's uid:gid, or
when trouper is root the workspace owner's or ``TROUPER_SANDBOX_UID`` with the workspace
handed to it (``docker_user.py``); every capability dropped, ``no-new-privileges``, and
Docker's default seccomp profile with no setuid/setgid bit (``docker_seccomp.py``);
memory, CPU and pids limits; network ``none`` by default; the workspace bind-mounted at
``config.workdir`` and the shell's input folder (0700, the container user's) read-only at
``/.trouper``; no port, no Docker socket, no secret in its config (secrets reach each
``docker exec`` by name). Its main process is ``sh -c 'read _'``: it needs only sh and
waits forever on the open stdin. A container without these (root, or Docker's default
profile: an older trouper's) is replaced, like a dead one.

A dead container (killed, OOM, removed by someone) is seen by ``alive`` with its cause;
the next ``start`` stops the old server, removes the dead container and starts a new one
on the same workspace. The action that was running reads ``unknown`` (the server never
journals a finish for a shell whose container is gone): it is recorded lost.

    sandbox = DockerSandbox("s1", Path("/tmp/ws"), Path("/tmp/rt"),
                            config=DockerRuntime(image="busybox:latest"))
    sandbox.start()
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..exceptions import RuntimeMisconfigured, RuntimeUnavailable
from ..home.paths import private_dir
from ..messages.causes import RuntimeFailure
from .base import SandboxHealth
from .docker_seccomp import profile_json
from .docker_support import (
    IO_MOUNT,
    LABEL_EPOCH,
    LABEL_KEEP,
    LABEL_OWNER,
    LABEL_SESSION,
    container_failure,
    docker_client,
    find_container,
    owner_of,
    session_containers,
)
from .docker_user import choose_user, hand_over, prepare_io, user_of
from .local import PASSED_ENV, LocalSandbox, _read_json
from .misconfigured import (
    container_refused,
    docker_missing,
    image_name_refused,
    image_not_pulled,
    prepare_workspace,
    workspace_unusable,
)

logger = logging.getLogger(__name__)

DOCKER_ENV = tuple(
    "DOCKER_HOST DOCKER_CONTEXT DOCKER_CONFIG DOCKER_CERT_PATH DOCKER_TLS_VERIFY "
    "DOCKER_API_VERSION".split()
)
"""Variables of this process the sandbox server's docker CLI needs to reach the engine."""
KEEP_ALIVE = ["sh", "-c", "read _"]
"""The container's main process: sh alone, waiting on its (open, unattached) stdin."""
HEALTH_EVERY_S = 1.0
"""How often the proxy asks ``alive``: a dead container is noticed within about this."""

Progress = Callable[[str, str], None]
"""``progress(phase, detail)``: told each step of a start (image, create, start, ready)."""


class DockerSandbox(LocalSandbox):
    """A container per session, its shell served by a sandbox server on this machine."""

    health_every_s = HEALTH_EVERY_S

    def __init__(
        self,
        session_id: str,
        workspace: Path,
        state_dir: Path,
        env: dict[str, str] | None = None,
        max_output_chars: int = 10_000,
        *,
        config: Any = None,
        secret_names: tuple[str, ...] | None = None,
        idle_timeout_s: float | None = None,
        interrupt_grace_s: float = 2.0,
        progress: Progress | None = None,
    ) -> None:
        if config is None or not getattr(config, "image", None):
            raise RuntimeUnavailable("the docker runtime needs an image (DockerRuntime(image=))")
        super().__init__(session_id, workspace, state_dir, env, max_output_chars,
                         idle_timeout_s, start_timeout_s=config.start_timeout_s,
                         interrupt_grace_s=interrupt_grace_s, secret_names=secret_names)
        self.config = config
        self.progress = progress
        """Told each phase of a start; the RuntimeProxy sets it to forward them."""
        self.owner = owner_of(self.state_dir)
        self.user = ""
        """``uid:gid`` of the container (never root); chosen, or read from the container
        attached to, by ``start``."""
        self.container_id: str | None = None
        self._docker: Any = None  # the docker SDK client, made when first needed

    @property
    def io_dir(self) -> Path:
        """The host folder bind-mounted read-only at ``/.trouper`` (the shell's input)."""
        return self.state_dir / "io"

    # ---- Sandbox ----

    def start(self, epoch: int | None = None) -> bool:
        """Attach to the live container and server, or replace a dead container and start
        both; claim ``epoch`` (None: the next one the server counts). True when attached."""
        private_dir(self.state_dir)
        os.chmod(self.state_dir, 0o700)
        prepare_workspace(self.workspace)
        container = find_container(self.docker, self.session_id, self.owner)
        unfit = self._unfit(container) if container is not None else None
        if container is not None and unfit:
            self._say("replace", f"container {container.short_id} {unfit}; replacing it")
            self._stop_server()
            self._remove(container)
            container = None
        try:
            ids = self._user(container)
            prepare_io(self.io_dir, ids)
        except OSError as e:
            unusable = workspace_unusable(self.workspace, e)
            raise unusable or RuntimeUnavailable(
                f"session {self.session_id}: cannot prepare the workspace or the shell's "
                f"input folder: {e}") from e
        self.user = f"{ids[0]}:{ids[1]}"
        info = self._live_server(ping=False)
        if info is not None and (container is None or info.get("container") != container.id):
            self._stop_server()  # it serves a container that is gone
        created = container is None
        if container is None:
            container = self._create(epoch)
        self.container_id = container.id
        try:
            attached = super().start(epoch)
        except RuntimeMisconfigured:  # no retry mends it: kept as such, not made a fault
            if created:
                self._remove(container)
            raise
        except RuntimeUnavailable as e:
            detail = self._failure_detail(container, str(e))
            if created:  # nobody would ever stop it: a failed start leaves no container
                self._remove(container)
            # the container's log may say why its shell could not start: no sh in it
            raise container_refused(self.config.image, detail) or RuntimeUnavailable(
                detail) from e
        self._say("ready", f"container {container.short_id} "
                  f"{'started' if created else 'attached'} (epoch {self.epoch})")
        return attached and not created

    def _unfit(self, container: Any) -> str | None:
        """Why ``container`` cannot serve (not running, or made without the confinement
        this trouper gives: by an older one); None when it can."""
        if container.status != "running":
            return f"is {container.status}: {container_failure(container)}"
        options = container.attrs.get("HostConfig", {}).get("SecurityOpt") or []
        if user_of(container.attrs.get("Config", {}).get("User")) is None or not any(
                option.startswith("seccomp=") for option in options):
            return "runs as root or with Docker's default seccomp profile (an older trouper's)"
        return None

    def _user(self, container: Any) -> tuple[int, int]:
        """The running ``container``'s uid:gid, or (None) the one a new container gets,
        the workspace handed to it when trouper is root and the workspace root's."""
        if container is not None:
            return user_of(container.attrs["Config"]["User"])  # type: ignore[return-value]
        info = self.workspace.stat()
        ids, hand = choose_user(self.config.user, (info.st_uid, info.st_gid))
        if hand:
            self._say("workspace", f"handing the workspace to {ids[0]}:{ids[1]} (trouper "
                      "runs as root; the sandbox never does)")
            hand_over(self.workspace, ids)
        return ids

    def alive(self) -> SandboxHealth:
        """The container runs (asked of the engine) and the server answers."""
        if self.container_id is None:
            return SandboxHealth(alive=False, cause=RuntimeFailure.NOT_STARTED,
                                 detail="start() was not called")
        health = self.container_health()
        return health if not health.alive else super().alive()

    def container_health(self) -> SandboxHealth:
        """Whether this session's container runs; if not, why (OOM, exit code, log tail)."""
        from docker.errors import DockerException, NotFound

        try:
            container = self.docker.containers.get(self.container_id)
        except NotFound:
            return SandboxHealth(alive=False, cause=RuntimeFailure.REMOVED,
                                 detail=f"container {str(self.container_id)[:12]} was removed")
        except DockerException as e:
            return SandboxHealth(alive=False, cause=RuntimeFailure.UNREACHABLE,
                                 detail=f"the Docker engine does not answer: {e}")
        if container.status == "running":
            return SandboxHealth(alive=True)
        oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
        return SandboxHealth(alive=False,
                             cause=RuntimeFailure.OOM if oom else RuntimeFailure.EXITED,
                             detail=f"container {container.short_id}: "
                                    f"{container_failure(container)}")

    def stop(self) -> None:
        """Stop the server (the shell and its jobs with it), then remove the session's
        containers: every one, dead ones a replace could not remove included, but with
        ``config.keep`` the newest. A sandbox claimed by a newer proxy is left alone,
        container and all."""
        super().stop()
        if self.server_pid() is not None:
            return  # a newer epoch holds it (LocalSandbox.stop left it running)
        found = session_containers(self.docker, self.session_id, self.owner)
        for container in found[1:] if self.config.keep else found:
            self._remove(container)
        self.container_id = None

    def running(self) -> bool:
        """Whether this session's container runs (asked of the engine)."""
        container = find_container(self.docker, self.session_id, self.owner)
        return container is not None and container.status == "running"

    def kill(self) -> str | None:
        """``docker kill`` the session's container (fault injection): what ran in it is
        lost. The container's id, or None when none runs."""
        container = find_container(self.docker, self.session_id, self.owner)
        if container is None or container.status != "running":
            return None
        container.kill()
        return str(container.id)

    # ---- the container ----

    @property
    def docker(self) -> Any:
        """The docker SDK client (made on first use)."""
        if self._docker is None:
            self._docker = docker_client(self.config.start_timeout_s)
        return self._docker

    def _create(self, epoch: int | None) -> Any:
        """Find (or pull, once) the image, create and start the container; raise
        RuntimeUnavailable with the cause when it does not run (RuntimeMisconfigured when
        no retry can help: an image not pulled, one without sh)."""
        from docker.errors import APIError, DockerException, ImageNotFound

        image = self.config.image
        self._say("image", f"looking for image {image}")
        try:
            self.docker.images.get(image)
        except ImageNotFound:
            self._say("image", f"image {image} is not on this machine: pulling it")
            try:
                self.docker.images.pull(image)
            except APIError as e:  # the engine answered: no such image, or not for us
                raise image_not_pulled(image, e) from e
            except DockerException as e:
                raise RuntimeUnavailable(f"image {image!r} is not on this machine and could "
                                         f"not be pulled: {e}") from e
        except APIError as e:
            if e.status_code == 400:  # the engine answered: the name itself is wrong
                raise image_name_refused(image, e) from e
            raise RuntimeUnavailable(f"the Docker engine cannot find the image: {e}") from e
        except DockerException as e:
            raise RuntimeUnavailable(f"the Docker engine does not answer: {e}") from e
        stored = int((_read_json(self.state_dir / "epoch.json") or {}).get("epoch", 0))
        labels = {LABEL_SESSION: self.session_id, LABEL_OWNER: self.owner,
                  LABEL_EPOCH: str(epoch if epoch is not None else stored + 1)}
        if self.config.keep:
            labels[LABEL_KEEP] = "true"
        self._say("create", f"creating a container from {image}")
        try:
            container = self.docker.containers.create(image, **self._create_options(labels))
        except DockerException as e:
            raise container_refused(image, e) or RuntimeUnavailable(
                f"cannot create a container from {image!r}: {e}") from e
        self._say("start", f"starting container {container.short_id}")
        try:
            container.start()
        except DockerException as e:
            detail = self._failure_detail(container, f"cannot start it: {e}")
            self._remove(container)
            raise container_refused(image, e) or RuntimeUnavailable(detail) from e
        container.reload()
        if container.status != "running":
            detail = self._failure_detail(container, "it stopped at once")
            self._remove(container)
            raise container_refused(image, detail) or RuntimeUnavailable(detail)
        return container

    def _create_options(self, labels: dict[str, str]) -> dict[str, Any]:
        config = self.config
        return {
            "entrypoint": KEEP_ALIVE[:1], "command": KEEP_ALIVE[1:],
            "name": f"trouper-{self.session_id}-{os.urandom(3).hex()}",
            "labels": labels, "init": True, "user": self.user,
            "working_dir": config.workdir, "stdin_open": True, "tty": False,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges", f"seccomp={profile_json()}"],
            "mem_limit": config.memory, "nano_cpus": int(config.cpus * 1e9),
            "pids_limit": config.pids_limit, "network_mode": config.network,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,mode=1777"},  # images without a /tmp too
            "volumes": {str(self.workspace): {"bind": config.workdir, "mode": "rw"},
                        str(self.io_dir): {"bind": IO_MOUNT, "mode": "ro"}},
        }

    def _failure_detail(self, container: Any, what: str) -> str:
        """``what``, and what the engine says of ``container`` (exit code, OOM, log)."""
        from docker.errors import DockerException

        try:
            container.reload()
        except DockerException:
            return f"session {self.session_id}: container {container.short_id}: {what}"
        return (f"session {self.session_id}: container {container.short_id} from "
                f"{self.config.image}: {what}; {container_failure(container)}")

    def _remove(self, container: Any) -> None:
        from docker.errors import DockerException, NotFound

        try:
            container.remove(force=True)
        except NotFound:
            pass
        except DockerException as e:
            logger.warning("session %s: cannot remove container %s: %s", self.session_id,
                           container.short_id, e)

    def _stop_server(self) -> None:
        """Stop this session's server, whichever container it serves."""
        epoch, self._epoch = self._epoch, None
        LocalSandbox.stop(self)
        self._epoch = epoch

    def _say(self, phase: str, detail: str) -> None:
        logger.info("session %s: docker %s: %s", self.session_id, phase, detail)
        if self.progress is not None:
            try:
                self.progress(phase, detail)
            except Exception:  # noqa: BLE001 - a report must never break the start
                logger.exception("session %s: progress report failed", self.session_id)

    # ---- the server (LocalSandbox's, with its shell in the container) ----

    def _server_args(self) -> list[str]:
        docker = shutil.which("docker")
        if docker is None:  # it runs the shell with docker exec
            raise docker_missing("the docker CLI on PATH")
        return [*super()._server_args(), "--container", str(self.container_id),
                "--docker", docker, "--container-workdir", self.config.workdir,
                "--container-user", self.user, "--container-io", f"{self.io_dir}:{IO_MOUNT}",
                *[part for name in sorted(self.env) for part in ("--container-env", name)]]

    def _server_env(self) -> dict[str, str]:
        env = super()._server_env()
        env.update({k: os.environ[k] for k in DOCKER_ENV if k in os.environ})
        return env


__all__ = ["DockerSandbox", "PASSED_ENV"]
