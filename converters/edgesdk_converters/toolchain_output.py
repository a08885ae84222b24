"""Keep the converters' own chatter (MLIR passes, absl logs, their progress bars) off the terminal.

litert-torch, AI Edge Quantizer, NNCF and torch.onnx print from Python and from
C++ straight to file descriptors 1 and 2. :func:`captured` sends both to a
temporary file while a toolchain runs and, when it fails, replays the last lines
on stderr so the cause is never hidden.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from typing import Iterator, TextIO

TAIL_LINES = 40


@contextlib.contextmanager
def captured(enabled: bool = True) -> Iterator[TextIO]:
    """Capture fds 1 and 2; yield a stream to the real stderr for our own progress bars."""
    if not enabled:
        yield sys.stderr
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    root_level = logging.root.level
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.root.setLevel(logging.ERROR)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield console
        except BaseException:
            console.close()
            _restore(saved, root_level)
            sink.seek(0)
            tail = sink.read().decode("utf-8", "replace").splitlines()[-TAIL_LINES:]
            if tail:
                print("--- last lines of the converter's output ---", *tail, "---", sep="\n", file=sys.stderr)
            raise
        else:
            console.close()
            _restore(saved, root_level)


def _restore(saved: tuple[int, int], root_level: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in saved:
        os.close(fd)
    logging.root.setLevel(root_level)
