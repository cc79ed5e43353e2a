"""The LLM broker as the root names it: a small class whose process imports litellm itself.

litellm and what it loads are about 140 MB of the program's memory. Named by its class,
the broker made the root import litellm, and every process the root forks (a session, a
stand-in) carried it: forking the root took about 6 ms of kernel time a session
(copying the page tables of 180 MB), and each session's page tables were as large.
Thespian forks an actor from its parent and checks the class there, so the root names
this one, which imports nothing of litellm; in the broker's own process it imports the
broker, warms litellm up (``llm.client.preload_first_call``) and becomes an
``LLMBroker``. A program that imported litellm before opening (to set its callbacks,
say) still has its root inherit it, and its broker shares those pages as before.
"""

from __future__ import annotations

import logging
from typing import Any

from ..host.processes import name_process
from .base import PROCESS_NAMES, TrouperActor

LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


class LazyBroker(TrouperActor):
    """Becomes an ``LLMBroker`` as it is created, in the broker's process."""

    role = "broker"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        name_process(PROCESS_NAMES[self.role])  # its name while it imports (else the root's)
        from ..llm import client
        from .llm_broker import LLMBroker

        for name in LITELLM_LOGGERS:  # made under this actor's logging root (INFO): at
            found = logging.getLogger(name)  # WARNING, as under a program's, unless the
            if found.level == logging.NOTSET:  # program's LITELLM_LOG set a level
                found.setLevel(logging.WARNING)
        client.preload_first_call()
        self.__class__ = LLMBroker  # type: ignore[assignment] - same layout, same base
        LLMBroker.__init__(self, *args, **kwargs)
