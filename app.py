"""stepstudio's command line: load a model, start the shared engine, serve the studio.

    python app.py                      # the built-in shapes model on http://127.0.0.1:7860
    python app.py --model toy          # a weightless test model (no checkpoint needed)
    python app.py --help
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys

from studio.config import MODES, StudioOptions, parse_auth

log = logging.getLogger("stepstudio")


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
    model.add_argument("--model", default=defaults.model,
                       help="'builtin' (assets/shapes-flux), 'toy' (weightless test model), a local diffusers "
                            "folder, or a model hub id such as org/name")
    model.add_argument("--device", default=None, help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    model.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                       help="weights dtype (default: bfloat16 on cuda, float32 on cpu)")
    model.add_argument("--compile", action="store_true",
                       help="torch.compile the transformer/UNet and warm it up at the model's default size "
                            "before serving (slower start, faster steps on GPU)")
    model.add_argument("--prompt-cache", type=int, default=defaults.prompt_cache, metavar="N",
                       help="prompt embeddings kept for reuse, e.g. the default negative prompt and re-rolled "
                            "prompts (0 = off; a FLUX.1 T5 embedding is about 4 MB)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--mode", default=defaults.mode, choices=MODES,
                        help="'step': requests join a running batch at the next denoise step; "
                             "'request': a batch runs to the end before others start")
    engine.add_argument("--max-batch", type=int, default=defaults.max_batch, help="most requests in one model forward")
    engine.add_argument("--preview-every", type=int, default=defaults.preview_every,
                        help="send a live preview every K denoise steps (0 = no previews)")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-steps", type=int, default=defaults.max_steps, help="largest allowed number of steps")
    limits.add_argument("--max-size", type=int, default=defaults.max_size, help="largest allowed width or height (px)")
    limits.add_argument("--max-per-session", type=int, default=defaults.max_per_session,
                        help="most requests one browser tab or client may have queued or running")
    limits.add_argument("--max-branches", type=int, default=defaults.max_branches,
                        help="most engine requests one workflow run may make (its fan-outs multiplied)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default=defaults.host, help="interface to listen on (0.0.0.0 = every interface)")
    server.add_argument("--port", type=int, default=defaults.port, help="TCP port (0 = any free port)")
    server.add_argument("--share", action="store_true",
                        help="also open a public *.gradio.live link (downloads Gradio's tunnel client)")
    server.add_argument("--auth", default=None, metavar="USER:PASS",
                        help="require this login for the web UI and the Gradio API")
    server.add_argument("--show-prompts", action="store_true",
                        help="show every session's prompt in the queue view (default: only your own)")
    return parser


def config_from_args(args: argparse.Namespace) -> StudioOptions:
    return StudioOptions(
        model=args.model, mode=args.mode, max_batch=args.max_batch, host=args.host, port=args.port,
        share=args.share, auth=parse_auth(args.auth), preview_every=args.preview_every, max_steps=args.max_steps,
        max_size=args.max_size, max_per_session=args.max_per_session, max_branches=args.max_branches,
        show_prompts=args.show_prompts,
        device=args.device, dtype=args.dtype, compile=args.compile, prompt_cache=args.prompt_cache,
    )


def load_model(config: StudioOptions):
    from pipelines.loader import BUILTIN_MODEL_DIR, LoadOptions, load_pipeline

    if config.model == "builtin" and not (BUILTIN_MODEL_DIR / "model_index.json").is_file():
        raise ValueError(
            f"the built-in model is not in {BUILTIN_MODEL_DIR} yet (tools/train_builtin.py makes it). "
            "Run `python app.py --model toy` for the weightless test model, or pass --model FOLDER."
        )
    return load_pipeline(
        config.model,
        LoadOptions(device=config.device, dtype=config.dtype, compile_denoiser=config.compile,
                    prompt_cache_size=config.prompt_cache),
    )


def open_share_link(host: str, port: int) -> str:
    """A public tunnel to the local server, the way `demo.launch(share=True)` makes one."""
    from gradio import networking

    local_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return networking.setup_tunnel(local_host, port, secrets.token_urlsafe(32), None, None)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        pipeline = load_model(config)
    except ValueError as exc:
        parser.error(str(exc))

    from engine import Engine
    from studio.server import StudioServer, build_app

    engine = Engine(pipeline, mode=config.mode, max_batch=config.max_batch, limits=config.limits).start()
    if config.compile:
        from engine.warmup import warm_up

        defaults = engine.info.defaults
        seconds = warm_up(engine, [(defaults.width, defaults.height)])
        log.info("compiled and warmed up at %dx%d in %.1f s", defaults.width, defaults.height, seconds[0])
    try:
        server = StudioServer(build_app(engine, config), config.host, config.port)
        log.info("model %s, %s mode, max batch %d, serving on %s",
                 engine.info.name, config.mode, config.max_batch, server.url)
        if config.share:
            server.start()
            log.info("public link: %s", open_share_link(config.host, server.port))
            server.wait()
        else:
            server.run()
    except KeyboardInterrupt:
        log.info("stopping: interrupted")
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
