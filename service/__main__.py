"""`python -m service [--host 127.0.0.1] [--port 8000]`: the sweep service (settings from the environment)."""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", help="default $SWEEPS_HOST or 127.0.0.1")
    parser.add_argument("--port", type=int, help="default $SWEEPS_PORT or 8000")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()

    from worker.local_ray import use_local_ray

    use_local_ray()  # before ray is imported (by service.server): a local head on loopback only
    from service.private import start_private
    from service.server import serve
    from service.settings import SettingsError, load_settings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        parser.exit(2, "".join(f"bad setting {problem}\n" for problem in exc.problems))
    start_private(settings, args.log_level)  # umask 077, the data dir 0700 (service/private.py)
    serve(settings, log_level=args.log_level)


if __name__ == "__main__":
    main()
