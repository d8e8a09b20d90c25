"""From a lowered call to per-device calls: the partitioner callbacks XLA
calls for a derived target name, and the plan they follow (``cc/partition``).
The call's description and its derived name are ``_vocab``'s."""
