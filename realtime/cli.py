"""Command line: ``realtime serve | generate | demo-model``.

Usage errors and unusable models exit with code 2 and a one-line message,
before any server binds a port.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

from realtime import __version__
from realtime.errors import UsageError
from realtime.limits import (
    BATCH_FRAMES_ENV,
    BUILD_AHEAD_ENV,
    Limits,
    Setting,
    batch_frames_from_env,
    limit_settings,
    limits_from,
)
from realtime.models.checkpoint import ModelLoadError, ModelPathError
from realtime.session.resume import replica_id
from realtime.tenants import share_from_env

log = logging.getLogger(__name__)

N = TypeVar("N", int, float)


def _number(
    kind: Callable[[str], N], lowest: float, highest: float, what: str
) -> Callable[[str], N]:
    """An argparse type: ``kind`` parsed from text and checked to lie in a range."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


_TINY = sys.float_info.min
_positive_float = _number(float, _TINY, sys.float_info.max, "a number > 0")
_non_negative_float = _number(float, 0.0, sys.float_info.max, "a number >= 0")
_seed = _number(int, 0, math.inf, "an integer >= 0")
_port = _number(int, 0, 65535, "a port number in 0..65535")
_positive_int = _number(int, 1, math.inf, "an integer > 0")


def _replica_id(text: str) -> str | None:
    """``--replica-id``'s value (empty: none)."""
    try:
        return replica_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _env_list(name: str) -> list[str]:
    """A comma-separated environment setting as a list (empty when unset)."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _limit_type(spec: Setting) -> Callable[[str], int | float]:
    """An argparse type for one limit; the message names what is expected."""

    def parse(text: str) -> int | float:
        try:
            return spec.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = spec.requirement
    return parse


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    """One flag per Limits field, named, typed and described by the field itself.

    A flag's default is its ``REALTIME_<FIELD>`` setting when that is set (argparse
    checks it like a value given on the command line), else the field's default.
    """
    group = parser.add_argument_group(
        "limits", "each also read from REALTIME_<NAME> (e.g. REALTIME_IDLE_TIMEOUT)"
    )
    for spec in limit_settings():
        group.add_argument(
            spec.flag,
            dest=spec.name,
            type=_limit_type(spec),
            default=os.environ.get(spec.env) or spec.default,
            help=f"{spec.help} (default %(default)s)",
        )


def _add_batch_option(parser: argparse.ArgumentParser) -> None:
    """``--batch-frames`` / ``--no-batch-frames``; unset, ``REALTIME_BATCH_FRAMES`` or
    the default (on when ``--max-sessions`` > 1) decides (:func:`batch_frames_from_args`)."""
    parser.add_argument(
        "--batch-frames",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the frames of every conversation that has one due as one batched model "
        "step (--no-batch-frames: each frame its own step, in turn); default: "
        f"${BATCH_FRAMES_ENV}, else on when --max-sessions > 1",
    )


def _add_warm_option(parser: argparse.ArgumentParser) -> None:
    """``--warm-prompt FILE`` (repeatable); unset, ``REALTIME_WARM_PROMPT`` decides
    (:mod:`realtime.warm`)."""
    from realtime.warm import WARM_PROMPT_ENV

    parser.add_argument(
        "--warm-prompt",
        metavar="FILE",
        action="append",
        default=None,
        help="read this system prompt into the model's prompt cache (seed 0) before "
        "/ready says ready, so the first conversation with it opens at once: a text "
        "file is a native session.system_prompt, a .json file an OpenAI session object "
        "(its instructions and tools); repeatable (default: "
        f"${WARM_PROMPT_ENV}, files separated by '{os.pathsep}')",
    )


def _add_state_options(parser: argparse.ArgumentParser) -> None:
    """``--state-cache-dir DIR`` and ``--build-ahead`` / ``--no-build-ahead``
    (:class:`realtime.warm.Keeping`)."""
    from realtime.models.state_files import STATE_CACHE_DIR_ENV, default_state_dir

    parser.add_argument(
        "--state-cache-dir",
        metavar="DIR",
        default=os.environ.get(STATE_CACHE_DIR_ENV),
        help="keep prompt states (prompts seen before, the voice chain built ahead) in "
        "this directory across restarts, keyed by the checkpoint's contents and the MLX "
        "build; '' keeps none on disk (default: "
        f"${STATE_CACHE_DIR_ENV}, else {default_state_dir()})",
    )
    parser.add_argument(
        "--build-ahead",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="when the engine has nothing else to do, build seed 0's voice chain to "
        "--max-system-prompt-tokens so a never-seen prompt costs only its language "
        "model's steps, and finish up to two prompt reads whose clients left so a retry "
        f"hits (default: on; ${BUILD_AHEAD_ENV}=0 turns it off)",
    )


def _add_cpu_blas_option(parser: argparse.ArgumentParser) -> None:
    """``--cpu-blas``: which CBLAS MLX's Linux CPU backend multiplies with
    (:mod:`realtime.cpu_blas`); installed in :func:`main` before MLX loads."""
    from realtime.cpu_blas import CPU_BLAS_ENV, from_env

    parser.add_argument(
        "--cpu-blas",
        metavar="bundled|openblas|PATH",
        default=from_env(os.environ),
        help="Linux, CPU backend: 'openblas' (a system OpenBLAS) or a CBLAS library's path "
        "makes float32 matmuls, and batching, far cheaper than MLX's bundled reference "
        "BLAS; a batched conversation's samples then differ from its solo run in the last "
        f"bits (default: ${CPU_BLAS_ENV}, else bundled)",
    )


def _add_compile_option(parser: argparse.ArgumentParser) -> None:
    """``--no-compile``: run the frame step's compiled pieces op by op (MLX's
    ``disable_compile``, process-wide; set in :func:`main` before the model loads)."""
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="run the frame step's compiled pieces (mx.compile) op by op, to compare: the "
        "same bits, more kernels a frame (default: compiled, traced at start)",
    )


def batch_frames_from_args(args: argparse.Namespace) -> bool | None:
    """The flag, else ``REALTIME_BATCH_FRAMES`` (a bad value is a usage error), else
    ``None`` (the default: :func:`realtime.limits.batching`)."""
    if args.batch_frames is not None:
        return bool(args.batch_frames)
    try:
        return batch_frames_from_env(os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def limits_from_args(args: argparse.Namespace) -> Limits:
    return limits_from({spec.name: getattr(args, spec.name) for spec in limit_settings()})


def add_answer_options(
    parser: argparse.ArgumentParser,
    *,
    seed: Callable[[str], int] = _seed,
    extra_seconds: Callable[[str], float] = _non_negative_float,
) -> None:
    """The options of one recorded question's answer: the system prompt, the seed and
    the silence appended. ``realtime generate`` and the example file client, whose
    output must match it byte for byte, spell them alike; each checks the values with
    its own messages (``seed``, ``extra_seconds``)."""
    parser.add_argument(
        "--system-prompt", default=None, metavar="TEXT", help="the model's instructions"
    )
    parser.add_argument(
        "--seed", type=seed, default=0, metavar="N", help="random seed (default %(default)s)"
    )
    parser.add_argument(
        "--extra-seconds",
        type=extra_seconds,
        default=3.0,
        help="silence appended so the answer can finish (default %(default)s)",
    )


_MODEL_HELP = (
    "checkpoint folder, or a Hugging Face repo id such as "
    "mlx-community/NemotronLabs-VoiceChat-11B-4bit (downloaded into the Hugging Face "
    "cache unless a local folder has that name); omitted: the built-in random-weight demo"
)


def _add_demo_turns_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--demo-turns",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with no -m (generate: with --stream): the demo answers speech with scripted "
        "turns (default), or --no-demo-turns runs its raw random network",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="realtime",
        description="Serve a full-duplex speech model over the /v1/realtime WebSocket.",
    )
    parser.add_argument("--version", action="version", version=f"realtime {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("REALTIME_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("REALTIME_LOG_FORMAT", "text"),
        choices=["text", "json"],
        help="log lines for people (text) or log shippers (one JSON object a line) "
        "(default: $REALTIME_LOG_FORMAT or text)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    serve = sub.add_parser("serve", help="serve /v1/realtime (the demo model when -m is omitted)")
    serve.add_argument("-m", "--model", metavar="PATH|REPO", help=_MODEL_HELP)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    serve.add_argument(
        "--port", type=_port, default=8080, help="port to listen on (default %(default)s)"
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get("REALTIME_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on every route (default: $REALTIME_API_KEY); "
        "its tenant is named 'default'",
    )
    serve.add_argument(
        "--api-keys-file",
        metavar="PATH",
        default=os.environ.get("REALTIME_API_KEYS_FILE") or None,
        help="several keys, one tenant a line: 'NAME KEY [max_sessions=N]' ('#' comments); "
        "reloaded on SIGHUP; instead of --api-key (default: $REALTIME_API_KEYS_FILE)",
    )
    serve.add_argument(
        "--share-prompt-cache",
        action="store_true",
        default=share_from_env(os.environ),
        help="let every tenant's openings hit every other tenant's cached prompts (by "
        "default a tenant's prompts are cached for it alone; warmed prompts are shared)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="browser Origin allowed to open the WebSocket besides the "
        "server's own (repeatable; '*' allows any)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=_env_list("REALTIME_ALLOWED_HOSTS"),
        metavar="HOST",
        help="Host header name (or name:port) accepted besides loopback names, which "
        "are all a server on a loopback address answers otherwise (repeatable; '*' "
        "allows any; default: $REALTIME_ALLOWED_HOSTS, comma-separated)",
    )
    serve.add_argument(
        "--replica-id",
        metavar="NAME",
        type=_replica_id,
        default=os.environ.get("REALTIME_REPLICA_ID") or None,
        help="this replica's name behind a balancer: resumable conversations announce it "
        "(session.resumable's 'replica'), and a resume asks for it (?replica=NAME) so the "
        "balancer routes it here (default: $REALTIME_REPLICA_ID, else none)",
    )
    serve.add_argument(
        "--quantize",
        type=int,
        choices=[4, 8],
        default=None,
        help="with no -m: serve the 4- or 8-bit variant of the demo model",
    )
    serve.add_argument(
        "--record",
        metavar="DIR",
        default=os.environ.get("REALTIME_RECORD") or None,
        help="record every call in DIR: a stereo WAV (user left, model right), a JSON "
        "Lines file of every event, a Markdown transcript; recording people needs their "
        "consent (default: $REALTIME_RECORD, else off)",
    )
    serve.add_argument(
        "--record-max-bytes",
        type=_positive_int,
        default=_positive_int(os.environ.get("REALTIME_RECORD_MAX_BYTES", str(2**30))),
        metavar="N",
        help="with --record: DIR holds at most N bytes of recordings at any moment; a "
        "conversation writes at most N / (--max-sessions + 1), then stops recording, and "
        "the oldest finished recordings are deleted to make room "
        "(default: $REALTIME_RECORD_MAX_BYTES, else 1 GiB)",
    )
    _add_demo_turns_option(serve)
    _add_limit_options(serve)
    _add_batch_option(serve)
    _add_warm_option(serve)
    _add_state_options(serve)
    _add_cpu_blas_option(serve)
    _add_compile_option(serve)

    gen = sub.add_parser("generate", help="run a WAV through the model offline")
    gen.add_argument("-m", "--model", metavar="PATH|REPO", help=_MODEL_HELP)
    gen.add_argument("--input", required=True, metavar="IN.wav")
    gen.add_argument("--output", required=True, metavar="OUT.wav")
    gen.add_argument(
        "--stream",
        action="store_true",
        help="push the model's frames through the streaming session the "
        "server uses and print text as it arrives",
    )
    add_answer_options(gen)
    gen.add_argument(
        "--max-seconds",
        type=_positive_float,
        default=None,
        help="max_streaming_seconds of the session (bounds its caches)",
    )
    gen.add_argument(
        "--profile",
        action="store_true",
        help="with --stream: print a per-stage frame timing summary",
    )
    _add_demo_turns_option(gen)
    _add_cpu_blas_option(gen)
    _add_compile_option(gen)

    demo = sub.add_parser("demo-model", help="write a random-weight demo checkpoint")
    demo.add_argument("dir", metavar="DIR")
    demo.add_argument("--quantize", type=int, choices=[4, 8], default=None)
    demo.add_argument(
        "--size",
        choices=["tiny", "medium", "deep", "full"],
        default="tiny",
        help="tiny: the served demo (about 3 MB); medium: for benchmarks, shaped so a "
        "frame step is mostly native compute (about 91 MB); deep: the real model's layer "
        "counts and structure with tiny widths, 4-bit language model unless --quantize "
        "says otherwise, for counting a frame step's graph; full: the real model's "
        "dimensions, 11 B parameters, for accelerators (about 9 GB with --quantize 4) "
        "(default %(default)s)",
    )
    return parser


def demo_model_command(args: argparse.Namespace) -> int:
    """``realtime demo-model DIR [--quantize 4|8] [--size tiny|medium|deep|full]``: write a
    demo checkpoint, print its path.

    DIR may be new, empty or an earlier demo checkpoint; it is replaced atomically.
    """
    from realtime.demo.checkpoint import (
        SIZES,
        install_atomically,
        is_demo_checkpoint,
        write_demo_checkpoint,
    )

    path = Path(args.dir).expanduser()
    size = SIZES[args.size]
    quantize: int | None = size.quantize if args.quantize is None else args.quantize
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not is_demo_checkpoint(path):
        raise UsageError(f"{path} is not empty and is not a demo checkpoint; choose another DIR")
    parent = path.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {parent}: {exc.strerror or exc}") from None
    try:
        install_atomically(
            parent / path.name, lambda staging: write_demo_checkpoint(staging, quantize, size)
        )
    except OSError as exc:
        raise UsageError(f"cannot write the demo checkpoint to {path}: {exc}") from None
    print(path.resolve(), flush=True)
    return 0


def _configure_logging(level: str, fmt: str = "text") -> None:
    from realtime.telemetry.logs import setup_logging

    setup_logging(level, "json" if fmt == "json" else "text")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.log_level, args.log_format)
    try:
        if args.command in ("serve", "generate"):
            from realtime.cpu_blas import install_from

            install_from(args.cpu_blas)
            if not args.compile:
                # MLX's own switch as well: the engine's start line reads it.
                os.environ["MLX_DISABLE_COMPILE"] = "1"
                import mlx.core as mx

                mx.disable_compile()
        if args.command == "serve":
            from realtime.server import serve_command

            args.batch_frames = batch_frames_from_args(args)
            return serve_command(args, limits_from_args(args))
        if args.command == "generate":
            from realtime.offline import generate_command

            return generate_command(args)
        if args.command == "demo-model":
            return demo_model_command(args)
    except (UsageError, ModelPathError, ModelLoadError) as exc:
        print(f"realtime: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


def run() -> NoReturn:
    """The ``realtime`` command and ``python -m realtime``: :func:`main`, then its exit.

    Once MLX has been loaded (``serve`` and ``generate`` run it on a thread of their
    own), the interpreter's teardown may abort in MLX's static destructors
    ("terminate called without an active exception", ml-explore/mlx#3126) after any
    exit: a warm prompt refused once the model has loaded exited 2 and then SIGABRT.
    Every exit then skips that teardown, as the exit after serving does."""
    try:
        code = main()
    except SystemExit as exc:
        if "mlx.core" not in sys.modules:
            raise
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        if "mlx.core" not in sys.modules:
            raise
        traceback.print_exc()
        code = 1
    if "mlx.core" in sys.modules:
        from realtime.server import exit_skipping_native_teardown

        exit_skipping_native_teardown(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
