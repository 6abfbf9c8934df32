"""The cluster side: the local Ray head, the launcher, the sweep driver actor and the supervisor."""
