"""How an on/off environment variable of attnforge is spelled: one set of words for all of them, so that
``ATTNFORGE_AUTOTUNE`` (:mod:`attnforge.dispatch.autotune_env`) and ``ATTNFORGE_WHEEL_SOURCES``
(:func:`attnforge.fetch.listings.wheel_sources_on`) never read one word two ways. Case and surrounding blanks are
the caller's to strip; what an empty or other value means is the caller's too."""

from __future__ import annotations

#: the words that turn a switch off
OFF = frozenset({"0", "false", "no", "off"})
#: the words that turn a switch on
ON = frozenset({"1", "true", "yes", "on"})
