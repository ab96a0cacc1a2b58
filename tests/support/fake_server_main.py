"""The fake server as a launched process: ``python fake_server_main.py --host H --port P``.

It stands in for a launched vLLM where a test is about what the session makes of a server's
death (its log, its exit), not about vLLM: ``--die-at N`` ends the process during its N-th
completion request, after printing ``--die-line`` to its log, by ``os._exit(--exit-code)`` or,
with ``--exit-code=-9``, by SIGKILL; ``--freeze-at N`` freezes the whole server there (no
answer to anything, ``/health`` included); ``--stick-at N`` sticks its engine there (that
request and every later one taken and never answered, ``/health`` still 200); ``--slow-at N``
serves that request alone with the :class:`Behaviour` fields of ``--slow JSON`` (a prefill of
slow steps whose KV gauge still rises after its client went away, as an engine drops an
abandoned request only between steps). ``--once
FILE`` does any of them only while FILE does not exist. ``--fail-start-once FILE`` has the
process fail its start-up (exit 1) once FILE exists, the first time only. ``--behaviour
JSON`` sets other fields of its :class:`Behaviour`. ``--step-limit-default S`` keeps vLLM's
rule for one engine step, at a scale of seconds: a request whose longest prefill step
(``first_token_delay_s`` over its chunks) outlasts ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` from
the environment (S where unset, standing for vLLM's 300 s) kills the engine at the limit, with
the lines vLLM's multiprocessing executor and engine core log, and the server exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fake_vllm import Behaviour, FakeVLLM, _Handler  # noqa: E402


def outlast_step_limit(payload: dict, behaviour: Behaviour, default_s: float) -> None:
    """vLLM's multiprocessing executor on a step longer than its limit: it waits the limit,
    raises, the engine core dies and the API server exits."""
    limit = float(os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS") or default_s)
    prompt = payload.get("prompt")
    tokens = len(prompt) if isinstance(prompt, list) else 0
    if not tokens:
        return
    delay = (
        behaviour.first_token_delay_s
        if behaviour.is_long(tokens)
        else behaviour.short_first_token_delay_s
    )
    step = delay * min(1.0, behaviour.prefill_chunk_tokens / tokens)
    if step <= limit:
        return
    time.sleep(limit)
    print('TimeoutError: RPC call to execute_model timed out.', file=sys.stderr)
    print("ERROR EngineCore encountered a fatal error.", file=sys.stderr, flush=True)
    os._exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="fake-model")
    parser.add_argument("--max-model-len", type=int, default=32_768)
    parser.add_argument("--die-at", type=int, default=0)
    parser.add_argument("--die-line", default="")
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--freeze-at", type=int, default=0)
    parser.add_argument("--stick-at", type=int, default=0)
    parser.add_argument("--slow-at", type=int, default=0)
    parser.add_argument("--slow", default="{}", help="Behaviour fields of that request, as JSON")
    parser.add_argument("--fail-start-once", default="")
    parser.add_argument("--once", default="")
    parser.add_argument("--behaviour", default="{}", help="Behaviour fields, as JSON")
    parser.add_argument("--step-limit-default", type=float, default=0.0)
    args, _ = parser.parse_known_args()
    completions = [0]
    lock = threading.Lock()

    def first_time() -> bool:
        """True where no ``--once`` is given, or for the one process (of the servers that
        share FILE: one per xdist worker) that creates it: two that reached their N-th request
        together both found it missing and both died, when FILE was checked, then touched."""
        if not args.once:
            return True
        try:
            os.close(os.open(args.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    complete = _Handler._complete

    def counting(handler, payload, behaviour, t_body):  # noqa: ANN001, ANN202
        with lock:
            completions[0] += 1
            count = completions[0]
        for at, fault in ((args.freeze_at, "freeze"), (args.stick_at, "stuck_engine")):
            if count == at and first_time():
                behaviour = fake.configure(fault=fault).behaviour
        if count == args.slow_at and first_time():
            behaviour = replace(behaviour, **json.loads(args.slow))
        if args.step_limit_default > 0:
            outlast_step_limit(payload, behaviour, args.step_limit_default)
        if count == args.die_at and first_time():
            if args.die_line:
                print(args.die_line, file=sys.stderr, flush=True)
            if args.exit_code == -9:
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(args.exit_code)
        return complete(handler, payload, behaviour, t_body)

    after = Path(args.fail_start_once) if args.fail_start_once else None
    if after is not None and after.exists():
        failed = after.with_name(after.name + ".start-failed")
        if not failed.exists():
            failed.touch()
            print("RuntimeError: the stand-in fails this start (--fail-start-once)", flush=True)
            sys.exit(1)
    behaviour = Behaviour(
        model=args.served_model_name,
        max_model_len=args.max_model_len,
        **json.loads(args.behaviour),
    )
    fake = FakeVLLM(behaviour, port=args.port)
    _Handler._complete = counting  # type: ignore[method-assign]
    fake.start()
    print(f"INFO fake vLLM serving {args.served_model_name} at {fake.url}", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
