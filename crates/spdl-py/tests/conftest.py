import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest


# A suite started from a background job inherits SIGINT ignored, and so would every child it starts: the Ctrl-C
# tests need the default behaviour (KeyboardInterrupt), as in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def os_threads() -> int:
    """Threads of this process, Rust ones included (Linux)."""
    return len(os.listdir("/proc/self/task"))


def wait_for(cond, timeout: float = 30.0, what: str = "condition") -> None:
    """Polls ``cond`` until it is true; generous on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def run_child(code: str, *, timeout: float = 60, address_space: int | None = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter; fails the test if it does not end within ``timeout``."""

    def limit() -> None:
        if address_space is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child process hung (killed after {timeout} s); output so far: {e.stdout!r} {e.stderr!r}")


@pytest.fixture
def watchdog(request):
    """Fails a test that hangs instead of hanging the suite: after 120 s it prints the test's name and every
    thread's stack past pytest's output capture (where the log shows them) and exits; a C-level dump follows
    at 150 s should no Python thread be able to run."""
    import contextlib
    import faulthandler

    capman = request.config.pluginmanager.getplugin("capturemanager")
    done = threading.Event()

    def fire() -> None:
        if done.wait(120):
            return
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            sys.stderr.write(f"\nwatchdog: {request.node.nodeid} still runs after 120 s; its threads:\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        os._exit(70)

    faulthandler.dump_traceback_later(150, exit=True)
    timer = threading.Thread(target=fire, name="test-watchdog", daemon=True)
    timer.start()
    yield
    done.set()
    timer.join()
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _no_leaked_python_threads():
    before = {t.ident for t in threading.enumerate()}
    yield
    wait_for(
        lambda: {t.ident for t in threading.enumerate() if t.name.startswith("spdl_rs")} - before == set(),
        what="the pipeline's Python threads to end",
    )


#: The suite runs where FFmpeg's libraries are hidden (`cargo xtask test` runs it a second time so, against
#: the installed wheel, in a mount namespace): every video call must raise the clear "FFmpeg is not
#: available" error, and everything else must pass. A test that meets exactly that error passes as expected
#: (see ``pytest_runtest_makereport``); any other failure still fails.
NO_FFMPEG = os.environ.get("SPDL_RS_TEST_NO_FFMPEG") == "1"

#: What the clear error names: FFmpeg, the libraries and majors looked for, what was found, how to install.
FFMPEG_ERROR_PARTS = ("FFmpeg is not available", "Looked for libavutil.so.", "found on this machine:", "apt-get install")


#: How the clear error starts (a test may show only the start of it: a child's summary, a truncated repr).
FFMPEG_ERROR_START = "FFmpeg is not available: "


def is_clear_ffmpeg_error(text: str) -> bool:
    return FFMPEG_ERROR_START in text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if NO_FFMPEG and report.failed and call.excinfo is not None:
        text = "".join(str(e) for e in _exception_chain(call.excinfo.value))
        if is_clear_ffmpeg_error(text):
            if call.when == "setup":
                # A fixture met it: the test cannot run (a setup report marked passed would run the test
                # without its fixture), so it is reported as skipped for that reason.
                report.outcome = "skipped"
                report.longrepr = (str(item.path), 0, f"Skipped: a fixture met the clear error ({FFMPEG_ERROR_START})")
            else:
                report.outcome = "passed"
                report.longrepr = None
            item.config.stash.setdefault(_MET_FFMPEG_ERROR, []).append(item.nodeid)
    return report


def _exception_chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


_MET_FFMPEG_ERROR = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    met = config.stash.get(_MET_FFMPEG_ERROR, [])
    if NO_FFMPEG:
        terminalreporter.write_line(f"without FFmpeg: {len(met)} tests met the clear 'FFmpeg is not available' error")


def pytest_sessionstart(session):
    # `cargo xtask test` runs the suite against the installed wheel: make sure that is what is imported.
    if os.environ.get("SPDL_RS_TEST_INSTALLED") == "1":
        import spdl_rs

        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if os.path.abspath(spdl_rs.__file__).startswith(here):
            raise pytest.UsageError(f"spdl_rs is imported from the source tree ({spdl_rs.__file__}), not the wheel")


EXPECT_NO_GIL = os.environ.get("SPDL_RS_EXPECT_NO_GIL") == "1"
FREE_THREADED_BUILD = bool(getattr(sys, "_is_gil_enabled", None)) and not sys._is_gil_enabled()


def _ffmpeg(*args: str) -> None:
    import subprocess

    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *args], check=True, timeout=300)


@pytest.fixture(scope="session")
def media(tmp_path_factory):
    """Real media made with the ``ffmpeg`` CLI, once per session: a 440 Hz sine (amplitude 1/8, the lavfi
    default) at 16 kHz, stereo, 2 s, as WAV, FLAC and MP3; a 1 s WAV; a long (120 s, 48 kHz stereo) FLAC; and a
    4 s 160x120 25 fps H.264 MP4 (``testsrc``, a keyframe every second)."""
    import shutil

    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg CLI is needed to make the test media (`cargo xtask test` installs it)")
    d = tmp_path_factory.mktemp("media")
    stereo = "pan=stereo|c0=c0|c1=c0"  # both channels the same sine, at full amplitude (`-ac 2` lowers it)
    sine = ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=16000:duration=2,{stereo}"]
    files = {
        "wav": d / "sine.wav",
        "flac": d / "sine.flac",
        "mp3": d / "sine.mp3",
        "short_wav": d / "short.wav",
        "long_flac": d / "long.flac",
        "mp4": d / "testsrc.mp4",
    }
    _ffmpeg(*sine, "-c:a", "pcm_s16le", str(files["wav"]))
    _ffmpeg(*sine, "-c:a", "flac", str(files["flac"]))
    _ffmpeg(*sine, "-c:a", "libmp3lame", "-b:a", "128k", str(files["mp3"]))
    _ffmpeg("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=16000:duration=1,{stereo}",
            str(files["short_wav"]))
    _ffmpeg("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=48000:duration=120,{stereo}",
            "-c:a", "flac", str(files["long_flac"]))
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=160x120:rate=25:duration=4", "-c:v", "libx264",
            "-pix_fmt", "yuv420p", "-g", "25", str(files["mp4"]))
    return {k: str(v) for k, v in files.items()}


class HostileServer:
    """A raw HTTP/1.1 server on 127.0.0.1; the path after the last ``/`` picks the behaviour."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/data"

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(10)
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            name = head.split(b" ")[1].rsplit(b"/", 1)[-1]
            if name == b"drip":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                while not self.stop.is_set():
                    conn.sendall(b"x")
                    time.sleep(0.1)
            elif name == b"endless":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                frame = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
                while not self.stop.is_set():
                    conn.sendall(frame)
            elif name == b"stall":
                self.stop.wait(30)
            else:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()
