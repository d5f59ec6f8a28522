"""Domain errors shared by the commands; the lowest module, it imports nothing of ours.

Commands raise these; only :mod:`realtime.launch.cli` turns them into an exit status, so
no module has to import the command line to report a problem.
"""

from __future__ import annotations


class UsageError(Exception):
    """A problem the user can fix (a bad path, flag or file), reported as one line.

    The command line prints it after ``realtime: error:`` and exits with code 2.
    """
