"""How close the suite came to filling the disk the engine writes to, and during which test.

The integration suite builds two multi-GB images and several derived ones; a machine with less free disk than
the suite's peak fails in whichever build comes next ("the disk is full"), far from the cause. A thread samples
the free space of the Docker data root's file system every few seconds; the terminal summary names the least
seen and the test running then, so a CI log that ends in a disk-full failure says how much was missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

GB = 1e9
INTERVAL_S = 3


class DiskWatch:
    def __init__(self, docker: str):
        self.root = self._root(docker)
        self.current = "(collection)"
        self.start = self.least = self._free()
        self.least_during: str | None = None  # the test running at the lowest point
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diskwatch", daemon=True)
        self._thread.start()

    @staticmethod
    def _root(docker: str) -> str:
        try:
            root = subprocess.run([docker, "info", "-f", "{{.DockerRootDir}}"], capture_output=True, text=True,
                                  timeout=30, check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):  # no client or no engine: watch /, never fail a test run
            root = ""
        while root and not os.path.exists(root):  # not made yet: the file system it will be on
            root = os.path.dirname(root)
        return root or "/"

    def _free(self) -> float:
        return shutil.disk_usage(self.root).free / GB

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            free = self._free()
            if free < self.least:
                self.least, self.least_during = free, self.current

    def summary(self) -> str:
        self._stop.set()
        end = self._free()
        during = f"during {self.least_during}" if self.least_during else "never below the start"
        return (f"disk ({self.root}): {self.start:.1f} GB free at the start, least {self.least:.1f} GB "
                f"({during}), {end:.1f} GB at the end; peak use "
                f"{self.start - self.least:.1f} GB")


_watch: DiskWatch | None = None


def start(docker: str) -> None:
    global _watch
    if _watch is None:
        _watch = DiskWatch(docker)


def running(nodeid: str) -> None:
    if _watch is not None:
        _watch.current = nodeid


def summary() -> str | None:
    return _watch.summary() if _watch is not None else None
