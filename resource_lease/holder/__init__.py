"""The threaded holder: ``ResourceHolder`` holds one valid resource for minutes.

``thread.py`` is the class users subclass (shaped like the hand-written
``Resource(threading.Thread)`` it replaces: acquire, fix, close, the renewal thread);
``state.py`` its state machine and acquire loop;
``config.py`` its checked configuration; ``registry.py`` the process's live holders and the
SIGTERM hand-off. ``contrib/proxy.py`` is a proxy-checking subclass.
"""

from __future__ import annotations

from resource_lease.holder.registry import install_sigterm_handler, live_holders, terminate_all
from resource_lease.holder.steps import SEARCH_LIMIT
from resource_lease.holder.thread import ResourceHolder

__all__ = ["SEARCH_LIMIT", "ResourceHolder", "install_sigterm_handler", "live_holders", "terminate_all"]
