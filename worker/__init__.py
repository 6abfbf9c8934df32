"""One GPT-2 training run (model, data, optimizers, loop) and its launch on Ray.

Importing it changes nothing: a process that starts a local Ray cluster calls
`worker.local_ray.use_local_ray()` first (loopback only, token auth).
"""
