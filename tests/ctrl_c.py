"""Children that a test interrupts with SIGINT (what Ctrl-C delivers) must not inherit an ignored SIGINT.

A shell without job control starts background jobs with SIGINT ignored, the disposition survives exec, and
Python then never installs its KeyboardInterrupt handler: started that way (`bash .ci/run &` from a script, as
some CI runners do), every test that interrupts a child saw it run on to the end and failed.
"""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """`preexec_fn` for subprocess.Popen: give the child SIGINT's default action back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
