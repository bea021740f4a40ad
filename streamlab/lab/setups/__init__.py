"""Our own programs started for an experiment: the server, proxy and platform as processes or in process, replicas."""
