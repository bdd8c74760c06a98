"""LoadMeter against a real busy process: another process spinning on a core shows as ~1 core of load."""

from __future__ import annotations

import subprocess
import sys
import time

from mini_gpt.machine import LoadMeter


def test_load_meter_sees_another_busy_process() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        with LoadMeter(min_seconds=1.0) as load:
            pass
    finally:
        spinner.kill()
        spinner.wait()
    assert load.wall >= 1.0
    assert load.other_load is not None and load.other_load >= 0.7  # the spinner alone is ~1 core
