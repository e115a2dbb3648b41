"""stepstudio's command line: load a model, start the shared engine, serve the studio.

    python app.py                      # the built-in shapes model on http://127.0.0.1:7860
    python app.py --model toy          # a weightless test model (no checkpoint needed)
    python app.py --help

Exit status: 0 after SIGTERM or Ctrl-C (every in-flight request is answered first), 1 when
the engine thread crashed (every request got the error, then the server stopped), 2 for bad
options, a busy port or a model that can't be loaded.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import NoReturn

from pipelines.lora_files import LoraOption
from pipelines.memory_plan import MEMORY_CHOICES, token_limit
from studio.config import (
    MODES,
    StudioOptions,
    parse_api_key,
    parse_auth,
    read_admin_key_file,
    read_api_keys_file,
)

log = logging.getLogger("stepstudio")

MAX_LOG_MESSAGE_CHARS = 2000  # one log line per event, never a whole 88 KB prompt


def _short_records(make_record):
    """A log record factory that cuts every message to one line's worth: libraries that log a
    whole input (a tokenizer's "this part was truncated: ...") must not write 88 KB lines."""

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logging module's to report
            return record
        if len(message) > MAX_LOG_MESSAGE_CHARS:
            cut = len(message) - MAX_LOG_MESSAGE_CHARS
            record.msg, record.args = f"{message[:MAX_LOG_MESSAGE_CHARS]}... [{cut} more characters]", None
        return record

    return factory


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.setLogRecordFactory(_short_records(logging.getLogRecordFactory()))


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show defaults, except the unset ones (their help says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    defaults = StudioOptions()
    parser = argparse.ArgumentParser(
        prog="python app.py",
        description="A Gradio studio in front of one shared step engine that co-batches diffusion "
        "requests one denoise step at a time.",
        formatter_class=_HelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", action="append", default=None,
                       help="'builtin' (assets/shapes-flux), 'builtin-video' (assets/shapes-wan), 'builtin-v2' "
                            "(assets/shapes-flux-v2: every size from 48 to 128 px), 'builtin-video-v2' "
                            "(assets/shapes-wan-v2: 64x64 x 9 frames, 96x64 x 13), 'toy' (weightless "
                            "test model), a local diffusers folder, or a model hub id such as org/name; give it "
                            "several times to serve several models from one engine (the first is the default). "
                            "Default: the built-in image model and the built-in video model")
    model.add_argument("--device", default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    model.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                       help="weights dtype (default: bfloat16 on cuda, float32 on cpu)")
    model.add_argument("--memory", default=defaults.memory, choices=MEMORY_CHOICES,
                       help="how the model shares the GPU's memory: resident (all on the GPU), offload (text encoders "
                            "and VAE in host memory, moved for batched encodes and decodes), fp8 (offload, the "
                            "denoiser stored in float8), lowvram (fp8, its blocks moved in turn); auto: the fastest "
                            "that fits the free memory (default; on a CPU everything is in host memory already)")
    model.add_argument("--denoiser-file", default=None, metavar="FILE.gguf",
                       help="load the model's transformer (or UNet) from this quantized GGUF file instead of the "
                            "folder's own, e.g. a FLUX.1-dev Q4 file for a small card (pip install -e '.[gguf]')")
    model.add_argument("--compile", action="store_true",
                       help="torch.compile the transformer/UNet and warm it up at the model's default size "
                            "before serving (slower start, faster steps on GPU)")
    model.add_argument("--lora", action="append", default=None, metavar="[MODEL:]NAME=PATH",
                       help="serve the LoRA adapter file PATH as NAME, for the first model or the model named "
                            "MODEL (repeatable; requests name it in `loras` or as <lora:NAME:SCALE> in a prompt)")
    model.add_argument("--loras", default=defaults.lora_folder, metavar="DIR",
                       help="also serve every DIR/<model name>/<adapter name>.safetensors (the built-in adapters "
                            "in assets/loras are always served)")
    model.add_argument("--prompt-cache", type=int, default=defaults.prompt_cache, metavar="N",
                       help="prompt embeddings kept for reuse, e.g. the default negative prompt and re-rolled "
                            "prompts (0 = off; a FLUX.1 T5 embedding is about 4 MB)")
    model.add_argument("--step-cache", type=float, default=None, metavar="THRESHOLD",
                       help="step caching for requests that do not say: a step whose model output barely changes "
                            "reuses the last one for most of the model (0 = off; higher skips more steps, e.g. 0.1; "
                            "FLUX and Wan models). Default: each model's own (docs/engine.md#step-caching)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--mode", default=defaults.mode, choices=MODES,
                        help="'step': requests join a running batch at the next denoise step; "
                             "'request': a batch runs to the end before others start")
    engine.add_argument("--max-batch", "--max-batch-requests", dest="max_batch", type=int, default=defaults.max_batch,
                        help="most requests in one model forward (a request with true CFG puts 2 rows in it)")
    engine.add_argument("--max-tokens", type=int, default=defaults.max_tokens, metavar="N",
                        help="most rows x latent tokens in one model forward, so one large request and several "
                             "small ones share it (default: --max-batch requests of each model's default size, two rows each)")
    engine.add_argument("--preview-every", type=int, default=defaults.preview_every,
                        help="send a live preview every K denoise steps (0 = no previews)")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-steps", type=int, default=defaults.max_steps, help="largest allowed number of steps")
    limits.add_argument("--max-size", type=int, default=defaults.max_size,
                        help="largest allowed width or height in px (default: the model's own size, e.g. 64 for "
                             "the built-in model)")
    limits.add_argument("--max-per-session", type=int, default=defaults.max_per_session,
                        help="most requests one browser tab or client may have queued or running")
    limits.add_argument("--max-session-cost", type=float, default=defaults.max_session_cost, metavar="N",
                        help="most in-flight cost one tab or client may hold, in default requests of the model "
                             "(cost = rows x latent tokens x steps); one request alone is always taken")
    limits.add_argument("--max-branches", type=int, default=defaults.max_branches,
                        help="most engine requests one workflow run may make (its fan-outs multiplied)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default=defaults.host, help="interface to listen on (0.0.0.0 = every interface)")
    server.add_argument("--port", type=int, default=defaults.port, help="TCP port (0 = any free port)")
    server.add_argument("--share", action="store_true",
                        help="also open a public *.gradio.live link (downloads Gradio's tunnel client)")
    server.add_argument("--auth", default=None, metavar="USER:PASS",
                        help="require this login for the web UI and the Gradio API (PASS is also the HTTP API "
                             "key named USER)")
    server.add_argument("--api-key", action="append", default=None, metavar="NAME:KEY",
                        help="an HTTP API key of its own for caller NAME (repeat for more callers); with keys, "
                             "the HTTP API wants one and each key is its own session")
    server.add_argument("--api-keys-file", default=None, metavar="PATH",
                        help="a file of NAME:KEY lines, as --api-key (keeps keys out of the process list)")
    server.add_argument("--admin-key", default=None, metavar="KEY",
                        help="the operator's key for /v1/admin/pause and /v1/admin/resume (pause the whole "
                             "engine for maintenance: nothing new starts, running requests finish); without it "
                             "those routes answer 404")
    server.add_argument("--admin-key-file", default=None, metavar="PATH",
                        help="a file whose first line is the admin key, as --admin-key (keeps it out of the "
                             "process list)")
    server.add_argument("--start-paused", action="store_true",
                        help="start with the engine paused: requests queue, none starts until an operator "
                             "resumes it (POST /v1/admin/resume)")
    server.add_argument("--pause-expiry", type=float, default=defaults.pause_expiry_s or 0, metavar="SECONDS",
                        help="a caller's pause of its own queue ends by itself after SECONDS, and its queue runs "
                             "again (0 = only a resume ends it; default: %(default)g)")
    outputs = parser.add_argument_group("outputs")
    outputs.add_argument("--outputs", default=defaults.outputs, metavar="DIR",
                         help="save every finished image (PNG with its settings) and video (MP4) here; "
                              "the History tab lists them. Its studio.db keeps accepted work and video jobs "
                              "across restarts")
    outputs.add_argument("--no-save", action="store_true",
                         help="save nothing and keep accepted work in memory only (the History tab stays empty; "
                              "a restart loses what was queued)")
    outputs.add_argument("--resume-max-age", type=float, default=defaults.resume_max_age_s, metavar="S",
                         help="at start, run again accepted work from before a restart unless older than S "
                              "seconds (default: %(default)g)")
    server.add_argument("--show-prompts", action="store_true",
                        help="show every session's prompt in the queue view (default: only your own)")
    replicas = parser.add_argument_group("replicas (Ray Serve; pip install -e '.[serve]')")
    replicas.add_argument("--replicas", type=int, default=0, metavar="N",
                          help="serve N engine replicas on a local Ray cluster (one per GPU; on CPU each with "
                               "its own cores) behind the same studio (0 = one engine in this process, no Ray)")
    replicas.add_argument("--replica-threads", type=int, default=None, metavar="T",
                          help="CPU: torch threads of each replica, pinned to its own cores (default: the cores "
                               "shared out)")
    return parser


def default_models() -> tuple[str, ...]:
    """The built-in image model, and the built-in video model when it is there."""
    from pipelines.loader import BUILTIN_VIDEO_MODEL_DIR

    return ("builtin", "builtin-video") if (BUILTIN_VIDEO_MODEL_DIR / "model_index.json").is_file() else ("builtin",)


def config_from_args(args: argparse.Namespace) -> StudioOptions:
    models = tuple(args.model) if args.model else default_models()
    return StudioOptions(
        model=models[0], more_models=models[1:], mode=args.mode, max_batch=args.max_batch, max_tokens=args.max_tokens, host=args.host, port=args.port,
        share=args.share, auth=parse_auth(args.auth), preview_every=args.preview_every, max_steps=args.max_steps,
        max_size=args.max_size, max_per_session=args.max_per_session, max_branches=args.max_branches,
        show_prompts=args.show_prompts, max_session_cost=args.max_session_cost,
        outputs=None if args.no_save else args.outputs, resume_max_age_s=args.resume_max_age, device=args.device, dtype=args.dtype, memory=args.memory, denoiser_file=args.denoiser_file, compile=args.compile, prompt_cache=args.prompt_cache,
        step_cache=args.step_cache,
        loras=tuple(LoraOption.parse(text) for text in args.lora or []), lora_folder=args.loras,
        api_keys=tuple([parse_api_key(text) for text in args.api_key or []]
                       + (read_api_keys_file(args.api_keys_file) if args.api_keys_file else [])),
        admin_key=read_admin_key_file(args.admin_key_file) if args.admin_key_file else args.admin_key,
        start_paused=args.start_paused, pause_expiry_s=args.pause_expiry or None,
    )


def load_options(config: StudioOptions):
    """How the configured models load: device, dtype, compile, prompt cache, LoRA adapters, step caching."""
    from pipelines.loader import BUILTIN_LORA_DIR, LoadOptions

    return LoadOptions(device=config.device, dtype=config.dtype, compile_denoiser=config.compile,
                       prompt_cache_size=config.prompt_cache, loras=config.loras,
                       lora_folders=(str(BUILTIN_LORA_DIR), config.lora_folder), step_cache=config.step_cache,
                       memory=config.memory, batch_tokens=config.max_tokens, batch_requests=config.max_batch,
                       denoiser_file=config.denoiser_file)


def _check_builtin(model: str) -> None:
    from pipelines.loader import BUILTIN_MODELS

    folder = BUILTIN_MODELS.get(model)
    if folder is not None and not (folder / "model_index.json").is_file():
        raise ValueError(
            f"the built-in model {model!r} is not in {folder} (tools/train_builtin.py and tools/train_video.py "
            "make them). Run `python app.py --model toy` for the weightless test model, or pass --model FOLDER."
        )


def load_model(config: StudioOptions, model: str | None = None):
    """One of the configured models (default: the first) as a step pipeline, without adapters."""
    from pipelines.loader import load_pipeline, options_for_model

    model = model or config.model
    _check_builtin(model)
    return load_pipeline(model, options_for_model(load_options(config), first=model == config.model))


def load_models(config: StudioOptions) -> list:
    """Every configured model, in order (the first is the engine's default), with its adapters."""
    from pipelines.loader import attach_adapters, resolve_device_dtype

    options = load_options(config)
    device, _ = resolve_device_dtype(options)
    if device.type != "cuda" and config.memory not in ("auto", "resident"):
        raise ValueError(f"--memory {config.memory} is for a GPU's memory: on {device.type} every component is in "
                         "host memory already. Leave --memory out (auto keeps everything resident there).")
    pipelines = [load_model(config, model) for model in config.models]
    attach_adapters(pipelines, options)
    for pipeline in pipelines:
        choice = getattr(pipeline, "memory_choice", None)
        if choice is not None:
            log.info("%s: %s", pipeline.info.name, choice.describe())
    return pipelines


def open_share_link(host: str, port: int) -> str:
    """A public tunnel to the local server, the way `demo.launch(share=True)` makes one."""
    from gradio import networking

    local_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return networking.setup_tunnel(local_host, port, secrets.token_urlsafe(32), None, None)


def share_or_warn(host: str, port: int) -> str | None:
    """The public link, or None and a warning when it can't be made (no internet, say): the
    local server keeps serving either way."""
    try:
        link = open_share_link(host, port)
    except Exception as error:  # noqa: BLE001 - whatever the tunnel's failure, the studio stays up
        log.warning("no public link (%s: %s); still serving locally", type(error).__name__, error)
        return None
    log.info("public link: %s", link)
    return link


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))

    from studio.server.temp_files import use_private_cache_folder

    use_private_cache_folder()  # before gradio is imported (studio/server/temp_files.py says why)
    if args.replicas:
        return run_replicas(parser, args, config)

    from studio.server.sockets import bind_socket

    try:  # before Gradio's imports and the model: a busy port is an error now, not after minutes of loading
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        parser.error(f"can't listen on {config.host}:{config.port}: {exc.strerror or exc} "
                     "(is another server using it? pick another --port)")
    from studio.store.database import StoreError
    from studio.store.store import StudioStore

    try:  # before the model loads too: a database that can't be used is an error now
        store = StudioStore.open(Path(config.outputs).expanduser() if config.outputs else None)
    except StoreError as exc:
        sock.close()
        parser.error(str(exc))
    if store.path is None:
        log.info("saving is off (--no-save): accepted work is kept in memory only and is lost on restart")
    from studio.server.serving import StudioServer  # Gradio's imports: only for a port and a database that work

    try:
        pipelines = load_models(config)
    except ValueError as exc:
        sock.close()
        parser.error(str(exc))

    from engine import Engine
    from studio.app import build_app

    engine = Engine(pipelines, mode=config.mode, max_batch_requests=config.max_batch, limits=config.limits,
                    max_batch_tokens=token_limit(config.max_tokens, pipelines)).start()
    if config.compile:
        from engine import warm_up

        defaults = engine.info.defaults
        seconds = warm_up(engine, [(defaults.width, defaults.height)])
        log.info("compiled and warmed up at %dx%d in %.1f s", defaults.width, defaults.height, seconds[0])
    try:
        server = StudioServer(build_app(engine, config, store), config.host, sock=sock)
        log.info("models %s, %s mode, up to %d requests and %s tokens per forward, max size %d px, serving on %s",
                 ", ".join(engine.models.names), config.mode, config.max_batch,
                 "/".join(str(n) for n in engine.token_budgets.values()), engine.limits.max_size, server.url)
        if config.share:
            server.start()
            share_or_warn(config.host, server.port)
            server.wait()
        else:
            server.run()
    except KeyboardInterrupt:
        log.info("stopping: interrupted")
    finally:
        engine.close()
    if engine.failure is not None:
        log.critical("exiting with status 1: %s", engine.failure)
        return 1
    log.info("stopped")
    return 0


def run_replicas(parser: argparse.ArgumentParser, args: argparse.Namespace, config: StudioOptions) -> int:
    """--replicas N: the same studio over N engine replicas on a local Ray cluster (serve/local.py)."""
    if args.replicas < 0 or (args.replica_threads is not None and args.replica_threads < 1):
        parser.error("--replicas must be >= 0 and --replica-threads >= 1.")
    if config.share:
        parser.error("--share is not available with --replicas.")
    try:
        from serve.local import run_local, serve_settings_for
    except ImportError as exc:
        parser.error(f"--replicas needs Ray Serve ({exc}): pip install -e '.[serve]'")
    from studio.server.sockets import bind_socket

    try:  # a busy port is an error now, not after Ray and the replicas have started
        bind_socket(config.host, config.port).close()
    except OSError as exc:
        parser.error(f"can't listen on {config.host}:{config.port}: {exc.strerror or exc} (pick another --port)")
    return run_local(config, serve_settings_for(config, args.replicas, args.replica_threads))


def main_then_exit(argv: list[str] | None = None) -> NoReturn:
    """`python app.py`: run main(), then end the process with its exit status as soon as
    Python's own exit steps are done (non-daemon threads joined, every atexit handler run:
    Gradio's temp folder removed, Ray shut down).

    Only the interpreter's final teardown is skipped: it frees the objects of torch, Gradio
    and diffusers one by one (half a million of them, more the longer the studio served),
    which took 3-10 s on CPU after the studio had already stopped, and holds nothing of ours."""
    status = 1  # Python's own exit status when an exception escapes main()

    def end_now() -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe: nothing more to say
                stream.flush()
        os._exit(status)

    # atexit runs the last registered first: this runs after the handlers main()'s imports add.
    atexit.register(end_now)
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's errors (status 2)
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    sys.exit(status)


if __name__ == "__main__":
    main_then_exit()
