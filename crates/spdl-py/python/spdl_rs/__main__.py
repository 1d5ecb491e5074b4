"""The ``python -m spdl_rs`` command line.

- ``python -m spdl_rs demo``: make a small image dataset (once, cached) and run the image loader on it,
  printing the per-stage statistics, images/s, CPU time and peak RSS; then, where video decoding works, a
  video clip loader over a few H.264 test videos. ``--json`` prints one JSON object instead. The demo itself is
  native (``spdl_rs._native.loader.run_demo``, the recipe of ``spdl demo``); this module parses the command line.
- ``python -m spdl_rs --version``: the package version and, where available, what the build contains.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import spdl_rs
import spdl_rs.io

from ._native import loader as _loader


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/spdl-rs/demo-py``, else ``~/.cache/spdl-rs/demo-py``."""
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "spdl-rs" / "demo-py"


def run_demo(*, dir: str | None, images: int, batch_size: int, threads: int | None, json_output: bool) -> int:
    """``python -m spdl_rs demo`` (made and run natively); returns the exit status."""
    root = Path(dir).expanduser() if dir is not None else default_dir()
    if not json_output:
        print(f"spdl_rs {spdl_rs.__version__}: demo in {root}", file=sys.stderr)
    try:
        figures = _loader.run_demo(
            root, images=images, batch_size=batch_size, threads=threads, json_output=json_output,
            has_video=spdl_rs.io.has_video(),
        )  # fmt: skip
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError, ValueError) as e:
        print(f"python -m spdl_rs demo: error: {e}", file=sys.stderr)
        return 1
    if json_output:
        head = {"mode": "demo", "version": spdl_rs.__version__, "build_info": spdl_rs.build_info()}
        print(json.dumps({**head, **figures}, indent=2, default=str))
    return 0


def _version_text() -> str:
    lines = [f"spdl_rs {spdl_rs.__version__}"]
    lines.extend(f"  {key}: {value}" for key, value in spdl_rs.build_info().items())
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """``--version``, with the text computed only when asked for (it imports the native module)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="print the version and build details, then exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        print(_version_text())
        parser.exit()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spdl_rs",
        description="spdl-rs: scalable data loading with the pipeline engine and the media decoders in Rust.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="make a small dataset (once, cached) and run the image loader (and the video loader) on it",
        description=(
            "Makes a small JPEG dataset once (cached), runs spdl_rs's image loader over it and prints the "
            "per-stage statistics (with the bottleneck), images/s, CPU seconds and peak RSS. Where video "
            "decoding works and the `ffmpeg` command is on PATH, it also makes a few short H.264 videos and "
            "runs a video clip loader over them."
        ),
    )
    demo.add_argument(
        "--dir",
        default=None,
        help="where the demo data lives (default: $XDG_CACHE_HOME/spdl-rs/demo-py, else ~/.cache/spdl-rs/demo-py)",
    )
    demo.add_argument("--images", type=_positive, default=500, help="number of images (default: 500)")
    demo.add_argument("--batch-size", type=_positive, default=32, help="images per batch (default: 32)")
    demo.add_argument("--threads", type=_positive, default=None, help="decoding threads (default: one per core)")
    demo.add_argument("--json", action="store_true", help="print one JSON object with the figures instead of tables")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return run_demo(
        dir=args.dir, images=args.images, batch_size=args.batch_size, threads=args.threads, json_output=args.json
    )


if __name__ == "__main__":
    sys.exit(main())
