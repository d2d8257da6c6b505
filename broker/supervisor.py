"""Run a few processes as one: start them, show their output, stop them all together.

Used by `manage.py runbroker`. Each process gets its own session, so a Ctrl-C in the terminal
reaches only the supervisor, which then asks every process to stop with SIGTERM (the graceful
shutdown each of them implements) and kills what is left of their process groups after the
allowed time. When a process ends by itself, the others are stopped the same way and the run
fails. (A supervisor killed with SIGKILL cannot stop anything: its processes go on.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

POLL_SECONDS = 0.5  # how often the supervisor looks for a process that ended


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None


@dataclass
class Supervisor:
    commands: list[tuple[str, list[str]]]
    write_line: Callable[[str], object]  # shows one line of output, without its newline
    stop_seconds: float
    reason: str = ""
    children: list[Child] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _write_lock: threading.Lock = field(default_factory=threading.Lock)

    def request_stop(self) -> None:
        """Safe from a signal handler: the run loop does the stopping."""
        self._stop.set()

    def run(self) -> int:
        """Start every process and wait; 0 after a requested stop, 1 when a process ended."""
        try:
            for name, argv in self.commands:
                self._start(Child(name, argv))
            ended = self._wait_for_stop_or_exit()
        finally:
            self._stop_all()
        if ended is None or ended.process is None:
            return 0
        self.reason = f"{ended.name} exited with code {ended.process.returncode}"
        self._say(f"{self.reason}; stopped the others")
        return 1

    def _start(self, child: Child) -> None:
        process = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            child.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # lines as they are written
        )
        child.process = process
        child.reader = threading.Thread(
            target=self._copy_lines, args=(child.name, process.stdout), daemon=True
        )
        child.reader.start()
        self.children.append(child)
        self._say(f"started {child.name} (pid {process.pid})")

    def _wait_for_stop_or_exit(self) -> Child | None:
        while not self._stop.wait(POLL_SECONDS):
            for child in self.children:
                if child.process and child.process.poll() is not None:
                    return child
        return None

    def _stop_all(self) -> None:
        """SIGTERM to each process, which stops its own workers gracefully; then, after the
        allowed time or once it has ended, SIGKILL to anything left in its process group, so
        no worker outlives the run."""
        processes = [child.process for child in self.children if child.process]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_seconds
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its group: its pid (own session)
            process.wait()
        for child in self.children:
            if child.reader:
                child.reader.join(timeout=5)
            if child.process:
                self._say(f"{child.name} stopped (exit code {child.process.returncode})")

    def _copy_lines(self, name: str, stream: IO[str] | None) -> None:
        for line in stream or ():
            self._say(line.rstrip("\n"), name)

    def _say(self, text: str, name: str = "runbroker") -> None:
        with self._write_lock:
            self.write_line(f"{name:<12} | {text}")
