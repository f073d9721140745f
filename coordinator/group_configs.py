"""A consumer group's configuration as the cluster answers for it (KIP-848's dynamic group configs): the words the
relay's reader of it (relay/group_configs.py) and the consumer groups' cache of it (group/modern/group_configs.py)
share, neither importing the other."""

from __future__ import annotations

from collections.abc import Mapping

# What the cluster says of each group asked: the values set on it (name -> value), or the error code refusing it
Described = Mapping[str, str] | int
